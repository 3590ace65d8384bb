"""Generation with a key/value cache per (loop, layer): the cached logits equal an uncached forward at every
position, for every recurrence, n_loop other than K, prompts of several lengths, up to block_size."""
import re

import pytest
import torch

from model import GPT, Exit, GPTConfig

BLOCK = 24
CASES = [("loop", {}), ("none", {}), ("disco", {}), ("disco", {"phi_topk": 5}), ("disco", {"disco_gate": "learned"}),
         ("disco", {"disco_gate": "learned", "phi_topk": 4, "per_loop_norm": True, "sandwich_norm": True}),
         ("ponder", {}), ("ponder", {"ponder_scale_embeds": True, "ponder_multiply_steps": True, "phi_topk": 6})]


def make(recurrence, pos_emb, **kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**dict(block_size=BLOCK, vocab_size=50, n_layer=2, n_head=2, n_embd=32, pos_emb=pos_emb,
                                     recurrence=recurrence, n_loop=3), **kw})).eval()
    with torch.no_grad():  # non-trivial norms and gate so that every term matters
        for n, p in model.named_parameters():
            if "ln" in n or n.startswith("gate"):
                p.add_(0.3 * torch.randn_like(p))
    return model


def cached_logits(model, seq, prompt, n_loop=None, step=1):
    """Logits at every position of seq: the prompt in one call, then `step` tokens per call, through the cache."""
    cache = model.new_cache(n_loop)
    with torch.no_grad():
        out = [model.head(model.hidden(seq[:, :prompt], n_loop=n_loop, cache=cache))]
        for t in range(prompt, seq.size(1), step):
            out.append(model.head(model.hidden(seq[:, t:t + step], n_loop=n_loop, cache=cache)))
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("pos_emb", ["rope", "learned"])
@pytest.mark.parametrize("recurrence,kw", CASES)
def test_cached_equals_uncached_at_every_position(recurrence, kw, pos_emb):
    model = make(recurrence, pos_emb, **kw)
    seq = torch.randint(0, 50, (2, BLOCK))  # up to block_size
    loops = [None, 1, 2] + ([5] if recurrence != "none" else [])  # K = 3, fewer, and more than trained
    for n_loop in loops:
        with torch.no_grad():
            full = model.head(model.hidden(seq, n_loop=n_loop))
        for prompt, step in ((1, 1), (7, 1), (6, 3)):  # several new tokens at once: the mask aligned to the cache
            torch.testing.assert_close(cached_logits(model, seq, prompt, n_loop, step), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("recurrence,kw", CASES[:4] + CASES[6:7])
def test_generate_with_and_without_cache_agree(recurrence, kw):
    model = make(recurrence, "rope", **kw)
    prompt = torch.randint(0, 50, (2, 5))
    a = model.generate(prompt, 12, temperature=0)
    b = model.generate(prompt, 12, temperature=0, use_cache=False)
    assert torch.equal(a, b) and a.shape == (2, 17)
    g = [torch.Generator().manual_seed(7) for _ in range(2)]  # sampled: same seed, same tokens
    assert torch.equal(model.generate(prompt, 12, temperature=0.9, top_k=10, generator=g[0]),
                       model.generate(prompt, 12, temperature=0.9, top_k=10, generator=g[1], use_cache=False))


def test_past_block_size_is_one_clear_error():
    model = make("disco", "rope")
    with pytest.raises(ValueError, match="exceeds block_size=24"):
        model.generate(torch.zeros(1, 20, dtype=torch.long), 5)
    assert model.generate(torch.zeros(1, 20, dtype=torch.long), 4).shape == (1, 24)  # exactly up to it is fine


# ---- adaptive depth (issue 55): Exit, float64 ---------------------------------------------------------------------
EXIT_CASES = [("disco", {}), ("disco", {"phi_topk": 5}), ("disco", {"disco_gate": "learned", "per_loop_norm": True}),
              ("loop", {}), ("ponder", {}), ("disco", {"n_layer": 3, "n_prelude": 1, "n_coda": 1})]


def make64(recurrence, **kw):
    return make(recurrence, "rope", **kw).double()


def max_p(model, seq):
    """(K, B, T) the largest probability the rule reads after every loop, without exits."""
    out = []
    model.hidden(seq, hook=lambda k, h, nxt: out.append(model.decode(h, None, Exit())[0].amax(-1)))
    return torch.stack(out)


@pytest.mark.parametrize("recurrence,kw", EXIT_CASES)
def test_exits_that_never_fire_are_the_plain_forward(recurrence, kw):
    model, seq = make64(recurrence, **kw), torch.randint(0, 50, (2, BLOCK))
    with torch.no_grad():
        want = model.hidden(seq)
        for ex in (Exit(min_loops=3), Exit("kl", threshold=0.0), Exit(threshold=1.0)):
            torch.testing.assert_close(model.hidden(seq, exits=ex), want, rtol=0, atol=1e-12)
            assert torch.equal(ex.loops[0], torch.full((2, BLOCK), 3))  # every token ran every loop


@pytest.mark.parametrize("recurrence,kw", EXIT_CASES)
def test_exits_that_all_fire_after_loop_j_are_j_loops(recurrence, kw):
    model, seq = make64(recurrence, **kw), torch.randint(0, 50, (2, BLOCK))
    with torch.no_grad():
        for j in (1, 2):
            ex = Exit(threshold=0.0, min_loops=j)
            torch.testing.assert_close(model.hidden(seq, exits=ex), model.hidden(seq, n_loop=j), rtol=0, atol=1e-12)
            assert torch.equal(ex.loops[0], torch.full((2, BLOCK), j))


def midway(values):
    """A threshold halfway between the two middle values: half the tokens on each side, none on the edge (where
    rounding would decide)."""
    v = values.flatten().sort().values
    return (v[len(v) // 2 - 1] + v[len(v) // 2]).item() / 2


def mixed_exit(model, seq, j):
    """An Exit from loop j at the median top probability after loop j: some tokens exit, some run on."""
    with torch.no_grad():
        return Exit(threshold=midway(max_p(model, seq)[j - 1]), min_loops=j)


@pytest.mark.parametrize("recurrence,kw", EXIT_CASES[:-1] + [("loop", {"n_layer": 3, "n_prelude": 1})])
def test_a_token_exiting_at_j_has_the_logits_of_j_loops(recurrence, kw):
    """Every token runs at least j loops (min_loops=j), so up to loop j nothing it attends to is frozen: a token that
    exits at j gets the logits of a j-loop forward; later tokens attend to its frozen state after that.
    (Not with a coda: it runs once on every token's final state, so an exited token's coda reads earlier tokens that
    ran on.)"""
    model, seq = make64(recurrence, **kw), torch.randint(0, 50, (2, BLOCK))
    for j in (1, 2):
        ex = mixed_exit(model, seq, j)
        with torch.no_grad():
            got, want, full = (model.head(model.hidden(seq, exits=ex)), model.head(model.hidden(seq, n_loop=j)),
                               model.head(model.hidden(seq)))
        at = ex.loops[0]
        assert (at == j).any() and (at == 3).any(), at  # a mix, so the test can fail
        torch.testing.assert_close(got[at == j], want[at == j], rtol=0, atol=1e-10)
        # the tokens that ran on after an earlier token froze see its frozen state: not the plain forward
        assert (got[at == 3] - full[at == 3]).abs().max() > 1e-9  # (small at random init, far above float64's 1e-15)


@pytest.mark.parametrize("recurrence,kw", EXIT_CASES)
@pytest.mark.parametrize("rule", ["prob", "kl"])
def test_cached_generation_with_exits_is_the_uncached_adaptive_forward(recurrence, kw, rule):
    model, seq = make64(recurrence, **kw), torch.randint(0, 50, (2, BLOCK))
    if rule == "prob":
        ex = mixed_exit(model, seq, 1)
    else:  # the median KL between loops 1 and 2
        with torch.no_grad():
            ps = []
            model.hidden(seq, hook=lambda k, h, nxt: ps.append(model.decode(h, None, Exit())[0]))
        kl = (ps[0] * (ps[0].clamp_min(1e-30).log() - ps[1].clamp_min(1e-30).log())).sum(-1)  # top-k: zeros
        ex = Exit("kl", threshold=midway(kl))
    with torch.no_grad():
        want, want_at = model.head(model.hidden(seq, exits=ex)), ex.loops.pop()
        for prompt, step in ((7, 1), (6, 3)):  # one and several new tokens per call
            cache, out = model.new_cache(), []
            for s, e in [(0, prompt)] + [(t, t + step) for t in range(prompt, BLOCK, step)]:
                out.append(model.head(model.hidden(seq[:, s:e], cache=cache, exits=ex)))
            torch.testing.assert_close(torch.cat(out, 1), want, rtol=0, atol=1e-10)
            assert torch.equal(torch.cat(ex.loops, 1), want_at) and len(set(want_at.flatten().tolist())) > 1
            ex.loops.clear()
        prompt = seq[:, :5]  # generate: cached and uncached, token by token
        a = model.generate(prompt, 12, temperature=0, exits=ex)
        b = model.generate(prompt, 12, temperature=0, exits=ex, use_cache=False)
    assert torch.equal(a, b)


def test_generation_whose_tokens_all_exit_skips_the_later_loops():
    """B=1: a token that exited runs no later block (its MLP never), only its keys and values are made from its frozen
    state for the tokens after it, and the next tokens see exactly what the uncached adaptive forward sees."""
    model, seq = make64("disco"), torch.randint(0, 50, (1, BLOCK))
    calls = []
    for block in model.transformer.h:
        block.mlp.register_forward_hook(lambda mod, inp, out: calls.append(inp[0].size(1)))
    ex = mixed_exit(model, seq, 1)
    with torch.no_grad():
        want = model.head(model.hidden(seq, exits=ex))
        at = ex.loops.pop()
        cache, calls[:] = model.new_cache(), []
        got = torch.cat([model.head(model.hidden(seq[:, t:t + 1], cache=cache, exits=ex)) for t in range(BLOCK)], 1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    assert len(calls) == int(at.sum()) * 2 < 3 * BLOCK * 2  # 2 layers x the loops each token ran, not x 3 loops
    assert all(len(c) == BLOCK for loop in cache for c in loop)  # every (loop, layer) holds every position


def test_bad_exits_are_one_line():
    for kw, what in (({"rule": "sure"}, "rule='sure'"), ({"threshold": 1.5}, "threshold=1.5"),
                     ({"threshold": -0.1}, "threshold=-0.1"), ({"min_loops": 0}, "min_loops=0"),
                     ({"rule": "kl", "threshold": float("nan")}, "threshold=nan")):
        with pytest.raises(ValueError, match=what.replace("(", r"\(")) as e:
            Exit(**kw)
        assert "\n" not in str(e.value) and "allowed" in str(e.value)
    assert Exit("kl", threshold=5.0).threshold == 5.0  # a KL may exceed 1


def test_generate_stops_on_the_stop_condition():
    model = make("disco", "rope")
    prompt = torch.randint(0, 50, (1, 5))
    full = model.generate(prompt, 12, temperature=0)
    want = full[:, :5 + 4]
    assert torch.equal(model.generate(prompt, 12, temperature=0, stop=lambda ids: ids.size(1) == 9), want)
    tok = int(full[0, 7])
    got = model.generate(prompt, 12, temperature=0, stop=lambda ids: int(ids[0, -1]) == tok)
    assert torch.equal(got, full[:, :int((full[0, 5:] == tok).int().argmax()) + 6])


@pytest.mark.parametrize("rule,threshold,min_loops,n_loop,needle", [
    ("", 0.5, 1, None, "exit_threshold=0.5 has no effect with exits off"),       # a threshold with exits off was silently ignored
    ("", -1, 2, None, "exit_min_loops=2 has no effect with exits off"),
    ("prob", 0.9, 4, None, "exit_min_loops=4 leaves no loop"),  # min_loops >= K: no token could exit, said nothing
    ("prob", 0.9, 1, 1, "needs at least 2 loops (n_loop=1)"),   # exits with one loop: nothing to leave
    ("prob", 1.5, 1, None, "threshold"), ("maybe", 0.9, 1, None, "rule"),
    ("kl", 1e9, 1, 2, "needs n_loop >= 3 (n_loop=2)"),        # helper's pass: kl with K = 2 could never fire, said nothing
    ("gate", -1, 1, None, "no checkpoint"),                  # a learned exit needs the gate trained beside a checkpoint
])
def test_exit_options_that_could_not_act_are_one_line(rule, threshold, min_loops, n_loop, needle):
    """The hostile probes of the scripts' exit_* keys (sample.py, eval_harness, bench.py sample, exits.py)."""
    from discoloop.from_checkpoint import exit_option
    from discoloop.common import ConfigError
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(vocab_size=16, n_layer=1, n_head=2, n_embd=8, block_size=8, recurrence="disco", n_loop=4))
    with pytest.raises(ConfigError, match=re.escape(needle)):
        exit_option(rule, threshold, min_loops, model, n_loop)
    assert exit_option("", -1, 1, model) is None and exit_option("prob", -1, 3, model).threshold == 0.9  # the rule's own


def test_a_tiny_temperature_samples_the_top_token_not_nan():
    """--temperature=1e-40 divided the logits into inf and softmax into NaN (plain and pipelined decoding): the top
    logit is subtracted first, so the distribution is the top token's (issue 72 item 5)."""
    from model import sampling_probs
    logits = torch.tensor([[1.0, 3.0, 2.0, -float("inf")]])
    p = sampling_probs(logits, 1e-40)
    assert torch.equal(p, torch.tensor([[0.0, 1.0, 0.0, 0.0]]))
    assert torch.allclose(sampling_probs(logits, 0.7), torch.softmax(logits / 0.7, -1))
    from discoloop import speculative
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=40, block_size=32, n_layer=2, n_head=2, n_embd=32, n_loop=3)).eval()
    x = torch.randint(0, 40, (1, 4))
    greedy = m.generate(x, 8, temperature=0)
    assert torch.equal(m.generate(x, 8, temperature=1e-40), greedy)
    spec = speculative.spec_option(0, 4, m, propose=1)
    assert torch.equal(speculative.generate(m, x, 8, spec, temperature=1e-40, generator=torch.Generator()), greedy)
