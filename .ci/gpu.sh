#!/usr/bin/env bash
# The device check: ONE unattended call on a lent H100 or H200 (torch 2.11 there; no datasets, wandb, gguf, lm-eval;
# no network; at most 8 files come back). Every step runs under its own `timeout`, given min(its limit, what is left of
# DEADLINE), the most valuable first; every step writes each row the moment it is measured, so a step cut by its
# limit keeps what it finished, and the summary says "out of time" for it (never "compile failed").
# Usage: OUT=out/gpu bash .ci/gpu.sh    (exit 0: every step ran and exited 0; 1: some did not, the summary says which)
# DRY=1 runs the same steps and configs on the CPU at toy sizes, under its own limits (tests/test_bench.py runs it).
# The order is the value of each figure (issue 61): the fused Phi against its matmul, the compiled loop and DiscoLoop
# under the checkpointing policy 'auto' picks (MFU, DiscoLoop / loop, peak vs plan), the main job as one CUDA graph,
# the GPU tests, then the comparisons. GPU limits sum past DEADLINE on purpose: a step that runs out of time keeps its
# rows, and later steps are skipped with a line. DRY=1 gives every step all the time it needs (a busy CPU must not
# fail a correct tree): its test asserts that each step ran its code path, not how fast.
#   0. versions, GPU, CPU count; missing modules are one line    -> device.txt
#      (the memory plans, device-independent, start in the background, once per config: plan_*.json, not returned)
#   1. lab/phi.py --compile=True: every Phi kernel, fused first   -> phi.log, phi.jsonl
#   2. the symbolic job, the whole step one CUDA graph, to 0.99 / 0.95 -> symbolic.log
#   3. compiled step at 440M, loop + DiscoLoop, policy 'auto'     -> step.log, step.jsonl (a row per variant)
#   4. tests/test_cuda.py (the GPU paths: CUDA graph, policies)  -> test_cuda.log
#   5. compiled step, loop + DiscoLoop, policy 'block' (the old default)   -> step.jsonl
#      (the compiled step with phi_kernel='fused' is gone: fused is a lab/ candidate, timed by step 1 alone)
#   6. lab/sdpa.py: the default attention backend (cuDNN read first) and each one's time -> step.jsonl
#   7. .ci/job_ab.py: a0d70e6's symbolic step, this tree's, and the CUDA graph's, side by side (OLD: JOB_AB_OLD,
#      default out/a0d70e6.tar.gz, carried; skipped with a line when absent)                -> symbolic.log
#   8. the symbolic job, eager; 9. compiled PonderLM; 10. eager loop + DiscoLoop
#  11. batch-1 decoding (issue 67): bench.py sample, plain cached greedy against pipelined self-speculation (propose
#      at loop 1) on a small trained checkpoint (DECODE_CKPT, default out/small_disco_ll03, carried; skipped with a
#      line when absent; DRY=1 without it: the same command on random toy weights)              -> step.log
#  12. the export in vLLM, 440M random weights, CUDA graphs off and on (skipped without vLLM)    -> step.log, step.jsonl
# Files back (8): summary.txt device.txt test_cuda.log step.log step.jsonl phi.log phi.jsonl symbolic.log
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}; DRY=${DRY-0}  # unset: 0; set but empty: invalid
bad() { echo "error: $1" >&2; exit 2; }
[[ "$DRY" =~ ^[01]$ ]] || bad "DRY=$DRY is invalid: allowed 0 (the GPU) or 1 (the CPU at toy sizes)"
if [ "$DRY" = 1 ]; then DEADLINE=${DEADLINE:-3600}; else DEADLINE=${DEADLINE:-375}; fi
[[ "$DEADLINE" =~ ^[1-9][0-9]{0,4}$ ]] || bad "DEADLINE=$DEADLINE is invalid: allowed a whole number of seconds, 1 to 99999"
mkdir -p "$OUT" 2> /dev/null || bad "OUT=$OUT cannot be made (a file in its way?): choose a folder"
[ -z "$(ls -A "$OUT")" ] || bad "OUT=$OUT is not empty: the logs append, so choose a new folder"
missing=$(python -c "import importlib.util as u; print(' '.join(m for m in ('torch', 'numpy', 'tqdm', 'pytest', 'xdist', 'tiktoken') if not u.find_spec(m)))" 2>&1)
[ -z "$missing" ] || bad "missing Python modules: $missing (this check needs torch, numpy, tqdm, pytest, pytest-xdist, tiktoken)"
[ "$DRY" = 1 ] || python -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2> /dev/null \
  || bad "DRY=0 needs a CUDA device and this machine has none: DRY=1 runs the same steps on the CPU"
