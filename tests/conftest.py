import atexit
import json
import os
import tarfile
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
# the scripts the tests start (.ci/*.sh, torchrun) call `python`: make it the interpreter running the tests, so that
# `some-venv/bin/python -m pytest` works without activating the venv
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Triton decides interpreted or compiled when it is first imported (its own jit helpers, tl.max's included): the fused
# Phi's tests run its code in the interpreter, so the whole session (and every script it starts) imports Triton so.
# Not on a CUDA machine: there Inductor compiles real Triton kernels, which the interpreter breaks (an H200 run of
# test_cuda.py failed every compiled test with "InterpreterError")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TIKTOKEN_CACHE_DIR", "")
# the CPU precision decisions of this test session (precision.cached_cpu_dtype) stay out of the user's ~/.cache; the
# first process (the xdist controller or a plain run) makes the folder, its workers inherit it, and it is removed at
# the first process's exit (nothing is left in the temp folder)
if "DISCOLOOP_DTYPE_CACHE" not in os.environ:
    _cache_dir = tempfile.mkdtemp(prefix="discoloop-tests-")
    atexit.register(shutil.rmtree, _cache_dir, True)
    os.environ["DISCOLOOP_DTYPE_CACHE"] = os.path.join(_cache_dir, "cpu_dtype.json")

# a tiny symbolic graph: trains in seconds, same code path as the paper-size one
TINY_DATA = ["--n_entities=30", "--n_relations=8", "--out_degree=4", "--n_train=200", "--n_test=50",
             "--n_val=50"]
TINY_MODEL = ["--n_layer=1", "--n_head=2", "--n_embd=32", "--batch_size=64", "--eval_batch_size=512",
              "--dtype=float32", "--threads=1", "--warmup_iters=5", "--learning_rate=3e-3",
              "--stop_metric="]  # tests choose their own length; test_train.py tests early stopping


def run(args, cwd=REPO, timeout=300, env=None, fresh=False):
    """Run a repo script as its own process; returns CompletedProcess with text output. A script (not -m, -c) is
    forked from tests/zygote.py, which has torch imported already. fresh=True (tests of determinism across
    processes: forks share one string-hash seed) or DISCOLOOP_TEST_FORK=0 (all) start a new interpreter."""
    e = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    if (not fresh and not args[0].startswith("-") and os.environ.get("DISCOLOOP_TEST_FORK") != "0"
            and _ZYGOTE_LOCK.acquire(False)):
        try:
            return _forked(args, str(cwd), timeout, e)
        except (OSError, ValueError, KeyError):  # the zygote died or its protocol broke: drop it, run this one fresh
            if _ZYGOTE:
                _ZYGOTE.pop().kill()
        finally:
            _ZYGOTE_LOCK.release()
    return subprocess.run([sys.executable] + args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=e)


_ZYGOTE = []
_ZYGOTE_LOCK = threading.Lock()


def _forked(args, cwd, timeout, env):
    if not _ZYGOTE or _ZYGOTE[0].poll() is not None:
        _ZYGOTE[:] = [subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "zygote.py")], cwd=REPO,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                       env=dict(os.environ, OMP_NUM_THREADS="1"))]
    z = _ZYGOTE[0]
    with tempfile.TemporaryDirectory(prefix="discoloop-run-") as d:
        out, err = os.path.join(d, "out"), os.path.join(d, "err")
        z.stdin.write(json.dumps({"args": args, "cwd": cwd, "env": env, "out": out, "err": err}) + "\n")
        z.stdin.flush()
        pid = json.loads(z.stdout.readline())["pid"]
        killed = []
        timer = threading.Timer(timeout, lambda: (killed.append(pid), _kill(pid)))
        timer.start()
        try:
            rc = json.loads(z.stdout.readline())["rc"]
        finally:
            timer.cancel()
        stdout, stderr = open(out).read(), open(err).read()
    if killed:
        raise subprocess.TimeoutExpired([sys.executable] + args, timeout, stdout, stderr)
    return subprocess.CompletedProcess([sys.executable] + args, rc, stdout, stderr)


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # it ended as the timer fired
        pass


