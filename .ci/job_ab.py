"""The symbolic main job (train.py config/symbolic.py) of another tree against this one, side by side on one machine:
what would have caught the eager step's 1.6x on an H200 (issue 61), measured instead of compared across sessions.

    python .ci/job_ab.py OLD [--variants=old,new,graph] [--rounds=1] [--interval=390] [--device=cuda] [--dry] [-- ARGS]

OLD: a commit (git archive, in a checkout), a folder holding a tree, or a .tar / .tar.gz of one (git archive's output:
a device has no .git, so carry one there). Variants: old = OLD's train.py, new = this tree's, graph = this tree's with
--cuda_graph=True. Each run trains 2 x interval iterations (default 390 = 10 epochs, the config's evaluation interval;
each tree prepares its own data folder, the same generator and seed), round robin over variants and rounds, and gives:
  s/interval  seconds from the evaluation row at `interval` to the one at 2 x interval: `interval` steps, one
              evaluation and one checkpoint save, the job's own cadence (its seconds per 10 epochs)
  tok/s       the last log window's tokens per second (10 steps, no evaluation inside): the step alone
and each figure's ratio to the first variant's. ARGS go to every run's train.py (keys both trees know). --dry: the CPU,
a toy width, 2 x 2 iterations: the commands, not the speed (tests/test_stepgraph.py). A row is printed as measured.
"""
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {"old": [], "new": [], "graph": ["--cuda_graph=True"]}
DRY = ["--device=cpu", "--n_embd=32", "--n_head=2", "--batch_size=64", "--threads=1", "--dtype=float32", "--log_interval=1"]


def bad(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def tree(old, work):
    """A folder holding OLD's tree."""
    dest = os.path.join(work, "old")
    if os.path.isdir(old):
        dest = os.path.abspath(old)
    else:
        if not os.path.isfile(old):  # a commit of this checkout, as a tar
            r = subprocess.run(["git", "-C", REPO, "archive", "-o", os.path.join(work, "old.tar"), old],
                               capture_output=True, text=True)
            if r.returncode:
                bad(f"OLD={old!r} is neither a folder, a tar file nor a commit of this checkout ({r.stderr.strip()[:200]})")
            old = os.path.join(work, "old.tar")
        try:
            with tarfile.open(old) as t:
                t.extractall(dest, filter="data")
        except (tarfile.TarError, OSError, EOFError, zlib.error) as e:  # EOFError, zlib.error: a cut or damaged .gz
            bad(f"OLD={old!r} is not a readable tar of a tree ({(str(e).splitlines() or [type(e).__name__])[0]})")
    if not os.path.isfile(os.path.join(dest, "train.py")):
        bad(f"OLD={old!r} holds no train.py: allowed a commit, a folder or a tar of this project's tree")
    return dest


def measure(cwd, out, args, interval, limit):
    """(s/interval, tok/s) of one run, or None with why."""
    cmd = [sys.executable, "train.py", "config/symbolic.py", f"--out_dir={out}", f"--max_iters={2 * interval}",
           f"--eval_interval={interval}", *args]
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return None, f"out of time ({limit} s)"
    try:
        with open(os.path.join(out, "metrics.jsonl")) as f:
            rows = {row["iter"]: row for row in map(json.loads, f) if "iter" in row}
        return (rows[2 * interval]["time"] - rows[interval]["time"], rows[2 * interval]["tok_per_s"]), ""
    except (OSError, KeyError, ValueError) as e:
        last = (r.stderr.strip().splitlines() or [f"no row or figure {e}"])[-1][:200]
        return None, f"exit {r.returncode}: {last}"


def main(argv):
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    opts = dict(variants="old,new,graph", rounds="1", interval="390", device="cuda", limit="300")
    pos = [a for a in argv if not a.startswith("--")]
    for a in (a for a in argv if a.startswith("--")):
        k, _, v = a[2:].partition("=")
        if k not in (*opts, "dry") or (k == "dry") == bool(v):
            bad(f"{a!r} is not an option: allowed --variants=, --rounds=, --interval=, --device=, --limit=, --dry")
        opts[k] = v or "1"
    if len(pos) != 1:
        bad("usage: job_ab.py OLD [options] [-- train.py args]: one OLD (a commit, a folder or a tar)")
    names = opts["variants"].split(",")
    if not names or any(n not in VARIANTS for n in names) or len(set(names)) < len(names):
        bad(f"--variants={opts['variants']!r} is invalid: allowed a comma list of distinct {list(VARIANTS)}")
    if not all(opts[k].isdigit() and int(opts[k]) >= 1 for k in ("rounds", "interval", "limit")):
        bad("--rounds, --interval and --limit are whole numbers >= 1")
    dry = "dry" in opts
    interval = 2 if dry else int(opts["interval"])
    args = (DRY if dry else [f"--device={opts['device']}"]) + extra
    with tempfile.TemporaryDirectory(prefix="job_ab-") as work:
        trees = {"old": tree(pos[0], work), "new": REPO, "graph": REPO}
        got = {n: [] for n in names}
        print(f"| variant | round | s/{interval} iterations (+ eval + save) | tok/s (last log window) |\n|---|---|---|---|")
        for k in range(int(opts["rounds"])):
            for n in names:
                res, why = measure(trees[n], os.path.join(work, f"{n}_{k}"), args + VARIANTS[n], interval, int(opts["limit"]))
                got[n] += [res] if res else []
                print(f"| {n} | {k} | " + (f"{res[0]:.2f} | {res[1]:,}" if res else f"{why} | ") + " |", flush=True)
        base = got[names[0]]
        for n in names[1:]:
            if got[n] and base:
                s, t = (min(r[0] for r in got[n]) / min(r[0] for r in base), max(r[1] for r in got[n]) / max(r[1] for r in base))
                print(f"{n} / {names[0]}: s/interval {s:.3f}x, tok/s {t:.3f}x (best of each)")
        return 0 if all(len(v) == int(opts["rounds"]) for v in got.values()) else 1


if __name__ == "__main__":
    t0 = time.time()
    rc = main(sys.argv[1:])
    print(f"job_ab.py: {time.time() - t0:.0f} s")
    sys.exit(rc)
