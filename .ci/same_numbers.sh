#!/bin/bash
# fixed-seed runs of the four recurrences and pretrain_tiny on the tree before this session (/tmp/old, a worktree of
# its starting commit: a0d70e6 last) and on HEAD:
# the metrics rows must be identical but for timings
mkdir -p /tmp/same
T="--max_iters=30 --eval_interval=15 --dtype=float32 --threads=1 --stop_metric= --n_embd=64 --n_head=2"
D="--data_args={'n_entities':60,'n_relations':10,'out_degree':4,'n_train':600,'n_test':100,'n_val':100,'eval_hops':3}"
for tree in /tmp/old "$(cd "$(dirname "$0")/.." && pwd)"; do
  tag=$([ "$tree" = /tmp/old ] && echo old || echo main)
  for rec in none loop disco ponder; do
    (cd $tree && python train.py config/symbolic.py --recurrence=$rec $T "$D" --data_dir=/tmp/same/$tag/data \
      --out_dir=/tmp/same/$tag/$rec --overwrite=True > /tmp/same/$tag.$rec.log 2>&1)
  done
  (cd $tree && python train.py config/pretrain_tiny.py --max_iters=20 --eval_interval=10 --dtype=float32 --threads=1 \
     --data_dir=/tmp/same/$tag/tiny_data --out_dir=/tmp/same/$tag/tiny --overwrite=True > /tmp/same/$tag.tiny.log 2>&1)
done
python - <<'PY'
import json
for name in ["none", "loop", "disco", "ponder", "tiny"]:
    rows = []
    for tag in ["old", "main"]:
        rs = [json.loads(l) for l in open(f"/tmp/same/{tag}/{name}/metrics.jsonl")]
        rows.append([{k: v for k, v in r.items() if k not in ("time", "cpu_time", "tok_per_s", "tflops", "mfu")} for r in rs])
    print(name, "identical" if rows[0] == rows[1] else f"DIFFER {rows[0][-1]} vs {rows[1][-1]}", len(rows[0]), "rows")
PY
