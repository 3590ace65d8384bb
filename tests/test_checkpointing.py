"""Activation checkpointing policies (model.CHECKPOINTING): every policy gives the same gradients, each keeps what it
says (counted in backward: what reruns there), the memory plan orders them by what they keep, and 'auto' picks the
least recompute that fits its margin of the device (memory.pick_checkpointing), recorded where train.py resolves it."""
import json
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import REPO, run, tiny_train_args
from configurator import configure
from discoloop.memory import AUTO_MARGIN, AUTO_ORDER, check_fits, measure_step, pick_checkpointing, plan
from model import GPT, SDPA_OPS, GPTConfig
from discoloop.train_config import CHECKS, defaults as train_defaults

POLICIES = ("none", "block", "attn", "attn_mm")
TINY = dict(block_size=16, vocab_size=37, n_layer=2, n_head=2, n_embd=16, n_loop=3)


def make(policy, **kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**TINY, "activation_checkpointing": policy, **kw}))


class OpCounts(TorchDispatchMode):
    """How often each aten op runs inside the mode (here: in backward, where a recomputed op runs again)."""

    def __init__(self):
        super().__init__()
        self.n = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n[func] = self.n.get(func, 0) + 1
        return func(*args, **(kwargs or {}))

    def of(self, ops):
        return sum(self.n.get(op, 0) for op in ops)


def backward_ops(model, x, ctx=None):
    """(gradients by name, OpCounts of the backward) of one loss."""
    with ctx or torch.autocast("cpu", enabled=False):
        _, loss = model(x, x)
    with OpCounts() as counts:
        loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}, counts


@pytest.mark.parametrize("recurrence,kw", [("loop", {}), ("loop", {"dropout": 0.1, "n_kv_head": 1}), ("disco", {}),
                                           ("disco", {"phi_topk": 5, "phi_chunk": 4}), ("ponder", {"phi_chunk": 4}),
                                           ("none", {"sandwich_norm": True})])
def test_every_policy_gives_the_same_gradients_in_float64(recurrence, kw):
    """float64, a hook on every loop; dropout's RNG is replayed in every rerun (with dropout the CPU's attention is
    the math path, not one op: 'attn' then keeps less than it would on a GPU, and still gives the same numbers)."""
    x = torch.randint(0, 37, (2, 12))
    ref = None
    for policy in POLICIES:
        model = make(policy, recurrence=recurrence, **kw).double()
        seen = []
        _, loss = model(x, x, hook=lambda k, h, nxt: seen.append(k))
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters()}
        assert seen == [1, 2, 3] and all(g is not None for g in grads.values()), policy
        ref = ref or (loss, grads)
        torch.testing.assert_close(loss, ref[0], rtol=1e-13, atol=0)
        for n, g in grads.items():
            torch.testing.assert_close(g, ref[1][n], rtol=1e-12, atol=1e-14, msg=f"{policy}: {n}")


@pytest.mark.parametrize("ctx", [None, torch.autocast("cpu", torch.bfloat16)], ids=["fp64", "bf16-autocast"])
def test_each_policy_reruns_what_it_does_not_keep(ctx):
    """Counted in backward: "block" reruns every attention (one per block call) and its matmuls; "attn" reruns
    matmuls but no attention; "attn_mm" reruns neither (as many matmuls as without checkpointing). Under bf16
    autocast too, where the loop reuses a block whose weight casts autocast would cache across loops."""
    x = torch.randint(0, 37, (2, 12))
    mm = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default)
    counts = {p: backward_ops(make(p, recurrence="loop").double() if ctx is None else make(p, recurrence="loop"), x,
                              ctx)[1] for p in POLICIES}
    calls = TINY["n_layer"] * TINY["n_loop"]
    assert counts["none"].of(SDPA_OPS) == 0 and counts["block"].of(SDPA_OPS) == calls
    assert counts["attn"].of(SDPA_OPS) == counts["attn_mm"].of(SDPA_OPS) == 0
    assert counts["block"].of(mm) >= counts["attn"].of(mm) > counts["attn_mm"].of(mm) == counts["none"].of(mm)