def prepared(tmp_path_factory, script, args):
    """A data folder made by a prepare script, in a fresh temp folder."""
    out = str(tmp_path_factory.mktemp("data") / "folder")
    r = run([script, f"--out_dir={out}"] + list(args))
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    return prepared(tmp_path_factory, "data/symbolic/prepare.py", TINY_DATA)


TINY_DATA_ARGS = {a[2:].split("=")[0]: int(a.split("=")[1]) for a in TINY_DATA}  # train.py's data_args for TINY_DATA


def tiny_train_args(data_dir, out_dir, *extra):
    return (["train.py", "config/symbolic.py", f"--data_dir={data_dir}", f"--out_dir={out_dir}",
             f"--data_args={TINY_DATA_ARGS}"] + TINY_MODEL + list(extra))


def one_line(r, *needles):
    """A script's bad-input contract: exit 2, one stderr line, no traceback, naming each needle."""
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, r.stderr[-2000:]
    for n in needles:
        assert n in err, err


@pytest.fixture(scope="session")
def tiny_run(tiny_data, tmp_path_factory):
    """A tiny vanilla-loop run folder (4 iterations), shared by the probes of round 6."""
    out = str(tmp_path_factory.mktemp("r6") / "run")
    r = run(tiny_train_args(tiny_data, out, "--max_iters=4", "--eval_interval=2", "--recurrence=loop"))
    assert r.returncode == 0, r.stderr[-2000:]
    return out


# The suite writes nothing in the checkout (issue 68): the paths git sees (untracked and ignored included) before and
# after the session, compared by the first process (the xdist controller or a plain run); a new one fails the run
CACHES = ("__pycache__", ".pytest_cache", ".hypothesis")


def _checkout_paths():
    r = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--ignored", "--untracked-files=all"],
                       capture_output=True, text=True)
    if r.returncode != 0:  # not a git checkout (an sdist, an export): nothing to compare
        return None
    return {line[3:] for line in r.stdout.splitlines() if not any(c in line for c in CACHES)}


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):
        session.config._checkout_before = _checkout_paths()


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_checkout_before", None)
    after = _checkout_paths() if before is not None else None
    new = sorted(after - before) if after is not None else []
    if new:
        print(f"\nerror: the suite wrote into the checkout: {new[:10]}", file=sys.stderr)
        session.exitstatus = 1


def mc_task(folder, name, rows, metrics=("acc",), tag=None):
    """A local lm-eval multiple-choice task (loglikelihood only: nothing is generated) in folder: mc.jsonl of `rows`
    ({question, choices, label}) and mc.yaml naming it `name` (and `tag`); returns the folder (an --include_path)."""
    data = folder / "mc.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in rows))
    (folder / "mc.yaml").write_text(f"""task: {name}
{f"tag: {tag}" if tag else ""}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "{{{{choices}}}}"
metric_list:
""" + "".join(f"  - metric: {m}\n" for m in metrics))
    return folder


def old_tree(tmp_path_factory, commit):
    """That commit's tree (git archive), to run its own scripts; skipped outside a git checkout with the history."""
    dest = tmp_path_factory.mktemp(f"tree_{commit}")
    try:
        tar = subprocess.run(["git", "-C", REPO, "archive", "--format=tar", commit], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"commit {commit} is not in this checkout's history")
    with tarfile.open(fileobj=__import__("io").BytesIO(tar)) as t:
        t.extractall(dest, filter="data")
    return dest


def ok(r):
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def byte_run(d, *model):
    """Byte-level shards of synthetic text (data/pretrain/prepare.py) in d/shards and a tiny pretraining run on them in
    d/run (config/pretrain_tiny.py with `model`: sizes and iterations); returns d."""
    ok(run(["data/pretrain/prepare.py", f"--out_dir={d / 'shards'}", "--encoding=bytes", "--num_proc=1",
            "--data_files=synthetic:web", "--weights=1", "--max_tokens=20000", "--val_tokens=2000"]))
    ok(run(["train.py", "config/pretrain_tiny.py", "--data_args={}", f"--data_dir={d / 'shards'}", f"--out_dir={d / 'run'}",
            "--gradient_accumulation_steps=1", "--eval_iters=1", "--warmup_iters=1", "--phi_topk=0", "--phi_chunk=0",
            "--threads=1", "--batch_size=4", *model]))
    return d