export PYTHONUNBUFFERED=1
START=$(date +%s); WORK=$(mktemp -d); KIDS=""
# a SIGTERM or Ctrl-C to this script stops the running step and the background plans (their own handlers keep
# every row they measured), then removes the scratch folder: nothing is left running
cleanup() { [ -n "$KIDS" ] && kill -TERM $KIDS 2> /dev/null; wait 2> /dev/null; rm -rf "$WORK"; }
trap 'cleanup' EXIT
trap 'echo "gpu.sh: stopped by a signal" >> "$OUT/summary.txt"; exit 143' TERM INT
if [ "$DRY" = 1 ]; then  # the real configs and commands, at toy sizes, on the CPU; no step is cut for time
  TOY="--n_layer=2 --n_embd=32 --n_head=2 --n_hidden=64 --block_size=32 --batch_size=2 --vocab_size=257 --phi_chunk=16 --loss_chunk=16 --device=cpu --dtype=float32 --threads=1"
  STEP="$TOY --steps=1 --warmup=0"; PHI="$TOY --iters=1 --warmup=0"; SDPA="$TOY --iters=1 --warmup=0"
  SYM="--device=cpu --n_embd=32 --n_head=2 --batch_size=64 --max_iters=4 --eval_interval=2 --threads=1 ${SYMBOLIC_ARGS:-}"
  PYTEST_ARGS="-q -x"; AB="--dry"
  export TRITON_INTERPRET=1  # the fused kernel's own code, in Triton's interpreter
  L_PHI=900 L_AUTO=900 L_GRAPH=900 L_TEST=900 L_BLOCK=900 L_SDPA=900 L_AB=900 L_SYM=900 L_PONDER=900 L_EAGER=900
  DECODE_ARGS="--new_tokens=8 --prompt=4 --device=cpu --threads=1"; DECODE_TOY="--n_embd=32 --n_head=2 --vocab_size=257"
  L_DECODE=900
else
  STEP="--steps=3 --warmup=1"; PHI="--iters=3 --warmup=1"; SDPA="--iters=5 --warmup=1"; SYM="--device=cuda"
  PYTEST_ARGS="-q -x -n 3"; AB=""
  # measured on an H200 (RESULTS.md, "The device check's budget"): test_cuda 100 s alone; a compiled variant 49-61 s
  # cold (two in one process: the second reuses the first's kernels); lab/phi.py 40; lab/sdpa.py 13; symbolic 63 eager
  L_PHI=50 L_AUTO=110 L_GRAPH=45 L_TEST=100 L_BLOCK=90 L_SDPA=20 L_AB=150 L_SYM=70 L_PONDER=70 L_EAGER=60
  DECODE_ARGS="--new_tokens=200 --prompt=16 --device=cuda"; DECODE_TOY=""
  L_DECODE=45  # not measured on a device yet: 3 layers, d=128, 200 tokens a few seconds per row; start-up ~10 s
fi

