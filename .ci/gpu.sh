#!/usr/bin/env bash
# The GPU issue's device check as ONE call on a fresh H100 or H200 (torch 2.11 there; no datasets, wandb, gguf,
# lm-eval; no network; at most 8 files come back): every step under its own `timeout`, the most valuable first,
# each given at most what is left of DEADLINE seconds; every step appends to its log as it goes, so a stalled step
# still returns the rest. Usage: OUT=out/gpu bash .ci/gpu.sh. DRY=1 runs the same steps on the CPU at toy shapes
# (tests/test_bench.py runs it), so a lent GPU's minutes are not spent finding a typo.
#   1. per-block compile: first-step seconds, compiled step of loop and DiscoLoop at the 440M shape (ms, MFU, peak
#      against plan)                                            -> step.log
#   2. bench.py phi: every top-k Phi kernel against the decode matmul at the 440M shape  -> phi.log, phi.json
#   3. PonderLM (compiled), then eager loop and DiscoLoop       -> step.log
#   4. the symbolic main job: seconds to test_id >= 0.99 and test_ood >= 0.95, eager, compiled, compiled with
#      CUDA graphs (compile_mode=reduce-overhead)                  -> symbolic.log
#   5. tests/test_cuda.py                                       -> test_cuda.log
# Files back: summary.txt, device.txt, step.log, phi.log, phi.json, symbolic.log, test_cuda.log (7).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}; DEADLINE=${DEADLINE:-415}; DRY=${DRY:-0}
bad() { echo "error: $1" >&2; exit 2; }
[[ "$DRY" =~ ^[01]$ ]] || bad "DRY=$DRY is invalid: allowed 0 (the GPU) or 1 (the CPU at toy shapes)"
[[ "$DEADLINE" =~ ^[1-9][0-9]{0,4}$ ]] || bad "DEADLINE=$DEADLINE is invalid: allowed a whole number of seconds, 1 to 99999"
mkdir -p "$OUT" 2> /dev/null || bad "OUT=$OUT cannot be made (a file in its way?): choose a folder"
[ -z "$(ls -A "$OUT")" ] || bad "OUT=$OUT is not empty: the logs append, so choose a new folder"
export PYTHONUNBUFFERED=1
START=$(date +%s)
if [ "$DRY" = 1 ]; then  # the same commands at toy shapes on the CPU
  STEP="config/pretrain_tiny.py --vocab_size=257 --n_layer=2 --n_embd=32 --n_head=2 --block_size=32 --device=cpu --dtype=float32 --steps=1"
  PONDER="$STEP"; PHI="config/pretrain_tiny.py --vocab_size=257 --rows=64 --n_embd=32 --device=cpu --iters=1 --warmup=0"
  SYM="--device=cpu --n_embd=32 --n_head=2 --batch_size=64 --max_iters=4 --eval_interval=2 --threads=1 ${SYMBOLIC_ARGS:-}"
  PYTEST_ARGS="-q -x"
else
  STEP="config/pretrain.py --steps=5"; PONDER="config/pretrain_ponder.py --steps=5"
  PHI="config/pretrain.py --iters=5 --warmup=1 --compile=True"
  SYM="--device=cuda"; PYTEST_ARGS="-q -x -n 3"
fi

left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
# step NAME LIMIT LOG CMD...: run CMD under min(LIMIT, time left), appending to LOG; one summary line with its exit
step() {
  local name=$1 limit=$2 log=$OUT/$3; shift 3
  local t; t=$(left); [ "$t" -lt "$limit" ] && limit=$t
  if [ "$limit" -le 5 ]; then echo "$name: skipped, out of time" >> "$OUT/summary.txt"; return; fi
  echo "== $(date -u +%T) $name: $*" >> "$log"
  local t0; t0=$(date +%s)
  timeout -s TERM -k 5 "$limit" "$@" >> "$log" 2>&1
  echo "$name: exit $? in $(( $(date +%s) - t0 )) s (limit $limit s; 124 = timed out)" >> "$OUT/summary.txt"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name())"
} > "$OUT/device.txt" 2>&1
step "1 compiled step, loop + DiscoLoop" 120 step.log python bench.py step $STEP --compile=True --variants=loop,disco
step "2 bench.py phi, every kernel" 55 phi.log python bench.py phi $PHI --json="$OUT/phi.json"
step "3a compiled step, PonderLM" 45 step.log python bench.py step $PONDER --compile=True --variants=ponder
step "3b eager step, loop + DiscoLoop" 60 step.log python bench.py step $STEP --compile=False --variants=loop,disco
for c in False True reduce-overhead; do  # eager, per block, per block with CUDA graphs (a launch-bound job)
  run=$OUT/symbolic_run_$c; rm -rf "$run"; mode=default; [ $c = reduce-overhead ] && mode=$c
  step "4 symbolic compile=${c/reduce-overhead/True --compile_mode=reduce-overhead}" 40 symbolic.log \
    python train.py config/symbolic.py --out_dir="$run" --compile=$([ $c = False ] && echo False || echo True) \
    --compile_mode=$mode $SYM
  python .ci/first_reached.py "$run/metrics.jsonl" "acc/test_id>=0.99" "acc/test_ood>=0.95" >> "$OUT/summary.txt" 2>&1
  rm -rf "$run"  # checkpoints do not come back (8 files at most)
done
step "5 tests/test_cuda.py" 110 test_cuda.log python -m pytest $PYTEST_ARGS tests/test_cuda.py
echo "total $(( $(date +%s) - START )) s of DEADLINE=$DEADLINE" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
