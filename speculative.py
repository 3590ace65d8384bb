"""
Exact self-speculative decoding (issue 62): a looped model's first d loops are a draft model that shares its weights
and its keys and values. Each round drafts up to `draft_len` tokens with loops 1..d, verifies them with one
full-depth forward over the drafted tokens, keeps the longest prefix the verifier agrees with plus the verifier's own
next token, and cuts every (loop, layer) cache back past a rejected token. Greedy output is GPT.generate's at
temperature 0, token for token; sampled output keeps its distribution (accept drafted x with min(1, p(x)/q(x)), on a
rejection sample norm(max(0, p - q)): Leviathan et al. 2023, Chen et al. 2023).

What the verifier reuses: loop k's state at a position depends only on loops < k for every recurrence here (loop,
disco: H^{k+1} = f(H~^k); ponder: e^{k+1} = e^k + Phi(h^k); none: copy k reads copy k-1), so the keys and values the
draft stored for loops 1..d (and the prelude's) are the full model's; the verifier runs loops d+1..K only, from loop
d's output the draft kept. A coda reads the last loop, so its draft keys and values are cut and computed again.

    python sample.py --ckpt=out/small_disco --speculative_draft_loops=1 --speculative_len=4
    python bench.py sample config/pretrain_small.py --ckpt=out/small_disco --speculative_draft_loops=1
"""
from dataclasses import dataclass

import torch

from common import ConfigError
from configurator import INT_GE0, INT_GE1

# the scripts' speculative keys (sample.py, eval_harness.py, bench.py sample), checked once here
SPEC_KEYS = dict(
    speculative_draft_loops=0,  # self-speculative decoding: 0 = off; d = the first d loops (1..K-1) draft, all K verify
    speculative_len=4,          # tokens drafted per full-depth verification (with speculative_draft_loops > 0)
)
SPEC_CHECKS = {"speculative_draft_loops": INT_GE0, "speculative_len": INT_GE1}


@dataclass
class Speculative:
    """A draft depth and length, and what the rounds did (counted over every generate call that uses it)."""
    draft_loops: int
    draft_len: int = 4
    rounds: int = 0    # full-depth verifications
    drafted: int = 0   # tokens drafted
    accepted: int = 0  # drafted tokens kept

    def __post_init__(self):
        if not (isinstance(self.draft_loops, int) and self.draft_loops >= 1 and isinstance(self.draft_len, int)
                and self.draft_len >= 1):
            raise ValueError(f"draft_loops={self.draft_loops!r}, draft_len={self.draft_len!r} is invalid: allowed "
                             "integers >= 1 (draft_loops below the verifier's loops)")

    def loops_per_token(self, K):
        """Loops run per new token: K at every position verified (drafts rejected too) over the tokens kept."""
        return K * (self.drafted + self.rounds) / max(self.accepted + self.rounds, 1)

    def cells(self):
        """bench.py sample's columns: the share of drafted tokens accepted, new tokens per verification."""
        rounds = max(self.rounds, 1)
        return [f"{self.accepted / max(self.drafted, 1):.1%}", round((self.accepted + self.rounds) / rounds, 2)]

    def summary(self):
        rate = self.accepted / self.drafted if self.drafted else 0.0
        return (f"speculative (draft {self.draft_loops} loops, {self.draft_len} tokens): {rate:.1%} of "
                f"{self.drafted} drafted tokens accepted, {self.accepted / max(self.rounds, 1):.2f} per verification "
                f"(+1 the verifier's own) over {self.rounds} verifications")


def spec_option(draft_loops, length, model, n_loop=None, exits=None, use_cache=True):
    """Speculative for the scripts' keys (None when speculative_draft_loops is 0); one ConfigError line for a length
    with speculative decoding off, a draft as deep as the verifier, exits beside it, or no cache."""
    K = n_loop or model.config.n_loop
    if not draft_loops:
        if int(length) != SPEC_KEYS["speculative_len"]:
            raise ConfigError(f"speculative_len={length!r} has no effect with speculative decoding off: "
                              f"speculative_draft_loops=1..{max(K - 1, 1)} turns it on")
        return None
    if K < 2:
        raise ConfigError(f"speculative_draft_loops={draft_loops} needs at least 2 loops, to draft with fewer: "
                          f"n_loop={K}")
    if int(draft_loops) >= K:
        raise ConfigError(f"speculative_draft_loops={draft_loops} is invalid with {K} loops: allowed 0 (off) or "
                          f"1..{K - 1}, fewer loops than the verifier")
    if exits is not None:
        raise ConfigError(f"speculative_draft_loops={draft_loops} verifies every token at full depth: it does not "
                          f"combine with exit_rule={exits.rule!r} (allowed exit_rule='' beside it)")
    if not use_cache:
        raise ConfigError(f"speculative_draft_loops={draft_loops} reuses the (loop, layer) cache: allowed "
                          "use_cache=True beside it")
    return Speculative(int(draft_loops), int(length))


def probs(logits, temperature, top_k=None):
    """GPT.generate's sampling distribution of float logits (..., V): / temperature, the top_k likeliest, softmax."""
    logits = logits / temperature
    if top_k:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits.softmax(-1)


