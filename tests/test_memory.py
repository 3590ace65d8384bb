"""Pretraining memory: checkpointing is exact, the loss never holds (T, V) logits, and the memory
plan (fake tensors) agrees with what real tensors take on this CPU."""
import pytest
import torch
import torch.nn.functional as F

from configurator import configure
from discoloop.train_config import CHECKS, defaults as train_defaults
from conftest import REPO, run
from discoloop.memory import GPUS, HEADROOM, LiveBytes, measure_step, plan
from kernels import linear_cross_entropy
from model import GPT, GPTConfig

SMALL = dict(block_size=256, vocab_size=512, n_layer=2, n_head=4, n_embd=64, n_loop=3, phi_topk=16, phi_chunk=32,
             loss_chunk=48, sandwich_norm=True)


@pytest.mark.parametrize("recurrence", ["none", "loop", "disco", "ponder"])
def test_block_checkpointing_gives_the_same_gradients(recurrence):
    """fp32, with dropout (its RNG is replayed in the recompute) and a hook reading every loop."""
    grads, losses = [], []
    for ac in ("none", "block"):
        torch.manual_seed(0)
        model = GPT(GPTConfig(**{**SMALL, "recurrence": recurrence, "dropout": 0.1, "activation_checkpointing": ac}))
        idx, y = torch.randint(0, 512, (2, 40)), torch.randint(0, 512, (2, 40))
        seen = []
        _, loss = model(idx, y, hook=lambda k, h, nxt: seen.append(k))
        loss.backward()
        assert seen == [1, 2, 3]
        losses.append(loss.item())
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert losses[0] == losses[1]
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-6, atol=1e-6, msg=n)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("chunk", [0, 7, 64])
def test_chunked_cross_entropy_matches_pytorch(smoothing, chunk):
    torch.manual_seed(0)
    x = torch.randn(50, 12, dtype=torch.double, requires_grad=True)
    W = torch.randn(30, 12, dtype=torch.double, requires_grad=True)
    t = torch.randint(0, 30, (50,))
    t[::4] = -1
    ours = linear_cross_entropy(x, W, t, chunk, smoothing)
    ref = F.cross_entropy(x @ W.T, t, ignore_index=-1, label_smoothing=smoothing)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    g_ours = torch.autograd.grad(3 * ours, (x, W))
    g_ref = torch.autograd.grad(3 * ref, (x, W))
    for a, b in zip(g_ours, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def loss_peak(n, chunk, V=4096, d=32):
    x = torch.randn(n, d, requires_grad=True)
    W = torch.randn(V, d, requires_grad=True)
    t = torch.randint(0, V, (n,))
    live = LiveBytes([x, W])
    with live:
        linear_cross_entropy(x, W, t, chunk).backward()
    return live.peak


def test_loss_memory_grows_with_the_chunk_not_with_T():
    V, d = 4096, 32
    row_of_logits = V * 4
    # 4x the positions at a fixed chunk: only O(N d) more (dx), far from the (N, V) logits
    grow_T = loss_peak(1024, 64) - loss_peak(256, 64)
    assert grow_T < 768 * d * 4 * 3 < 768 * row_of_logits / 10
    # 4x the chunk at fixed positions: at least the extra (chunk, V) fp32 logits
    grow_chunk = loss_peak(1024, 256) - loss_peak(1024, 64)
    assert grow_chunk >= 192 * row_of_logits


def saved_storage_bytes(model, idx, y):
    """An independent count: storages autograd saves for backward (parameters excluded), each once."""
    seen, params = {}, {p.untyped_storage()._cdata for p in model.parameters()}

    def pack(t):
        st = t.untyped_storage()
        if st._cdata not in params:
            seen[st._cdata] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(idx, y)
    return sum(seen.values())


@pytest.mark.parametrize("ac", ["none", "block"])
@pytest.mark.parametrize("recurrence", ["loop", "disco", "ponder"])
def test_plan_activations_match_real_tensors(ac, recurrence):
    """The plan's activation figure (fake tensors) is within 15% of real CPU tensors at three shapes."""
    for B, T in ((1, 64), (2, 96), (4, 128)):
        c = {**script_defaults_dict(), **SMALL, "recurrence": recurrence, "activation_checkpointing": ac,
             "batch_size": B, "block_size": T, "optimizer": "muon", "gradient_accumulation_steps": 8}
        planned = plan(c, world_size=8, dtype=torch.float32).rows[f"activations kept for backward ({B} x {T} tokens)"]
        real = measure_step(GPTConfig.from_dict(c), B, T, torch.float32, fake=False)["act"]
        assert abs(planned - real) <= 0.15 * real, (B, T, planned, real)
        # and a second, independent count: what autograd saves, each storage once
        torch.manual_seed(0)
        idx = torch.randint(0, 512, (B, T))
        independent = saved_storage_bytes(GPT(GPTConfig.from_dict(c)), idx, idx)
        assert abs(planned - independent) <= 0.15 * independent, (B, T, planned, independent)


def script_defaults_dict():
    return train_defaults()


def test_pretrain_config_plans_within_72_gb():
    """config/pretrain.py (the largest of the three recurrences) on 8 x 80 GB: the 440M model's plan."""
    c = configure(script_defaults_dict(), [f"{REPO}/config/pretrain.py"], checks=CHECKS)
    p = plan(c, world_size=8)
    assert p.tokens_per_step == 1_048_576
    assert p.total <= HEADROOM * GPUS["H100 80GB"]


def test_bench_plan_prints_the_plan():
    r = run(["bench.py", "plan", "config/pretrain_tiny.py", "--vocab_size=256", "--world_size=2"])
    assert r.returncode == 0, r.stderr
    assert "| **total** |" in r.stdout and "H100 80GB:" in r.stdout and "GPU-hours" in r.stdout
    r = run(["bench.py", "plan", "config/pretrain_tiny.py", "--world_size=3"])
    assert r.returncode == 2 and "world_size=3" in r.stderr and len(r.stderr.strip().splitlines()) == 1
