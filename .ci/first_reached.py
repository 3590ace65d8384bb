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
if os.path.exists(path) and not os.path.isfile(path):  # a named pipe would block the reader for ever
    bad(f"{path!r} is not a regular file (a pipe, a device, a socket): give a run's metrics.jsonl")
def ident(st):
    return st.st_dev, st.st_ino


before = os.stat(path) if cmd is not None and os.path.isfile(path) else None
start = before.st_size if before else 0  # with CMD: only new rows count
if before:  # the bytes before `start`, to see a file rewritten in place (same inode, as long or longer)
    with open(path, "rb") as f:
        prefix = f.read(min(start, 1 << 16))
child = None


def fail(msg, code=2):
    """One line and a non-zero exit; a watched command is stopped first (it saves and exits)."""
    if child is not None and child.poll() is None:
        end(child)
    bad(msg, code)


def rows():
    """The rows to judge; a line that is not JSON is one line and exit 2 (not a JSON-lines file), except a torn last
    line (a run stopped by a time limit); a file truncated or replaced under the watcher is one line and exit 3 (its
    rows could no longer be told from earlier ones)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if before and (ident(st) != ident(before) or st.st_size < start or f.read(len(prefix)) != prefix):
                fail(f"{path} was truncated or replaced while watched (it held {start} bytes at the start): its rows "
                     "cannot be told from earlier ones; watch a file no other run writes", 3)
            f.seek(start)
            lines = f.read().split(b"\n")
    except FileNotFoundError:
        return []
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    out = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line) if line.strip() else None
        except ValueError:
            if i == len(lines) - 1:  # torn: no newline after it yet
                continue
            fail(f"{path}: line {i + 1} is not JSON ({line[:40]!r}): not a JSON-lines metrics file")
        if row is not None and not isinstance(row, dict):
            fail(f"{path}: line {i + 1} is a JSON {type(row).__name__}, not an object: not a metrics file")
        out += [row] if row is not None else []
    return out


def hit_row():
    return next((r for r in rows() if all(type(r.get(k)) in (int, float) and r[k] >= v for k, v in conds)), None)


def report(extra="", final=True):
    rs = rows()
    if final and cmd is not None and not os.path.exists(path):  # out of time (final=False): "not reached" is the figure
        fail(f"{path} never appeared: the command wrote no metrics{extra}")
    if final and not rs:  # nothing to judge is not a figure: an empty file, or a command that wrote no row
        fail(f"{path} holds no {'new ' if cmd is not None else ''}evaluation row{extra}: nothing to judge")
    unknown = [k for k, _ in conds if rs and not any(k in r for r in rs)]
    if unknown:
        keys = sorted({k for r in rs for k in r})
        fail(f"metric {unknown[0]!r} is in none of the {len(rs)} rows of {path}: allowed one of {keys[:12]}")
    hit, last = hit_row(), (rs or [{}])[-1]
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
        report(f"; out of time after {time.time() - t0:.0f} s of the command", final=False)
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