def draft(model, cache, pending, n, d, pick):
    """Run `pending` and n drafted tokens through loops 1..d, one at a time (their keys and values go into those
    loops' caches, as the full model makes them): (the n + 1 tokens, the draft's n distributions (None each when
    greedy), loop d's output (1, n + 1, d_model) and its input (None when d = 1: the embedding, see verify))."""
    toks, qs, hs, xs = [int(pending)], [], [], []

    def keep(k, h, x_next):  # loop d's output, and what fed loop d (PonderLM's update reads it)
        if k == d:
            hs.append(h)
        elif k == d - 1:
            xs.append(x_next)
    for j in range(n + 1):
        out = model.hidden(pending.new_tensor([[toks[-1]]]), n_loop=d, cache=cache, hook=keep)
        if j < n:  # the last token is only run through loops 1..d, for the verifier
            tok, q = pick(model.head(out[:, -1]).float()[0])
            toks.append(tok)
            qs.append(q)
    return toks, qs, torch.cat(hs, dim=1), torch.cat(xs, dim=1) if xs else None


def verify(model, cache, toks, h, x, t0, d, K):
    """The full-depth final states of `toks` (positions t0..) from loop d's output h and input x: GPT.hidden's loops
    d+1..K (their caches get these positions now) and the coda (its draft keys and values are cut first)."""
    cfg, rec = model.config, model.rec
    emb, pos = model.embed(torch.tensor([toks], device=h.device), t0)
    x = emb if x is None else x  # loop 1's input: only PonderLM's update reads it, and PonderLM has no prelude
    for k in range(d, K + 1):
        if k > d:  # hidden's loop body (k > 1: positions again for PonderLM, or every loop with pos_every_loop)
            again = pos is not None and (rec.embed or cfg.pos_every_loop)
            h = model.f_theta(x + pos if again else x, copy=k - 1 if rec.copies else 0, cache=cache[k - 1])
            if cfg.per_loop_norm:
                h = model.transformer.ln_f(h)
        x = h if k == K else model.between(h, x)
    if cfg.n_coda:
        for c in cache[0][cfg.n_layer - cfg.n_coda:]:
            c.crop(t0)
        x = model.f_theta(x, cache=cache[0], part="coda")
    return x


def accept(p, drafted, q, generator=None):
    """(drafted tokens kept, the verifier's next token) from the verifier's (n + 1, V) logits (greedy, q None: keep
    while its argmax agrees) or distributions p and the draft's n distributions q (sampled: keep x with probability
    min(1, p(x)/q(x)); on a rejection sample norm(max(0, p - q)); all kept: sample p's last row). Either way the
    tokens are distributed as the verifier's own."""
    n = len(drafted)
    if q is None:
        best = p.argmax(-1).tolist()
        a = next((j for j in range(n) if best[j] != drafted[j]), n)
        return a, best[a]
    for j, tok in enumerate(drafted):
        if torch.rand((), generator=generator, device=p.device) * q[j][tok] < p[j, tok]:
            continue
        rest = (p[j] - q[j]).clamp_min(0)
        rest = rest if rest.sum() > 0 else p[j]  # p = q up to rounding: a rejection then is p's own sample
        return j, int(torch.multinomial(rest, 1, generator=generator))
    return n, int(torch.multinomial(p[n], 1, generator=generator))


@torch.no_grad()
def generate(model, idx, max_new_tokens, spec, temperature=1.0, top_k=None, n_loop=None, generator=None, n_vocab=None,
             stop=None, cache=None):
    """GPT.generate (same arguments, batch 1) through drafts of spec.draft_loops loops and full-depth verifications:
    greedy (temperature 0) gives its tokens, sampling its distribution. spec counts the rounds; cache (new_cache(K))
    may be passed to see it afterwards: it holds every position but the last, as the full model makes them."""
    K, cfg = n_loop or model.config.n_loop, model.config
    if idx.dim() != 2 or idx.size(0) != 1:
        raise ValueError(f"speculative decoding takes one sequence, idx of shape (1, T), not {tuple(idx.shape)}")
    if not 1 <= spec.draft_loops < K:
        raise ValueError(f"draft_loops={spec.draft_loops} is invalid with {K} loops: allowed 1..{K - 1}")
    if idx.size(1) + max_new_tokens > cfg.block_size:
        raise ValueError(f"prompt ({idx.size(1)} tokens) + max_new_tokens={max_new_tokens} exceeds "
                         f"block_size={cfg.block_size}: shorten the prompt or ask for fewer tokens")
    cache = model.new_cache(K) if cache is None else cache
    if idx.size(1) > 1:  # the prompt but its last token: that one starts the first draft
        model.hidden(idx[:, :-1], n_loop=K, cache=cache)

    def pick(logits):  # a drafted token and the draft's distribution (None: greedy)
        if temperature == 0:
            return int(logits[:n_vocab].argmax()), None
        q = probs(logits[:n_vocab], temperature, top_k)
        return int(torch.multinomial(q, 1, generator=generator)), q
    greedy, left = temperature == 0, max_new_tokens
    while left > 0:
        t0, n = idx.size(1) - 1, min(spec.draft_len, left - 1)  # positions cached; no draft past max_new_tokens
        toks, qs, h, x = draft(model, cache, idx[0, -1], n, spec.draft_loops, pick)
        logits = model.head(verify(model, cache, toks, h, x, t0, spec.draft_loops, K))[0].float()[:, :n_vocab]
        p = logits if greedy else probs(logits, temperature, top_k)
        a, nxt = accept(p, toks[1:], None if greedy else qs, generator)  # qs = [] (nothing drafted) samples too
        spec.rounds, spec.drafted, spec.accepted = spec.rounds + 1, spec.drafted + n, spec.accepted + a
        for c in (c for loop in cache for c in loop):  # every position after the last kept token goes
            c.crop(t0 + 1 + a)
        for tok in toks[1:a + 1] + [nxt]:
            idx, left = torch.cat([idx, idx.new_tensor([[tok]])], dim=1), left - 1
            if stop is not None and stop(idx):
                return idx
    return idx
