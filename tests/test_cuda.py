"""The CUDA path (issue: "On a GPU: measured, not planned"), skipped where there is no GPU (CI, the CPU machines):
bf16 steps of the symbolic and tiny pretraining configs with and without torch.compile, a kill and resume,
torchrun with one process (NCCL plus the gloo control group), and the memory check's refusal of a config that
cannot fit. Run on a lent device: python -m pytest -q tests/test_cuda.py"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO, run, tiny_train_args

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = ["--device=cuda", "--dtype=bfloat16", "--threads=0"]
TINY_PRETRAIN = ["config/pretrain_tiny.py", "--max_iters=20", "--eval_interval=10", "--eval_iters=2", "--n_embd=64"]


def rows(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def finite(rs):
    return all(v == v and abs(v) != float("inf") for r in rs for v in r.values() if isinstance(v, float))


@pytest.mark.parametrize("compile", [False, True])
def test_symbolic_bf16_steps(tiny_data, tmp_path, compile):
    out = str(tmp_path / "run")
    r = run(tiny_train_args(tiny_data, out, "--max_iters=20", "--eval_interval=10", *CUDA, f"--compile={compile}"),
            timeout=600, fresh=compile)  # Inductor's compile workers do not start in a child of the tests' zygote
    assert r.returncode == 0, r.stderr[-3000:]
    assert "torch.compile failed" not in r.stderr and [m["iter"] for m in rows(out)] == [0, 10, 20]
    assert finite(rows(out)) and torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["dtype_resolved"] == "bfloat16"


@pytest.mark.parametrize("compile", [False, True])
def test_pretrain_tiny_bf16_steps(tmp_path, compile):
    out = str(tmp_path / "run")
    r = run(["train.py", *TINY_PRETRAIN, f"--out_dir={out}", f"--data_dir={tmp_path / 'shards'}", *CUDA,
             f"--compile={compile}"], timeout=600, fresh=compile)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "memory plan per rank" in r.stdout  # printed before allocating, on every CUDA run
    assert "torch.compile failed" not in r.stderr and finite(rows(out)) and rows(out)[-1]["iter"] == 20


def test_kill_and_resume_match_to_float_noise(tmp_path):
    """SIGTERM mid-run, resume: the rows match an uninterrupted run to float noise (GPU kernels are not
    bit-reproducible: atomics in cuBLAS/SDPA)."""
    data = str(tmp_path / "shards")
    live, cut = str(tmp_path / "live"), str(tmp_path / "cut")
    base = ["train.py", *TINY_PRETRAIN, f"--data_dir={data}", *CUDA, "--max_iters=40"]
    assert run(base + [f"--out_dir={live}"], timeout=600).returncode == 0
    p = subprocess.Popen([sys.executable] + base + [f"--out_dir={cut}"], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    while not os.path.exists(os.path.join(cut, "ckpt.pt")):  # after the save at iteration 10
        assert p.poll() is None, p.communicate()
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=300) == 0
    r = run(base + [f"--out_dir={cut}", "--init_from=resume"], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = rows(live), rows(cut)
    assert [m["iter"] for m in a] == [m["iter"] for m in b]
    for x, y in zip(a, b):
        assert abs(x["val_loss"] - y["val_loss"]) < 2e-2 * abs(x["val_loss"]), (x, y)


def test_torchrun_one_process_nccl_compiled(tmp_path):
    """DDP (NCCL) around the per-block compiled model."""
    r = subprocess.run(["torchrun", "--standalone", "--nproc_per_node=1", "train.py", *TINY_PRETRAIN,
                        f"--out_dir={tmp_path / 'run'}", f"--data_dir={tmp_path / 'shards'}", *CUDA, "--compile=True"],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert rows(str(tmp_path / "run"))[-1]["iter"] == 20


def test_memory_check_refuses_what_cannot_fit(tmp_path):
    r = run(["train.py", *TINY_PRETRAIN, f"--out_dir={tmp_path / 'run'}", f"--data_dir={tmp_path / 'shards'}", *CUDA,
             # 0.41 GB of weights (the host's weights_fit passes: the H200 run of 2026-11-28 had 48 x 8192 refused by
             # the host's 135 GB before the plan was read), 639 GB of plan (`bench.py plan`): more than any one GPU
             "--n_embd=1024", "--n_head=16", "--n_layer=8", "--batch_size=2048", "--gradient_accumulation_steps=1",
             "--activation_checkpointing=none"], timeout=600)
    assert r.returncode == 2 and "the memory plan needs" in r.stderr and len(r.stderr.strip().splitlines()) == 1, \
        r.stderr[-2000:]
    assert not os.path.exists(tmp_path / "run" / "ckpt.pt")


def test_symbolic_with_the_step_as_one_cuda_graph(tiny_data, tmp_path):
    """cuda_graph=True (stepgraph.py): captured after its warm-up, the run's losses follow eager's to bf16 noise, and
    its checkpoint holds the eager optimizer form, which an eager run resumes."""
    out, eager = str(tmp_path / "graph"), str(tmp_path / "eager")
    for o, g in ((out, True), (eager, False)):
        r = run(tiny_train_args(tiny_data, o, "--max_iters=20", "--eval_interval=10", "--log_interval=5", *CUDA,
                                f"--cuda_graph={g}"), timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert ("CUDA graph: the training step is captured" in r.stdout) == g and "capture" not in r.stderr, r.stderr
    for a, b in zip(rows(eager), rows(out)):
        assert a["iter"] == b["iter"] and abs(a["loss/val_id"] - b["loss/val_id"]) < 2e-2 * abs(a["loss/val_id"]), (a, b)
    group = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["optimizers"][0]["param_groups"][0]
    assert type(group["lr"]) is float and group["capturable"] is False
    r = run(tiny_train_args(tiny_data, out, "--max_iters=30", "--eval_interval=10", *CUDA, "--cuda_graph=False",
                            "--init_from=resume"), timeout=600)
    assert r.returncode == 0 and rows(out)[-1]["iter"] == 30, r.stderr[-3000:]


def _graph_parts(sync=False):
    """A small fp32 model, a fused AdamW, a weight average and a step in train.py's shape (micro-batches, clip, flags)."""
    import copy
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).cuda()
    ema, opt = copy.deepcopy(m).requires_grad_(False), torch.optim.AdamW(m.parameters(), lr=1.0, fused=True)
    flag = torch.zeros((), dtype=torch.bool, device="cuda")

    def step(micro_batches):
        loss_sum = torch.zeros((), device="cuda")
        for x, y in micro_batches:
            loss = torch.nn.functional.cross_entropy(m(x), y) / len(micro_batches)
            loss.backward()
            loss_sum += loss.detach()
        if sync and loss_sum.item() < 0:  # a host sync: what a graph cannot hold
            pass
        flag.logical_or_(~torch.isfinite(torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)))
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch._foreach_lerp_(list(ema.parameters()), list(m.parameters()), 0.1)
        return loss_sum
    return m, ema, opt, step