def test_compiled_block_keeps_the_policy():
    """compile_blocks compiles checkpoint(block) whole (pytorch#161889: the other order drops the policy): one graph,
    the eager gradients, and its backward reruns no attention under "attn" (aot_eager: AOTAutograd's partition)."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    x = torch.randint(0, 37, (2, 12))
    want, _ = backward_ops(make("attn", recurrence="disco"), x)
    torch._dynamo.reset()
    counters.clear()
    got, counts = backward_ops(make("attn", recurrence="disco").compile_blocks(backend="aot_eager"), x)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert counts.of(SDPA_OPS) == 0 and counts.n  # the compiled backward ran its ops where the mode sees them
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-5, atol=1e-7, msg=n)


def small_config(recurrence, policy, B=2, T=96):
    return {**train_defaults(), "block_size": T, "vocab_size": 512, "n_layer": 2, "n_head": 4, "n_embd": 64, "n_loop": 3,
            "phi_topk": 16, "phi_chunk": 32, "loss_chunk": 48, "recurrence": recurrence, "batch_size": B,
            "activation_checkpointing": policy, "optimizer": "muon", "gradient_accumulation_steps": 1}


KEPT = "activations kept for backward ({} x {} tokens)"


@pytest.mark.parametrize("recurrence", ["loop", "disco"])
def test_plan_orders_the_policies_by_what_they_keep(recurrence):
    """Activations kept: none > attn_mm > attn > block, as real CPU tensors keep them (the selective policies' own
    storage included: LiveBytes follows every storage). Totals: none >= attn_mm >= attn; "attn" may peak below
    "block" where activations are small, since its rerun allocates no attention (config/pretrain.py: above it)."""
    plans = {p: plan(small_config(recurrence, p), 1, torch.float32) for p in POLICIES}
    act = {p: pl.rows[KEPT.format(2, 96)] for p, pl in plans.items()}
    assert act["none"] > act["attn_mm"] > act["attn"] > act["block"], act
    total = {p: pl.total for p, pl in plans.items()}
    assert total["none"] >= total["attn_mm"] >= total["attn"], total
    for p in ("attn", "attn_mm"):
        real = measure_step(GPTConfig.from_dict(small_config(recurrence, p)), 2, 96, torch.float32, fake=False)["act"]
        assert abs(act[p] - real) <= 0.15 * real, (p, act[p], real)


def test_auto_picks_the_least_recompute_within_the_margin(capsys):
    """pick_checkpointing with made-up plans, then check_fits (train.py's call) with a made-up device size around the
    tiny model's real plans: "attn" just fits its margin, a byte less picks "block"; a CPU (0 bytes) plans nothing."""
    totals = {"none": 100, "attn_mm": 60, "attn": 30, "block": 20}
    asked = []
    assert pick_checkpointing(lambda a: asked.append(a) or totals[a], 100 / AUTO_MARGIN) == "none" and asked == ["none"]
    assert pick_checkpointing(totals.get, 60 / AUTO_MARGIN) == "attn_mm"
    assert pick_checkpointing(totals.get, 59 / AUTO_MARGIN) == "attn"
    assert pick_checkpointing(totals.get, 1) == "block"  # nothing fits: the least memory, and check_fits says so
    assert pick_checkpointing(lambda a: 1 / 0, 0) == "block"  # no device memory figure: nothing planned
    c = small_config("disco", "auto")
    attn = plan({**c, "activation_checkpointing": "attn"}, 1, torch.float32).total
    assert check_fits(c, 1, torch.float32, attn / AUTO_MARGIN + 1, check=True, show=True) == ("attn", None)
    out = capsys.readouterr().out
    assert "activation_checkpointing='auto' -> 'attn'" in out and "activation_checkpointing='attn')" in out
    assert check_fits(c, 1, torch.float32, attn / AUTO_MARGIN - 1, check=True, show=False)[0] == "block"
    assert check_fits(c, 1, torch.float32, 0, check=True, show=True) == ("block", None)
    assert check_fits({**c, "activation_checkpointing": "attn"}, 1, torch.float32, 1, check=False, show=False) == ("attn", None)
    assert AUTO_ORDER == ("none", "attn_mm", "attn", "block")


def test_pretrain_plan_orders_too():
    """config/pretrain.py's width and vocabulary, shorter and shallower (fake tensors, bf16: seconds): the same order."""
    c = configure(train_defaults(), [f"{REPO}/config/pretrain.py", "--block_size=512", "--batch_size=1",
                                     "--n_layer=2"], checks=CHECKS)
    act = {p: plan({**c, "activation_checkpointing": p}, 8).rows[KEPT.format(1, 512)] for p in AUTO_ORDER}
    assert act["none"] > act["attn_mm"] > act["attn"] > act["block"], act


def test_flops_count_what_each_policy_reruns():
    """block reruns attention and matmuls, attn the matmuls, attn_mm neither; exact Phi reruns under all but none."""
    for kw in ({"recurrence": "loop"}, {"recurrence": "disco"}):
        m = make("none", **kw)
        f = {p: m.flops_per_token(12, recompute=p) for p in POLICIES + ("auto",)}
        attention = 4 * m.depth() * TINY["n_embd"] * 12  # the attention forward a block rerun adds
        assert f["block"] == f["auto"] and f["block"] - f["attn"] == attention
        assert f["attn"] > f["attn_mm"] >= f["none"] == m.flops_per_token(12)
        assert (f["attn_mm"] > f["none"]) == (kw["recurrence"] == "disco")  # exact Phi's chunks rerun


def test_a_bad_policy_is_one_line():
    with pytest.raises(ValueError, match=r"activation_checkpointing='sometimes' is invalid: allowed \('none', 'block'"):
        GPTConfig(activation_checkpointing="sometimes")
    r = run(["bench.py", "plan", "config/pretrain_tiny.py", "--activation_checkpointing=sometimes"])
    assert r.returncode == 2 and "'attn_mm'" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_train_records_the_resolved_policy_and_resumes_with_auto(tiny_data, tmp_path):
    """train.py on the CPU: 'auto' is "block" (no device memory to plan against), config.json and the checkpoint
    record "block", and a resume that asks 'auto' again (or another policy: memory, not numbers) goes on."""
    out = str(tmp_path / "run")
    r = run(tiny_train_args(tiny_data, out, "--activation_checkpointing=auto", "--max_iters=2", "--eval_interval=2"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.load(open(os.path.join(out, "config.json")))["activation_checkpointing"] == "block"
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert ckpt["model_args"]["activation_checkpointing"] == ckpt["config"]["activation_checkpointing"] == "block"
    for i, policy in enumerate(("auto", "attn")):
        r = run(tiny_train_args(tiny_data, out, f"--activation_checkpointing={policy}", f"--max_iters={4 + 2 * i}",
                                "--eval_interval=2", "--init_from=resume"))
        assert r.returncode == 0, r.stderr[-2000:]
    assert json.load(open(os.path.join(out, "config.json")))["activation_checkpointing"] == "attn"
