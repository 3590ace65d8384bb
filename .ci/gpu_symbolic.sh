#!/usr/bin/env bash
# The paper-size symbolic vanilla loop on one lent GPU (config/symbolic_anchor.py: 4 GPT-2 blocks at d = 768, K = 2,
# lr 1e-4, wd 0.1, dropout 0.1, batch 512), trained for at most TRAIN_S seconds (SIGTERM saves; the run resumes
# with --init_from=resume), then Table 1(a), 1(b) and Fig. 2 on every kept checkpoint (every 500 epochs) and the
# last. Everything lands in $OUT. Usage: OUT=out/gpu_symbolic TRAIN_S=1200 bash .ci/gpu_symbolic.sh
# Arguments go to train.py, and DEVICE (default cuda) to it and the probes: tests/test_probe.py dry-runs the whole
# script on the CPU with a tiny model, so a lent GPU's minutes are not spent finding a typo.
set -uo pipefail
OUT=${OUT:-out/gpu_symbolic}; TRAIN_S=${TRAIN_S:-1200}; DEVICE=${DEVICE:-cuda}; RUN=$OUT/run; mkdir -p "$OUT"
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" > "$OUT/device.txt" 2>&1
echo "== $(date -u) train.py config/symbolic_anchor.py --device=$DEVICE $*" | tee -a "$OUT/summary.txt" >> "$OUT/train.log"
timeout -s TERM "$TRAIN_S" python train.py config/symbolic_anchor.py --out_dir="$RUN" --device="$DEVICE" "$@" >> "$OUT/train.log" 2>&1
t=$?; rc=0; [ $t -eq 0 ] || [ $t -eq 124 ] || rc=1
echo "train exit $t (124: stopped at TRAIN_S, checkpoint saved)" >> "$OUT/summary.txt"
for ck in "$RUN"/ckpt_*.pt "$RUN"/ckpt.pt; do
  [ -f "$ck" ] || continue; name=$(basename "$ck" .pt)
  python probe.py acc --ckpt="$ck" --n_loop=1,2,3 --device="$DEVICE" > "$OUT/$name.acc.md" 2>&1; a=$?
  python probe.py lens --ckpt="$ck" --device="$DEVICE" > "$OUT/$name.lens.md" 2>&1; l=$?
  python probe.py sweep --ckpt="$ck" --norm=rms --device="$DEVICE" --png="$OUT/$name.sweep.png" > "$OUT/$name.sweep.md" 2>&1; s=$?
  echo "probed $name: acc/lens/sweep exits $a/$l/$s" >> "$OUT/summary.txt"; [ $a$l$s = 000 ] || rc=1
done
cp "$RUN/metrics.jsonl" "$RUN/config.json" "$OUT/" 2>/dev/null
cat "$OUT/summary.txt"
exit $rc
