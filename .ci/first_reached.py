"""The first evaluation row of a metrics.jsonl where every 'metric>=value' holds: its wall time, epoch and iteration
(.ci/gpu.sh: the symbolic main job's seconds to 0.99 / 0.95).
    python .ci/first_reached.py FILE COND [COND ...]                   # read a finished run
    python .ci/first_reached.py FILE COND [COND ...] -- CMD [ARG ...]  # run CMD, SIGTERM it once a NEW row holds (a
                                                                       # benchmark's watcher: train.py's rule unchanged)
COND is METRIC>=NUMBER. With CMD, only rows appended after the start count (a file's earlier rows are not this run's),
and the exit is 0 when the watcher stopped CMD at a hit, else CMD's own (128 + N for a signal N). A SIGTERM or Ctrl-C
to the watcher stops CMD (SIGKILL after GRACE_S seconds in the environment, default 10: a checkpoint's save) and still
prints the line."""
import json
import os
import re
import signal
import subprocess
import sys
import time


def bad(msg, code=2):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)


GRACE_S = os.environ.get("GRACE_S", "10")
if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", GRACE_S):
    bad(f"GRACE_S={GRACE_S!r} is invalid: allowed seconds >= 0 (how long CMD may take to stop after SIGTERM)")
GRACE_S = float(GRACE_S)


args = sys.argv[1:]
cmd = args[args.index("--") + 1:] if "--" in args else None
args = args[:args.index("--")] if cmd is not None else args
if cmd == []:
    bad("nothing after '--': give the command to run")
if len(args) < 2:
    bad("usage: first_reached.py FILE METRIC>=NUMBER [...] [-- CMD ...]: a file and at least one condition")
path, conds = args[0], []
for c in args[1:]:
    m = re.fullmatch(r"([^\s=<>]+)>=([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)", c)
    if not m:
        bad(f"condition {c!r} is invalid: allowed METRIC>=NUMBER, e.g. acc/test_id>=0.99")
    conds.append((m.group(1), float(m.group(2))))
if os.path.isdir(path):
    bad(f"{path!r} is a folder: give a metrics.jsonl file")
if cmd is None and not os.path.exists(path):
    bad(f"{path!r} does not exist: give a run's metrics.jsonl")
start = os.path.getsize(path) if cmd is not None and os.path.isfile(path) else 0  # with CMD: only new rows count


def rows():
    out = []
    try:
        with open(path, "rb") as f:
            f.seek(start)
            for line in f:
                try:  # a run stopped by a time limit may leave a torn last line
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    except OSError as e:
        bad(f"{path}: {e.strerror}")
    return [r for r in out if isinstance(r, dict)]


def hit_row():
    return next((r for r in rows() if all(type(r.get(k)) in (int, float) and r[k] >= v for k, v in conds)), None)


def report(extra=""):
    hit, last = hit_row(), (rows() or [{}])[-1]
    what = " and ".join(f"{k}>={v:g}" for k, v in conds)
    if hit:
        print(f"{path}: {what} first at {hit.get('time')} s (epoch {hit.get('epoch')}, iter {hit.get('iter')}){extra}",
              flush=True)
    else:
        print(f"{path}: {what} not reached; last row {last.get('time')} s, iter {last.get('iter')}: "
              + ", ".join(f"{k} {last.get(k)}" for k, _ in conds) + extra, flush=True)


def end(child):
    """SIGTERM the command (train.py saves and exits), SIGKILL it if it has not ended in GRACE_S seconds."""
    child.terminate()
    try:
        child.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


if cmd is not None:
    try:
        child = subprocess.Popen(cmd)
    except OSError as e:
        bad(f"cannot run {cmd[0]!r}: {e.strerror}", 127)
    t0 = time.time()

    def stop(signum, frame):  # our own time limit or Ctrl-C: stop the run, keep what was measured
        end(child)
        report(f"; out of time after {time.time() - t0:.0f} s of the command")
        sys.exit(124 if signum == signal.SIGTERM else 130)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    stopped = False
    while child.poll() is None:
        if hit_row():
            end(child)
            stopped = True
            break
        time.sleep(0.2)
    rc = child.returncode
    report(f"; command exit {rc} after {time.time() - t0:.0f} s" + (" (stopped at the hit)" if stopped else ""))
    sys.exit(0 if stopped else (128 - rc if rc < 0 else rc))  # "not reached" is a figure, not a failure
report()
