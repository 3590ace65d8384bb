#!/usr/bin/env bash
# The GPU issue's compile target on the CPU: train.py config/pretrain_tiny.py --compile=True reaches its second step
# (the iteration-2 row's time) at 24 layers x K=4 within 2x the time of 2 layers x K=2, each with a fresh Inductor
# cache (what a new machine pays), twice in turn. Usage: bash .ci/compile_target.sh
cd "$(dirname "$0")/.."
for LK in "2 2" "24 4" "2 2" "24 4"; do set -- $LK
  export TORCHINDUCTOR_CACHE_DIR=$(mktemp -d); out=$(mktemp -d)/run
  python train.py config/pretrain_tiny.py --compile=True --n_layer=$1 --n_loop=$2 --max_iters=2 --eval_interval=1000 \
    --eval_iters=1 --out_dir="$out" --dtype=float32 > /dev/null 2>&1 || { echo "n_layer=$1 K=$2: train.py failed"; continue; }
  python .ci/first_reached.py "$out/metrics.jsonl" "iter>=2" | sed "s#^#n_layer=$1 K=$2: #"
done