left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
# step NAME LIMIT LOG CMD...: run CMD under min(LIMIT, time left), appending to LOG; one summary line with its exit
FAILED=0
step() {
  local name=$1 limit=$2 log=$OUT/$3; shift 3
  local t; t=$(left); [ "$t" -lt "$limit" ] && limit=$t
  if [ "$limit" -le 5 ]; then echo "$name: skipped, out of time" >> "$OUT/summary.txt"; FAILED=1; return; fi
  echo "== $(date -u +%T) $name: $*" >> "$log"
  local t0 rc what; t0=$(date +%s)
  timeout -s TERM -k 5 "$limit" "$@" >> "$log" 2>&1 &
  local pid=$!; KIDS="$KIDS_BG $pid"; wait $pid; rc=$?; KIDS=$KIDS_BG
  case $rc in 0) what="ok";; 124|137) what="out of time (its limit was reached; rows measured before it are kept)";;
              *) what="failed";; esac
  [ $rc = 0 ] || FAILED=1
  echo "$name: exit $rc in $(( $(date +%s) - t0 )) s (limit $limit s): $what" >> "$OUT/summary.txt"
}
# a fresh Inductor cache per compiled variant: each one's first step is a cold compile (a shared cache would hand
# DiscoLoop the loop's kernels); the dry run shares one: it proves the commands, not cold-compile times
cold() { local d=$WORK/inductor; [ "$DRY" = 1 ] || d=$(mktemp -d -p "$WORK"); echo "env TORCHINDUCTOR_CACHE_DIR=$d TRITON_CACHE_DIR=$d/triton"; }

{ echo "date $(date -u +%FT%TZ), DRY=$DRY, DEADLINE=$DEADLINE s, CPUs $(getconf _NPROCESSORS_ONLN)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -3
  python - <<'EOF'
import platform, torch
try:
    import triton; tv = triton.__version__
except ImportError:
    tv = "none"
print(f"python {platform.python_version()}, torch {torch.__version__}, cuda {torch.version.cuda}, triton {tv}, "
      f"cudnn {torch.backends.cudnn.version()}, device {torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}")
EOF
} > "$OUT/device.txt" 2>&1
# the memory plans: fake tensors on the CPU, the same on any device; made once per config while the GPU tests run,
# on 2 threads each (16 threads each starved test_cuda's compiles on the H200)
PLAN=$WORK/plan_pretrain.json; PLAN_P=$WORK/plan_ponder.json; T=$([ "$DRY" = 1 ] && echo "$TOY")
# one writer per cache: the policies 'auto' plans (until one fits this GPU), then 'block''s, in one background job
( for ac in auto block; do python bench.py step config/pretrain.py $T --variants=loop,disco --steps=0 --threads=2 \
    --activation_checkpointing=$ac --plan_cache="$PLAN"; done ) > "$WORK/plan.log" 2>&1 &
PLAN_PID=$!; KIDS_BG=$PLAN_PID
python bench.py step config/pretrain_ponder.py $T --variants=ponder --steps=0 --threads=2 --plan_cache="$PLAN_P" > "$WORK/plan_p.log" 2>&1 &
KIDS_BG="$KIDS_BG $!"; KIDS=$KIDS_BG

step "1 lab/phi.py --compile=True, every kernel" $L_PHI phi.log \
  $(cold) python lab/phi.py config/pretrain.py $PHI --compile=True --json="$OUT/phi.jsonl"
compiled() {  # compiled NAME LIMIT ARGS...: a compiled 440M step, its rows into step.jsonl
  local name=$1 limit=$2; shift 2
  step "$name" "$limit" step.log $(cold) python bench.py step config/pretrain.py $STEP --compile=True --plan_cache="$PLAN" \
    --json="$OUT/step.jsonl" "$@"
}
# the symbolic job (its dataset made in the scratch folder: the checkout stays as it was): a watcher stops it once test_id >= 0.99 and test_ood >= 0.95 (train.py's own rule is unchanged)
symbolic() {  # symbolic NAME LIMIT TAG ARGS...
  local name=$1 limit=$2 run=$WORK/symbolic_$3 n; shift 3; n=$(cat "$OUT/symbolic.log" 2> /dev/null | wc -l)
  step "$name" "$limit" symbolic.log $(cold) python .ci/first_reached.py "$run/metrics.jsonl" "acc/test_id>=0.99" \
    "acc/test_ood>=0.95" -- python train.py config/symbolic.py --out_dir="$run" --data_dir="$WORK/data_symbolic" $SYM "$@"
  tail -n +$((n + 1)) "$OUT/symbolic.log" 2> /dev/null | grep -h "first at\|not reached" | tail -1 >> "$OUT/summary.txt"
}
symbolic "2 symbolic, the whole step one CUDA graph" $L_GRAPH graph --cuda_graph=True
wait $PLAN_PID 2> /dev/null  # the plans the compiled steps read (made while steps 1-2 ran)
compiled "3 compiled step, loop + DiscoLoop, policy auto, 440M" $L_AUTO --variants=loop,disco --activation_checkpointing=auto
step "4 tests/test_cuda.py" $L_TEST test_cuda.log python -m pytest $PYTEST_ARGS -p no:benchmark tests/test_cuda.py
compiled "5 compiled step, loop + DiscoLoop, policy block, 440M" $L_BLOCK --variants=loop,disco --activation_checkpointing=block
step "6 lab/sdpa.py, attention backends at 440M" $L_SDPA step.log python lab/sdpa.py config/pretrain.py $SDPA --json="$OUT/step.jsonl"
OLD=${JOB_AB_OLD:-out/a0d70e6.tar.gz}
if [ -e "$OLD" ]; then
  step "7 job_ab: a0d70e6, this tree, the CUDA graph" $L_AB symbolic.log python .ci/job_ab.py "$OLD" $AB --variants=old,new,graph -- --data_dir="$WORK/data_symbolic"
