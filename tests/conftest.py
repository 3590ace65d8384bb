import os
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TIKTOKEN_CACHE_DIR", "")
# the CPU precision decisions of this test session (common.cached_cpu_dtype) stay out of the user's ~/.cache
os.environ.setdefault("DISCOLOOP_DTYPE_CACHE", os.path.join(tempfile.mkdtemp(prefix="discoloop-tests-"), "cpu_dtype.json"))

# a tiny symbolic graph: trains in seconds, same code path as the paper-size one
TINY_DATA = ["--n_entities=30", "--n_relations=8", "--out_degree=4", "--n_train=200", "--n_test=50",
             "--n_val=50"]
TINY_MODEL = ["--n_layer=1", "--n_head=2", "--n_embd=32", "--batch_size=64", "--eval_batch_size=512",
              "--dtype=float32", "--threads=1", "--warmup_iters=5", "--learning_rate=3e-3",
              "--stop_metric="]  # tests choose their own length; test_train.py tests early stopping


def run(args, cwd=REPO, timeout=300, env=None):
    """Run a repo script in a subprocess; returns CompletedProcess with text output."""
    e = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run([sys.executable] + args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=e)


def prepared(tmp_path_factory, script, args):
    """A data folder made by a prepare script, in a fresh temp folder."""
    out = str(tmp_path_factory.mktemp("data") / "folder")
    r = run([script, f"--out_dir={out}"] + list(args))
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    return prepared(tmp_path_factory, "data/symbolic/prepare.py", TINY_DATA)


def tiny_train_args(data_dir, out_dir, *extra):
    prep = {a[2:].split("=")[0]: int(a.split("=")[1]) for a in TINY_DATA}
    return (["train.py", "config/symbolic.py", f"--data_dir={data_dir}", f"--out_dir={out_dir}",
             f"--data_args={prep}"] + TINY_MODEL + list(extra))
