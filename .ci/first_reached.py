"""The first evaluation row of a metrics.jsonl where every 'metric>=value' holds: its wall time, epoch and iteration
(.ci/gpu.sh: the symbolic main job's seconds to 0.99 / 0.95). Usage: python .ci/first_reached.py FILE COND [COND ...]"""
import json
import sys

path, conds = sys.argv[1], [c.split(">=") for c in sys.argv[2:]]
rows = []
try:
    for line in open(path):
        try:  # a step stopped by its timeout may leave a torn last line
            rows.append(json.loads(line))
        except ValueError:
            pass
except OSError as e:
    sys.exit(f"{path}: {e.strerror}")
rows = [r for r in rows if isinstance(r, dict)]
hit = next((r for r in rows if all(isinstance(r.get(k), (int, float)) and r[k] >= float(v) for k, v in conds)), None)
last = rows[-1] if rows else {}
what = " and ".join(sys.argv[2:])
if hit:
    print(f"{path}: {what} first at {hit['time']} s (epoch {hit.get('epoch')}, iter {hit['iter']})")
else:
    print(f"{path}: {what} not reached; last row {last.get('time')} s, iter {last.get('iter')}: "
          + ", ".join(f"{k} {last.get(k)}" for k, _ in conds))