@pytest.mark.parametrize("sync", [False, True])
def test_step_graph_replays_the_eager_step(sync, capsys):
    """StepGraph: WARMUP eager steps, one capture, replays reading each step's batch and learning rate (lrs that float32
    holds exactly); the losses and weights equal the plain eager loop's. A step with a host sync is one warning and
    runs eager, with the same numbers."""
    from discoloop.stepgraph import WARMUP, StepGraph
    torch.manual_seed(1)
    data = [[(torch.randn(8, 16, device="cuda"), torch.randint(0, 4, (8,), device="cuda")) for _ in range(2)]
            for _ in range(WARMUP + 5)]
    got = []
    for graph in (False, True):
        m, ema, opt, step = _graph_parts(sync)
        run_step = StepGraph(step, [opt], m, "cuda") if graph else step
        losses = []
        for k, mbs in enumerate(data):
            for g in opt.param_groups:  # train.py's line: a captured step reads its lr from the tensor
                g["lr"] = g["lr"].fill_(2.0 ** -(k + 3)) if torch.is_tensor(g["lr"]) else 2.0 ** -(k + 3)
            losses.append(run_step(mbs).item())
        got.append((losses, [p.detach().clone() for p in [*m.parameters(), *ema.parameters()]]))
    assert (run_step.graph is False) == sync and ("capture of the training step failed" in capsys.readouterr().err) == sync
    assert got[0][0] == pytest.approx(got[1][0], rel=1e-6)
    for a, b in zip(got[0][1], got[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_selective_checkpointing_on_cuda():
    """This GPU's attention op is one the selective policies keep (model.SDPA_OPS): "block" reruns it in backward,
    "attn" and "attn_mm" do not, under bf16 autocast (flash or cuDNN) and in fp32 (memory-efficient attention), with
    fp32 gradients equal to "block"'s; 'auto' against this GPU's memory picks "none" for a tiny config."""
    from discoloop.memory import check_fits, device_bytes
    from model import SDPA_OPS
    from test_checkpointing import TINY, backward_ops, make, small_config
    x, calls = torch.randint(0, 37, (2, 12), device="cuda"), TINY["n_layer"] * TINY["n_loop"]
    for ctx in (torch.autocast("cuda", torch.bfloat16), None):
        grads, counts = {}, {}
        for p in ("block", "attn", "attn_mm"):
            grads[p], counts[p] = backward_ops(make(p, recurrence="disco", phi_topk=5).cuda(), x, ctx)
        assert counts["block"].of(SDPA_OPS) == calls and counts["attn"].of(SDPA_OPS) == counts["attn_mm"].of(SDPA_OPS) == 0
        for p in ("attn", "attn_mm") if ctx is None else ():
            for n, g in grads["block"].items():
                torch.testing.assert_close(grads[p][n], g, rtol=1e-4, atol=1e-6, msg=f"{p}: {n}")
    assert check_fits(small_config("disco", "auto"), 1, torch.bfloat16, device_bytes("cuda"), show=False) == ("none", None)
