"""Every recurrence equals the paper's equations recomputed by hand from the model's own blocks."""
import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig


def make(recurrence, K, pos_emb="rope", **kw):
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=16, vocab_size=37, n_layer=2, n_head=2, n_embd=16, pos_emb=pos_emb,
                    recurrence=recurrence, n_loop=K, **kw)
    model = GPT(cfg).double().eval()
    with torch.no_grad():  # non-trivial norms and gate so that every term matters
        for n, p in model.named_parameters():
            if "ln" in n or n.startswith("gate"):
                p.add_(0.3 * torch.randn_like(p))
    return model


def rmsnorm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def reference(model, idx, K):
    """Eq. (1), (3)-(5), the stacked baseline and PonderLM written out directly."""
    cfg, tr = model.config, model.transformer
    W = tr.wte.weight
    rope = (model.rope_cos, model.rope_sin) if cfg.pos_emb == "rope" else None
    pos = tr.wpe.weight[:idx.size(1)] if cfg.pos_emb == "learned" else 0

    def f(x, copy=0):
        for b in tr.h[copy * cfg.n_layer:(copy + 1) * cfg.n_layer]:
            x = b(x, rope)
        return x

    def head(h):
        if cfg.per_loop_norm:  # h is already ln_f(f(...))
            return h @ W.T
        if cfg.norm == "layernorm":
            return F.layer_norm(h, (h.size(-1),), tr.ln_f.weight, tr.ln_f.bias) @ W.T
        return rmsnorm(h, tr.ln_f.weight) @ W.T

    def phi(h):
        logits = head(h) / cfg.phi_tau
        if cfg.phi_topk:  # Phi_k: mask everything outside the top-k, renormalize
            kth = logits.topk(cfg.phi_topk, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return logits.softmax(-1) @ W

    x = W[idx]
    if cfg.recurrence == "ponder":
        scale = cfg.n_embd ** 0.5 if cfg.ponder_scale_embeds else 1  # on W in both uses (hzby/PonderingLM)
        e = x * scale * (cfg.n_loop - 1 if cfg.ponder_multiply_steps else 1)
        for k in range(K):
            h = f(e + pos)
            if cfg.per_loop_norm:
                h = rmsnorm(h, tr.ln_f.weight)
            if k < K - 1:
                e = e + scale * phi(h)
        return head(h)
    x = x + pos
    for k in range(K):
        if k > 0 and cfg.pos_every_loop:
            x = x + pos
        h = f(x, copy=k if cfg.recurrence == "none" else 0)
        if cfg.per_loop_norm:  # Ouro: norm, then Phi of the normed state, then the injection
            h = rmsnorm(h, tr.ln_f.weight)
        if cfg.recurrence == "disco" and k < K - 1:
            p = phi(h)
            if cfg.disco_gate == "learned":
                alpha = torch.sigmoid(p @ model.gate_w + model.gate_b)[..., None]
            else:
                alpha = cfg.disco_alpha
            x = h + alpha * rmsnorm(p, tr.ln_inj.weight)
        else:
            x = h
    return head(x)


CASES = [("none", {}), ("loop", {}), ("disco", {}), ("disco", {"phi_topk": 5}),
         ("disco", {"disco_gate": "learned"}), ("disco", {"disco_gate": "learned", "phi_topk": 3, "phi_tau": 0.7}),
         ("disco", {"disco_alpha": 0.4, "phi_chunk": 3}), ("ponder", {}), ("ponder", {"phi_topk": 4}),
         ("disco", {"pos_every_loop": True}), ("loop", {"pos_every_loop": True, "sandwich_norm": True}),
         ("disco", {"mlp": "gelu", "norm": "layernorm", "bias": True}),
         ("disco", {"per_loop_norm": True, "sandwich_norm": True}), ("loop", {"per_loop_norm": True}),
         ("ponder", {"per_loop_norm": True}), ("none", {"per_loop_norm": True}),
         ("disco", {"per_loop_norm": True, "phi_topk": 5, "disco_gate": "learned"}),
         ("ponder", {"ponder_scale_embeds": True, "ponder_multiply_steps": True}),
         ("ponder", {"phi_chunk": 4, "activation_checkpointing": "block"})]


@pytest.mark.parametrize("K", [2, 3])
@pytest.mark.parametrize("pos_emb", ["rope", "learned"])
@pytest.mark.parametrize("recurrence,kw", CASES)
def test_matches_hand_recurrence(recurrence, kw, K, pos_emb):
    model = make(recurrence, K, pos_emb, **kw)
    idx = torch.randint(0, 37, (3, 11))
    logits, _ = model(idx)
    torch.testing.assert_close(logits, reference(model, idx, K), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("recurrence,kw", [("disco", {"phi_topk": 5}), ("disco", {"phi_topk": 3, "phi_chunk": 4}),
                                           ("disco", {"phi_topk": 4, "disco_gate": "learned", "phi_tau": 0.7}),
                                           ("ponder", {"phi_topk": 4})])
def test_topk_sparse_backward_matches_dense(recurrence, kw):
    """TopkPhi's O(k) backward gives the gradient of the dense reference (masked softmax over all V)."""
    model = make(recurrence, 3, **kw)
    idx = torch.randint(0, 37, (3, 9))
    w = torch.randn(3, 9, 37, dtype=torch.double)  # a generic loss: every logit gets some gradient
    grads = []
    for fn in (lambda: model(idx)[0], lambda: reference(model, idx, 3)):
        model.zero_grad(set_to_none=True)
        (fn() * w).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and "transformer.wte.weight" in grads[0]
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-9, atol=1e-9, msg=n)


def test_baselines_differ_from_disco():
    # guards the reference itself: the recurrences must not coincide
    idx = torch.randint(0, 37, (2, 7))
    outs = {r: make(r, 2)(idx)[0] for r in ("loop", "disco", "ponder")}
    assert not torch.allclose(outs["loop"], outs["disco"]) and not torch.allclose(outs["disco"], outs["ponder"])


def test_topk_equal_to_vocab_is_exact():
    idx = torch.randint(0, 37, (2, 7))
    torch.testing.assert_close(make("disco", 2)(idx)[0], make("disco", 2, phi_topk=37)(idx)[0])


@pytest.mark.parametrize("recurrence", ["none", "loop", "disco", "ponder"])
def test_n_loop_reads_early_and_hook_sees_every_loop(recurrence):
    model = make(recurrence, 3)
    idx = torch.randint(0, 37, (2, 6))
    seen = []
    logits, _ = model(idx, hook=lambda k, h, nxt: seen.append((k, h, nxt)))
    assert [k for k, _, _ in seen] == [1, 2, 3]
    # Stage-1: head on the state after loop 1 == forward with n_loop=1
    torch.testing.assert_close(model(idx, n_loop=1)[0], model.head(seen[0][1]))
    torch.testing.assert_close(logits, model.head(seen[-1][2]))
    if recurrence == "none":
        with pytest.raises(ValueError, match="n_loop=4"):
            model(idx, n_loop=4)
    else:
        assert model(idx, n_loop=5)[0].shape == logits.shape


@pytest.mark.parametrize("recurrence", ["loop", "disco", "ponder"])
def test_loops_per_row_reads_each_row_after_its_own_loop(recurrence):
    """loops (train.py's loops_by_hops): row b's state is the one n_loop=loops[b] gives, and so is its loss."""
    model = make(recurrence, 3)
    idx = torch.randint(0, 37, (3, 6))
    loops = torch.tensor([2, 1, 3])
    logits = model(idx, loops=loops)[0]
    for b, k in enumerate(loops.tolist()):
        torch.testing.assert_close(logits[b], model(idx[b:b + 1], n_loop=k)[0][0])
    y = torch.full_like(idx, -1)
    y[:, -1] = idx[:, 0]
    expected = F.cross_entropy(logits[:, -1], idx[:, 0])
    torch.testing.assert_close(model(idx, y, loops=loops, sparse_targets=True)[1], expected)
    assert not torch.allclose(logits, model(idx)[0])  # rows 0, 1 read earlier than the last loop


def test_hook_replacement_changes_next_loop():
    model = make("loop", 2)
    idx = torch.randint(0, 37, (2, 6))
    base = model(idx)[0]
    out = model(idx, hook=lambda k, h, nxt: torch.zeros_like(nxt) if k == 1 else None)[0]
    torch.testing.assert_close(out, model.head(model.f_theta(torch.zeros(2, 6, 16, dtype=torch.double))))
    assert not torch.allclose(out, base)


def test_loss_only_on_targets_and_backward():
    model = make("disco", 2, phi_topk=4, disco_gate="learned").float().train()
    idx = torch.randint(0, 37, (4, 5))
    y = torch.full_like(idx, -1)
    y[:, -1] = idx[:, 0]
    logits, loss = model(idx, y)
    assert logits is None  # the loss never builds the (B, T, V) logits
    torch.testing.assert_close(loss, F.cross_entropy(model(idx)[0][:, -1].float(), idx[:, 0]))
    loss.backward()
    assert model.gate_w.grad.abs().sum() > 0 and model.transformer.wte.weight.grad.abs().sum() > 0


def test_param_counts():
    d = GPTConfig(vocab_size=37, n_layer=2, n_head=2, n_embd=16, n_loop=3)
    loop = GPT(GPTConfig(**{**d.__dict__, "recurrence": "loop"}))
    flat = GPT(GPTConfig(**{**d.__dict__, "recurrence": "none"}))
    gated = GPT(GPTConfig(**{**d.__dict__, "recurrence": "disco", "disco_gate": "learned"}))
    fixed = GPT(GPTConfig(**{**d.__dict__, "recurrence": "disco"}))
    blocks = sum(p.numel() for p in loop.transformer.h.parameters())
    assert flat.get_num_params() - loop.get_num_params() == 2 * blocks  # K untied copies
    assert gated.get_num_params() - fixed.get_num_params() == 16 + 1    # d+1 gate parameters


@pytest.mark.parametrize("kw,needle", [
    ({"n_loop": 0}, "n_loop=0"), ({"phi_tau": -1.0}, "phi_tau=-1.0"), ({"n_head": 5}, "n_head=5"),
    ({"recurrence": "lop"}, "recurrence='lop'"), ({"phi_topk": 99}, "phi_topk=99"),
])
def test_bad_config_values(kw, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        GPTConfig(**{"vocab_size": 37, "n_embd": 16, "n_head": 2, **kw})


def test_pos_shift_trains_later_position_rows_and_leaves_eval_alone():
    """pos_shift: in training each sequence reads position rows s..s+T-1 for a random s; evaluation
    reads 0..T-1, the same as without it. Equal to shifting the learned table by hand."""
    model = make("disco", 2, pos_emb="learned", pos_shift=3)
    plain = make("disco", 2, pos_emb="learned")
    idx = torch.randint(0, 37, (5, 6))
    assert torch.equal(model(idx)[0], plain(idx)[0])  # eval mode: no shift
    model.train()
    torch.manual_seed(7)
    got = model(idx)[0]
    torch.manual_seed(7)
    s = torch.randint(0, 4, (5, 1))
    assert s.unique().numel() > 1  # the draw really differs per sequence
    want = torch.cat([plain(idx[i:i + 1], hook=None)[0] if s[i] == 0 else
                      shifted(plain, idx[i:i + 1], int(s[i])) for i in range(5)])
    assert torch.allclose(got, want, atol=1e-12)
    # the positions past the longest sequence get gradients
    model(idx)[0].sum().backward()
    assert model.transformer.wpe.weight.grad[6:9].abs().sum() > 0
    with pytest.raises(ValueError, match="pos_shift=3 with sequences of 14 tokens needs block_size >= 17"):
        model(torch.zeros(1, 14, dtype=torch.long))
    with pytest.raises(ValueError, match="pos_shift=2 needs pos_emb='learned'"):
        GPTConfig(pos_emb="rope", pos_shift=2)


def shifted(model, idx, s):
    """The same model with its position table moved up by s rows (what a shift of s reads)."""
    wpe = model.transformer.wpe.weight
    saved = wpe.detach().clone()
    with torch.no_grad():
        wpe[:wpe.size(0) - s] = saved[s:]
    out = model(idx)[0]
    with torch.no_grad():
        wpe.copy_(saved)
    return out


def test_every_recurrence_is_covered():
    """A recurrence added to model.RECURRENCES is tested against its equations here (CASES) and timed by bench.py;
    memory.py and probe.py read only its facts, so they need no change."""
    from bench import VARIANTS
    from model import RECURRENCES
    assert {r for r, _ in CASES} == set(RECURRENCES)
    assert set(RECURRENCES) <= set(VARIANTS)
    for name, spec in RECURRENCES.items():
        model = make(name, 2)
        assert (model.config.n_layer * 2 == len(model.transformer.h)) == spec.copies
        assert hasattr(model.transformer, "ln_inj") == spec.injects


@pytest.mark.parametrize("recurrence", ["disco", "ponder", "none"])
def test_sparse_targets_is_the_same_loss_and_gradient(recurrence):
    """sparse_targets: the head and the loss run on the rows that have a target; same loss, same gradients."""
    model = make(recurrence, 2, label_smoothing=0.1)
    idx = torch.randint(0, 37, (4, 9))
    targets = torch.full((4, 9), -1)
    targets[:, 5] = torch.randint(0, 37, (4,))  # one answer token per row, as in the QA data
    targets[1, 7] = 3
    out = []
    for sparse in (False, True):
        model.zero_grad(set_to_none=True)
        loss = model(idx, targets, sparse_targets=sparse)[1]
        loss.backward()
        out.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    torch.testing.assert_close(out[0][0], out[1][0], rtol=1e-12, atol=1e-12)
    assert out[0][1].keys() == out[1][1].keys()
    for n in out[0][1]:
        torch.testing.assert_close(out[0][1][n], out[1][1][n], rtol=1e-10, atol=1e-12, msg=n)


@pytest.mark.parametrize("rec", ["loop", "disco"])
def test_prelude_and_coda_run_once_around_the_loop(rec):
    """n_prelude / n_coda (a looped middle, as a pretrained model is retrofitted): the first block runs once, the
    middle K times with the recurrence's update between loops, the last once; float64, by hand. Cached generation
    equals uncached, and the FLOP count charges the looped blocks K times."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=50, n_layer=4, n_head=2, n_embd=16, block_size=16, recurrence=rec, n_loop=3,
                      n_prelude=1, n_coda=1, pos_emb="rope")).double().eval()
    x = torch.randint(0, 50, (2, 10))
    rope = (m.rope_cos, m.rope_sin)
    with torch.no_grad():
        h = m.transformer.h[0](m.transformer.wte(x), rope, None)
        for k in range(3):
            for i in (1, 2):
                h = m.transformer.h[i](h, rope, None)
            if k < 2:
                h = h + m.config.disco_alpha * m.transformer.ln_inj(m.phi(h)) if rec == "disco" else h
        h = m.transformer.h[3](h, rope, None)
        assert (m.head(h) - m(x)[0]).abs().max().item() < 1e-9
        assert torch.equal(m.generate(x[:1, :4], 5, temperature=0), m.generate(x[:1, :4], 5, temperature=0, use_cache=False))
    plain = GPT(GPTConfig(vocab_size=50, n_layer=4, n_head=2, n_embd=16, block_size=16, recurrence=rec, n_loop=3))
    per_block = sum(p.numel() for p in m.transformer.h[0].parameters())
    assert plain.flops_per_token(10) - m.flops_per_token(10) == 6 * 2 * 2 * per_block + 12 * 4 * 16 * 10
    for bad in (dict(n_prelude=2, n_coda=2), dict(n_prelude=1, recurrence="ponder"), dict(n_coda=-1)):
        with pytest.raises(ValueError, match="n_prelude|n_coda"):
            GPTConfig(**{**dict(vocab_size=50, n_layer=4, n_head=2, n_embd=16, recurrence="loop", n_loop=2), **bad})
