"""cuda_graph=True (stepgraph.py) off CUDA: the step a graph captures (the loss over every row, -1 targets masked) runs
the eager step's numbers; its refusals; the checkpoint form; .ci/job_ab.py's dry run. The capture itself and its
replay: tests/test_cuda.py."""
import json
import os
import subprocess
import sys

import pytest
import torch

from discoloop import train_config
from discoloop.common import ConfigError
from conftest import REPO, TINY_DATA_ARGS, run, tiny_train_args
from discoloop.stepgraph import StepGraph, eager_form


def rows(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_the_step_a_graph_captures_is_the_eager_step_on_cpu(tiny_data, tmp_path):
    """Two micro-steps, the weight average, clipping, the schedule: every metric and weight within fp32 rounding."""
    runs = {}
    for graph in (False, True):
        out = str(tmp_path / f"g{graph}")
        r = run(tiny_train_args(tiny_data, out, "--max_iters=30", "--eval_interval=10", "--log_interval=5",
                                "--gradient_accumulation_steps=2", f"--cuda_graph={graph}"))
        assert r.returncode == 0, r.stderr[-2000:]
        runs[graph] = rows(out), torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    (eager, ck_e), (graphed, ck_g) = runs[False], runs[True]
    assert [r["iter"] for r in eager] == [r["iter"] for r in graphed] == [0, 10, 20, 30]
    for a, b in zip(eager, graphed):
        for k, v in a.items():
            if k in ("time", "cpu_time", "tok_per_s", "tflops"):
                continue
            # a number agrees to fp32 reassociation; anything else (the first row's mark) is equal
            if isinstance(v, (int, float)):
                assert b[k] == pytest.approx(v, rel=1e-5, abs=1e-6), (a["iter"], k)
            else:
                assert b[k] == v, (a["iter"], k)
    for part in ("model", "ema"):
        for k, t in ck_e[part].items():
            torch.testing.assert_close(ck_g[part][k], t, rtol=1e-5, atol=1e-6)
    assert ck_g["optimizers"][0]["param_groups"][0]["capturable"] is False


def test_a_checkpoint_holds_the_eager_optimizer_form():
    """A captured AdamW reads its lr from a device tensor and is capturable; its state_dict is an eager run's (a float
    lr, capturable off), so any run resumes it; the live optimizer keeps its tensor."""
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p], lr=0.5)
    opt.param_groups[0]["lr"], opt.param_groups[0]["capturable"] = torch.tensor(0.25), True
    opt.register_state_dict_post_hook(eager_form)
    group = opt.state_dict()["param_groups"][0]
    assert group["lr"] == 0.25 and type(group["lr"]) is float and group["capturable"] is False
    assert torch.is_tensor(opt.param_groups[0]["lr"]) and opt.param_groups[0]["capturable"] is True


@pytest.mark.parametrize("key, value", [("optimizer", "muon"), ("dtype", "float16"), ("compile_mode", "reduce-overhead")])
def test_what_a_graph_cannot_hold_is_refused_in_one_line(key, value):
    c = {**train_config.defaults(), "vocab_size": 64, "cuda_graph": True, "compile": True, key: value}
    with pytest.raises(ConfigError, match=f"cuda_graph=True cannot run with {key}={value!r}"):
        train_config.check(c)
    train_config.check({**c, "cuda_graph": False})  # the same keys without a graph are fine


def test_stepgraph_refuses_ddp_float16_and_an_optimizer_without_a_capturable_step():
    p = torch.nn.Parameter(torch.ones(3))
    adamw, sgd = [torch.optim.AdamW([p])], [torch.optim.SGD([p], lr=0.1)]
    for kw, needle in ((dict(ddp=True), "one process"), (dict(dtype="float16"), "float16"), (dict(optimizers=sgd), "adamw")):
        with pytest.raises(ConfigError, match=needle):
            StepGraph(None, kw.pop("optimizers", adamw), None, "cuda", **kw)


def test_the_job_ab_script_dry_runs(tiny_data, tmp_path):
    """.ci/job_ab.py against a tree (here this one), the eager and the graph variant: a row each and their ratio."""
    r = subprocess.run([sys.executable, ".ci/job_ab.py", REPO, "--dry", "--variants=old,graph", "--",
                        f"--data_dir={tiny_data}", f"--data_args={TINY_DATA_ARGS}"], cwd=REPO,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "| old | 0 | " in r.stdout and "| graph | 0 | " in r.stdout and "graph / old: s/interval" in r.stdout, r.stdout
    bad = subprocess.run([sys.executable, ".ci/job_ab.py", str(tmp_path), "--dry"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "holds no train.py" in bad.stderr, bad.stderr
