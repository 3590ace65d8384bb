#!/usr/bin/env bash
# The GPU measurement of the GPU issue, as one script for a bare machine with one H100 (torch, tiktoken,
# transformers and safetensors installed; no network): carry wheels for the rest in ./wheels
# (`pip download --no-deps -d wheels tqdm pytest pluggy iniconfig packaging`). Everything lands in $OUT.
set -uo pipefail
OUT=${OUT:-out/gpu}; mkdir -p "$OUT"
[ -d wheels ] && pip install --no-index --no-deps wheels/*.whl > "$OUT/pip.log" 2>&1
{ nvidia-smi; python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"; } > "$OUT/device.txt" 2>&1
python -m pytest -q tests/test_cuda.py > "$OUT/test_cuda.log" 2>&1; echo "test_cuda exit $?" >> "$OUT/summary.txt"
for B in 1 2; do
  python bench.py step config/pretrain.py --batch_size=$B --variants=loop,disco --steps=10 \
    > "$OUT/step_disco_b$B.log" 2>&1; echo "step disco b$B exit $?" >> "$OUT/summary.txt"
  python bench.py step config/pretrain_ponder.py --batch_size=$B --variants=ponder --steps=10 \
    > "$OUT/step_ponder_b$B.log" 2>&1; echo "step ponder b$B exit $?" >> "$OUT/summary.txt"
done
python bench.py breaks config/pretrain.py --device=cuda --activation_checkpointing=block > "$OUT/breaks.log" 2>&1
echo "breaks exit $?" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
