"""Generation with a key/value cache per (loop, layer): the cached logits equal an uncached forward at every
position, for every recurrence, n_loop other than K, prompts of several lengths, up to block_size."""
import pytest
import torch

from model import GPT, GPTConfig

BLOCK = 24
CASES = [("loop", {}), ("none", {}), ("disco", {}), ("disco", {"phi_topk": 5}), ("disco", {"disco_gate": "learned"}),
         ("disco", {"disco_gate": "learned", "phi_topk": 4, "per_loop_norm": True, "sandwich_norm": True}),
         ("ponder", {}), ("ponder", {"ponder_scale_embeds": True, "ponder_multiply_steps": True, "phi_topk": 6})]


def make(recurrence, pos_emb, **kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=BLOCK, vocab_size=50, n_layer=2, n_head=2, n_embd=32, pos_emb=pos_emb,
                          recurrence=recurrence, n_loop=3, **kw)).eval()
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