else
  echo "7 job_ab: skipped, no $OLD (git archive -o out/a0d70e6.tar.gz a0d70e6, carried)" >> "$OUT/summary.txt"
fi
symbolic "8 symbolic, eager" $L_SYM eager
step "9 compiled step, PonderLM, 440M" $L_PONDER step.log \
  $(cold) python bench.py step config/pretrain_ponder.py $STEP --compile=True --variants=ponder --plan_cache="$PLAN_P" --json="$OUT/step.jsonl"
step "10 eager step, loop + DiscoLoop, 440M" $L_EAGER step.log \
  python bench.py step config/pretrain.py $STEP --compile=False --variants=loop,disco --plan_cache="$PLAN" --json="$OUT/step.jsonl"
DECODE=${DECODE_CKPT:-out/small_disco_ll03}
if [ -e "$DECODE" ]; then
  step "11 batch-1 decoding: plain against pipelined, $DECODE" $L_DECODE step.log \
    python bench.py sample config/pretrain_small.py --ckpt="$DECODE" $DECODE_ARGS --speculative_propose=1
elif [ "$DRY" = 1 ]; then  # the same command's code path on random toy weights
  step "11 batch-1 decoding: plain against pipelined, random toy weights" $L_DECODE step.log \
    python bench.py sample config/pretrain_small.py $DECODE_TOY $DECODE_ARGS --speculative_propose=1
else
  echo "11 batch-1 decoding: skipped, no $DECODE (a trained run folder, carried; DECODE_CKPT names another)" >> "$OUT/summary.txt"
fi
# 12. the export in vLLM (issue 73): the 440M config with random weights, CUDA graphs off and on, against model.py's
#     cached generate and the pipelined decoder; skipped with a line where vLLM is not installed (the device has no
#     network: the serving extra must be there already)
if python -c "import vllm" 2> /dev/null; then
  if [ "$DRY" = 1 ]; then SERVE="--device=cpu --graphs=off --prompts=2 --new=16 --concurrent=4"
    SERVE_CFG="--n_layer=2 --n_embd=64 --n_head=2 --vocab_size=300 --block_size=64"
  else SERVE="--device=cuda --graphs=both --prompts=8 --new=64 --concurrent=32"; SERVE_CFG=""; fi
  step "12 vLLM against model.py, 440M random weights" ${L_SERVE:-120} step.log \
    python .ci/serve_measure.py config/pretrain.py $SERVE "--config_args=$SERVE_CFG" --json="$OUT/step.jsonl"
else
  echo "12 vLLM: skipped, not installed here (pip install -r requirements-serve.txt, before the call)" >> "$OUT/summary.txt"
fi
wait  # the background plans (finished long before)
echo "total $(( $(date +%s) - START )) s of DEADLINE=$DEADLINE; every step ok: $([ $FAILED = 0 ] && echo yes || echo no)" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
exit $FAILED
