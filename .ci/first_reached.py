"""The first evaluation row of a metrics.jsonl where every 'metric>=value' holds: its wall time, epoch and iteration
(.ci/gpu.sh: the symbolic main job's seconds to 0.99 / 0.95).
    python .ci/first_reached.py FILE COND [COND ...]                 # read a finished run
    python .ci/first_reached.py FILE COND [COND ...] -- CMD [ARG ...]  # run CMD, SIGTERM it once a row holds (a
                                                                     # benchmark's watcher: train.py's rule unchanged)
A SIGTERM to the watcher (a time limit) passes on to CMD and still prints the line."""
import json
import signal
import subprocess
import sys
import time

args = sys.argv[1:]
cmd = args[args.index("--") + 1:] if "--" in args else []
path, conds = args[0], [c.split(">=") for c in (args[1:args.index("--")] if cmd else args[1:])]


def rows():
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:  # a run stopped by a time limit may leave a torn last line
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    except OSError as e:
        sys.exit(f"{path}: {e.strerror}")
    return [r for r in out if isinstance(r, dict)]


def hit_row():
    return next((r for r in rows() if all(isinstance(r.get(k), (int, float)) and r[k] >= float(v) for k, v in conds)),
                None)


def report(extra=""):
    hit, last, what = hit_row(), (rows() or [{}])[-1], " and ".join(f"{k}>={v}" for k, v in conds)
    if hit:
        print(f"{path}: {what} first at {hit['time']} s (epoch {hit.get('epoch')}, iter {hit['iter']}){extra}", flush=True)
    else:
        print(f"{path}: {what} not reached; last row {last.get('time')} s, iter {last.get('iter')}: "
              + ", ".join(f"{k} {last.get(k)}" for k, _ in conds) + extra, flush=True)


if cmd:
    child = subprocess.Popen(cmd)
    t0 = time.time()

    def stop(signum, frame):  # our own time limit: stop the run, keep what was measured
        child.terminate()
        child.wait()
        report(f"; out of time after {time.time() - t0:.0f} s of the command")
        sys.exit(124)
    signal.signal(signal.SIGTERM, stop)
    while child.poll() is None:
        if hit_row():
            child.terminate()  # train.py saves and exits on SIGTERM
            child.wait()
            break
        time.sleep(0.2)
    report(f"; command exit {child.returncode} after {time.time() - t0:.0f} s")
    sys.exit(child.returncode)  # "not reached" is a figure, not a failure of the step
report()
