"""
Exact self-speculative decoding: a looped model's first loops propose tokens that its K loops then verify, with the
weights, keys and values shared. Two schedules:

draft-then-verify (issue 62, `Speculative`, --speculative_draft_loops=d --speculative_len=L): each round drafts up to L
tokens with loops 1..d one at a time, verifies them with loops d+1..K over all of them at once, keeps the longest
prefix the verifier agrees with plus the verifier's own next token, and cuts every (loop, layer) cache back past a
rejected token.

pipelined (issue 67, `Pipeline`, --speculative_propose=q [--speculative_recheck=q2]; LoopSpec's schedule): every loop
shares its weights, so ONE call of the block stack (GPT.loop_step with one loop per row) advances every position in
flight by one loop: the newest token's loop 1 beside the one before's loop q + 1, and so on. Loop q's readout proposes
the next token, which enters loop 1 in the next call; when a position reaches loop K the proposal after it is judged,
and every lane after a rejected one is dropped (its keys and values are dead: see Lanes). With every proposal kept,
one token is committed per call of one loop instead of K. A second depth q2 judges the proposal again at loop q2 and
replaces it there (the distribution it then has is loop q2's: exact for sampling too, the rule applied twice).

Both are exact: greedy output is GPT.generate's at temperature 0, token for token; sampled output keeps its
distribution (keep a proposed x with probability min(1, p(x)/q(x)), else sample norm(max(0, p - q)): Leviathan et al.
2023, Chen et al. 2023). Loop k at a position reads only loops < k there (loop, disco: H^{k+1} = f(H~^k); ponder:
e^{k+1} = e^k + Phi(h^k), the whole model per pass, which pipelines the same way), so the keys and values the first
loops stored are the full model's. recurrence='none' (K untied copies) drafts-then-verifies only: one call cannot run
two different copies. Proposals read the head after loop q directly (a coda runs on committed positions only).

    python sample.py --ckpt=out/small_disco --speculative_draft_loops=1 --speculative_len=4
    python sample.py --ckpt=out/small_disco --speculative_propose=1
    python bench.py sample config/pretrain_small.py --ckpt=out/small_disco --speculative_propose=1
"""
import functools
import math
import time
from dataclasses import dataclass

import torch

from discoloop.common import ConfigError
from configurator import INT_GE0, INT_GE1
from model import sampling_probs

# the scripts' speculative keys (sample.py, eval_harness.py, bench.py sample), checked once here
SPEC_KEYS = dict(
    speculative_draft_loops=0,  # draft-then-verify: 0 = off; d = the first d loops (1..K-1) draft, all K verify
    speculative_len=4,          # tokens drafted per full-depth verification (with speculative_draft_loops > 0)
    speculative_propose=0,      # pipelined self-speculation: 0 = off; q = loop q's readout proposes (1..K-1)
    speculative_recheck=0,      # pipelined: a second proposal depth q2 (q < q2 < K) that judges again; 0 = none
)
SPEC_CHECKS = {"speculative_draft_loops": INT_GE0, "speculative_len": INT_GE1, "speculative_propose": INT_GE0,
               "speculative_recheck": INT_GE0}


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

    def name(self):
        return f"draft-then-verify (draft {self.draft_loops} loops, {self.draft_len} tokens)"

    def loops_per_token(self, K):
        """Loops run per new token: K at every position verified (drafts rejected too) over the tokens kept."""
        return K * (self.drafted + self.rounds) / max(self.accepted + self.rounds, 1)

    def cells(self):
        """bench.py sample's columns: the share of proposals accepted, new tokens per verification."""
        rounds = max(self.rounds, 1)
        return [f"{self.accepted / max(self.drafted, 1):.1%}", round((self.accepted + self.rounds) / rounds, 2)]

    def summary(self):
        rate = self.accepted / self.drafted if self.drafted else 0.0
        return (f"speculative (draft {self.draft_loops} loops, {self.draft_len} tokens): {rate:.1%} of "
                f"{self.drafted} drafted tokens accepted, {self.accepted / max(self.rounds, 1):.2f} per verification "
                f"(+1 the verifier's own) over {self.rounds} verifications")


@dataclass
class Pipeline:
    """Pipelined self-speculation's proposal depths, and what its calls did (over every generate call)."""
    propose: int       # q: loop q's readout proposes the next token
    recheck: int = 0   # q2: a second proposal depth, 0 = none
    calls: int = 0     # batched calls of the block stack (one loop for every lane in flight)
    lanes: int = 0     # lanes run, summed over the calls (loops applied to one position)
    judged: int = 0    # proposals judged at loop K
    accepted: int = 0  # of those, kept
    rechecked: int = 0  # proposals judged at loop q2
    replaced: int = 0  # of those, replaced there
    committed: int = 0  # tokens committed
    entered: int = 0   # lanes started (proposals and the tokens that replaced rejected ones)
    seconds: float = 0.0  # wall time of the decodes' loops (prompt excluded) ...
    call_seconds: float = 0.0  # ... of which inside the calls (advance); the rest judges and starts lanes

    def between(self):
        """Seconds per call spent between calls (judging, lane starts, bookkeeping): the arithmetic model's own
        term. A device's asynchronous calls move their wait into it (the read back of the argmax)."""
        return (self.seconds - self.call_seconds) / max(self.calls, 1)

    def __post_init__(self):
        if not (isinstance(self.propose, int) and self.propose >= 1 and isinstance(self.recheck, int)
                and (self.recheck == 0 or self.recheck > self.propose)):
            raise ValueError(f"propose={self.propose!r}, recheck={self.recheck!r} is invalid: allowed propose >= 1 "
                             "and recheck 0 (none) or above propose, both below the loops")

    def name(self):
        again = f", again at {self.recheck}" if self.recheck else ""
        return f"pipelined (propose at loop {self.propose}{again})"

    def loops_per_token(self, K):
        """Loops applied per new token: every lane of every call (dropped lanes too) over the tokens committed."""
        return self.lanes / max(self.committed, 1)

    def cells(self):
        """bench.py sample's columns: the share of proposals kept at loop K, tokens committed per call."""
        return [f"{self.accepted / max(self.judged, 1):.1%}", round(self.committed / max(self.calls, 1), 2)]

    def summary(self):
        again = (f"; at loop {self.recheck} {self.replaced} of {self.rechecked} proposals replaced"
                 if self.recheck else "")
        return (f"{self.name()}: {self.accepted / max(self.judged, 1):.1%} of {self.judged} proposals accepted at "
                f"full depth{again}; {self.committed / max(self.calls, 1):.2f} tokens per call over {self.calls} "
                f"calls, {self.lanes / max(self.calls, 1):.2f} lanes per call")


def spec_option(draft_loops, length, model, n_loop=None, exits=None, use_cache=True, propose=0, recheck=0):
    """Speculative, Pipeline or None for the scripts' keys; one ConfigError line for a key with its decoder off, both
    decoders at once, a proposal as deep as the verifier, exits beside it, no cache, or 'none' pipelined."""
    K = n_loop or model.config.n_loop
    if not draft_loops and int(length) != SPEC_KEYS["speculative_len"]:
        raise ConfigError(f"speculative_len={length!r} has no effect with speculative_propose={propose}: the pipelined "
                          "decoder has no draft length (speculative_len is speculative_draft_loops'): drop it"
                          if propose else f"speculative_len={length!r} has no effect with speculative decoding off: "
                          f"speculative_draft_loops=1..{max(K - 1, 1)} turns it on")
    if not propose and recheck:
        raise ConfigError(f"speculative_recheck={recheck!r} has no effect without pipelining: "
                          f"speculative_propose=1..{max(K - 1, 1)} turns it on")
    if draft_loops and propose:
        raise ConfigError(f"speculative_draft_loops={draft_loops} and speculative_propose={propose} are two decoders: "
                          "allowed one of them (the other 0)")
    if not (draft_loops or propose):
        return None
    key, depth = ("speculative_draft_loops", draft_loops) if draft_loops else ("speculative_propose", propose)
    if K < 2:
        raise ConfigError(f"{key}={depth} needs at least 2 loops, to propose with fewer: n_loop={K}")
    if int(depth) >= K:
        raise ConfigError(f"{key}={depth} is invalid with {K} loops: allowed 0 (off) or 1..{K - 1}, fewer loops "
                          "than the verifier")
    if recheck and not int(propose) < int(recheck) < K:
        raise ConfigError(f"speculative_recheck={recheck} is invalid with speculative_propose={propose} and {K} "
                          f"loops: allowed 0 (none)" + (f" or {int(propose) + 1}..{K - 1}" if int(propose) + 1 < K else
                                                        ": no loop lies between the proposal's and the verifier's"))
    if exits is not None:
        raise ConfigError(f"{key}={depth} verifies every token at full depth: it does not combine with "
                          f"exit_rule={exits.rule!r} (allowed exit_rule='' beside it)")
    if not use_cache:
        raise ConfigError(f"{key}={depth} reuses the (loop, layer) cache: allowed use_cache=True beside it")
    if draft_loops and model.config.kv_share:  # its drafts and verifications write a slot's positions out of order
        raise ConfigError(f"speculative_draft_loops={draft_loops} keeps a cache per (loop, layer): with "
                          f"kv_share={model.config.kv_share!r} use speculative_propose (the pipelined decoder) instead")
    if model.config.kv_share == "latest":  # lanes in flight write loops out of order: 'latest' would differ from plain
        raise ConfigError(f"{key}={depth} with kv_share='latest': a position's latest loop depends on what is in "
                          "flight, so greedy output would not equal plain decoding: allowed kv_share '' or 'first'")
    if propose and model.rec.copies:
        raise ConfigError(f"speculative_propose={propose} runs every loop in one call of shared blocks: "
                          "recurrence='none' has K untied copies (allowed speculative_draft_loops instead)")
    return Speculative(int(draft_loops), int(length)) if draft_loops else Pipeline(int(propose), int(recheck))


def judge(p, tok, q, generator=None):
    """One proposed token against the verifier's row: greedy (q None, p logits) keeps it when it is p's argmax, else
    gives the argmax; sampled (p, q distributions) keeps it with probability min(1, p(tok)/q(tok)), else samples
    norm(max(0, p - q)). Returns (kept, the token that stands); either way distributed as p."""
    if q is None:
        best = int(p.argmax())
        return best == tok, best
    if torch.rand((), generator=generator, device=p.device) * q[tok] < p[tok]:
        return True, tok
    rest = (p - q).clamp_min(0)
    rest = rest if rest.sum() > 0 else p  # p = q up to rounding: a rejection then is p's own sample
    return False, int(torch.multinomial(rest, 1, generator=generator))


def accept(p, drafted, q, generator=None):
    """(drafted tokens kept, the verifier's next token) from the verifier's (n + 1, V) logits (greedy, q None) or
    distributions p and the draft's n distributions q (sampled): judge each in turn; all kept: p's last row's."""
    for j, tok in enumerate(drafted):
        kept, nxt = judge(p[j], tok, None if q is None else q[j], generator)
        if not kept:
            return j, nxt
    last = p[len(drafted)]
    return len(drafted), int(last.argmax()) if q is None else int(torch.multinomial(last, 1, generator=generator))


def enter(model, tok, t, layers):
    """Token `tok` at position t as loop 1 reads it, and its learned positions (or None); the prelude's keys and
    values go into `layers` (loop 1's cache of every layer: GPT.hidden's start for one position)."""
    x, pos = model.embed(torch.tensor([[tok]], device=model.lm_head.weight.device), t)
    if model.config.n_prelude:
        x = model.f_theta(x, cache=layers, part="prelude")
    return x, pos


def draft(model, cache, pending, t0, n, d, K, pick):
    """Run `pending` (position t0) and n drafted tokens through loops 1..d one at a time (their keys and values go
    into those loops' caches, as the full model makes them): (the n + 1 tokens, the draft's n distributions (None
    each when greedy), what loop d + 1 reads (1, n + 1, d_model))."""
    toks, qs, xs = [int(pending)], [], []
    for j in range(n + 1):
        x, pos = enter(model, toks[-1], t0 + j, cache[0])
        for k in range(1, d + 1):
            h, x = model.loop_step(k, x, pos, cache[k - 1], K)
        xs.append(x)
        if j < n:  # the last token is only run through loops 1..d, for the verifier
            tok, q = pick(model.head(h[:, -1]).float()[0])
            toks.append(tok)
            qs.append(q)
    return toks, qs, torch.cat(xs, dim=1)


def verify(model, cache, toks, x, t0, d, K):
    """The full-depth final states of `toks` (positions t0..) from what loop d + 1 reads: loops d+1..K over all of
    them (their caches get these positions now), then the coda."""
    pos = model.embed(torch.tensor([toks], device=x.device), t0)[1]
    for k in range(d + 1, K + 1):
        x = model.loop_step(k, x, pos, cache[k - 1], K)[1]
    if model.config.n_coda:
        x = model.f_theta(x, cache=cache[0], part="coda")
    return x


def check(model, idx, max_new_tokens, K, depth, recheck=0):
    if recheck and not depth < recheck < K:
        raise ValueError(f"recheck={recheck} is invalid with propose={depth} and {K} loops: allowed 0 or "
                         f"{depth + 1}..{K - 1}")
    if idx.dim() != 2 or idx.size(0) != 1:
        raise ValueError(f"speculative decoding takes one sequence, idx of shape (1, T), not {tuple(idx.shape)}")
    if not 1 <= depth < K:
        raise ValueError(f"draft_loops={depth} is invalid with {K} loops: allowed 1..{K - 1}")
    if idx.size(1) + max_new_tokens > model.config.block_size:
        raise ValueError(f"prompt ({idx.size(1)} tokens) + max_new_tokens={max_new_tokens} exceeds "
                         f"block_size={model.config.block_size}: shorten the prompt or ask for fewer tokens")


@torch.no_grad()
def generate(model, idx, max_new_tokens, spec, temperature=1.0, top_k=None, n_loop=None, generator=None, n_vocab=None,
             stop=None, cache=None):
    """GPT.generate (same arguments, batch 1) through spec's decoder (a Pipeline: pipelined; a Speculative: drafts of
    spec.draft_loops loops and full-depth verifications): greedy (temperature 0) gives its tokens, sampling its
    distribution. spec counts what it did; cache (new_cache(K); a Pipeline: a list of Lanes) may be passed to see it
    afterwards: it holds every position but the last, as the full model makes them."""
    if isinstance(spec, Pipeline):
        return pipelined(model, idx, max_new_tokens, spec, temperature, top_k, n_loop, generator, n_vocab, stop, cache)
    K = n_loop or model.config.n_loop
    check(model, idx, max_new_tokens, K, spec.draft_loops)
    cache = model.new_cache(K) if cache is None else cache
    if idx.size(1) > 1:  # the prompt but its last token: that one starts the first draft
        model.hidden(idx[:, :-1], n_loop=K, cache=cache)

    def pick(logits):  # a drafted token and the draft's distribution (None: greedy)
        if temperature == 0:
            return int(logits[:n_vocab].argmax()), None
        q = sampling_probs(logits[:n_vocab], temperature, top_k)
        return int(torch.multinomial(q, 1, generator=generator)), q
    greedy, left = temperature == 0, max_new_tokens
    while left > 0:
        t0, n = idx.size(1) - 1, min(spec.draft_len, left - 1)  # positions cached; no draft past max_new_tokens
        toks, qs, x = draft(model, cache, idx[0, -1], t0, n, spec.draft_loops, K, pick)
        logits = model.head(verify(model, cache, toks, x, t0, spec.draft_loops, K))[0].float()[:, :n_vocab]
        p = logits if greedy else sampling_probs(logits, temperature, top_k)
        a, nxt = accept(p, toks[1:], None if greedy else qs, generator)  # qs = [] (nothing drafted) samples too
        spec.rounds, spec.drafted, spec.accepted = spec.rounds + 1, spec.drafted + n, spec.accepted + a
        for c in (c for loop in cache for c in loop):  # every position after the last kept token goes
            c.crop(t0 + 1 + a)
        for tok in toks[1:a + 1] + [nxt]:
            idx, left = torch.cat([idx, idx.new_tensor([[tok]])], dim=1), left - 1
            if stop is not None and stop(idx):
                return idx
    return idx


class Lanes:
    """One layer's keys and values of every loop for the pipelined decoder: (K, kv heads, positions, head size)
    buffers, row K - k = loop k's (a prelude's and a coda's blocks use loop 1's), each position written in place. A
    call's rows (`at`) are lanes at different loops and positions; each attends to its own loop's keys at positions up
    to its own. Lanes in position order run descending loops, so their rows ascend: an even stride is a view, not a
    copy. A dropped lane's entries need no cut: a lane at position t reads loop k's keys below t only after the live
    lane at each of those positions wrote them (lanes run in position order, each at least a loop behind). The lanes
    of a call are consecutive positions, so what they see is a view of one additive causal mask (`triangle`), built
    once per decode and shared by every layer, not a mask as long as the context built per call."""

    def __init__(self, K, T, share=""):
        self.K, self.T, self.k, self.v, self.tri, self.share = K, T, None, None, None, share

    def at(self, rows, span, where, starts, sees, owner, write=None):
        """This call's rows: buffer rows (B,) (as a slice when evenly spaced, else None), positions (B,) and (B, 1),
        what each sees (a slice of the owner's triangle's rows when the positions are consecutive, else a (B, 1, 1,
        keys) boolean mask) and the Lanes that holds the triangle. write: the lanes that store their keys and values
        (None: all; kv_share='first': those at loop 1, and every lane reads loop 1's row, rows)."""
        self.rows, self.span, self.where, self.starts, self.sees, self.owner = rows, span, where, starts, sees, owner
        self.writes = write
        return self

    def start(self):
        return self.starts  # (B, 1): each row's own position

    def extend(self, k, v):
        if self.k is None:  # (B, heads, 1, hs) rows: the buffers take their heads, size and dtype
            self.allocate(k)
        if self.writes is None:
            self.k[self.rows, :, self.where] = k[:, :, 0]
            self.v[self.rows, :, self.where] = v[:, :, 0]
        elif len(self.writes):  # kv_share='first': only the lanes at loop 1 write (row K - 1, loop 1's)
            w = self.writes
            self.k[self.K - 1, :, self.where[w]] = k[w, :, 0].transpose(0, 1)
            self.v[self.K - 1, :, self.where[w]] = v[w, :, 0].transpose(0, 1)
        mask = self.sees
        if isinstance(mask, slice):  # consecutive positions: rows of the triangle, a view
            mask = self.owner.triangle(k)[mask, :mask.stop][:, None, None]
        n, rows = mask.size(-1), self.rows if self.span is None else self.span
        return self.k[rows, :, :n], self.v[rows, :, :n], mask

    def triangle(self, k):
        """(T, T) additive causal mask in k's dtype (0 where a row sees a key, -inf where not), made once."""
        if self.tri is None or self.tri.dtype != k.dtype or self.tri.device != k.device:
            hide = torch.ones(self.T, self.T, dtype=torch.bool, device=k.device).triu(1)
            self.tri = torch.zeros(self.T, self.T, dtype=k.dtype, device=k.device).masked_fill(hide, -math.inf)
        return self.tri

    def allocate(self, k):
        shape = (self.K, k.size(1), self.T, k.size(3))
        self.k, self.v = k.new_zeros(shape), k.new_zeros(shape)

    def load(self, cache, n):
        """Take the first n positions of a new_cache's entries for this layer (cache: one KVCache per loop)."""
        for loop, c in enumerate(cache, 1):
            c = getattr(c, "slot", c)  # kv_share: every loop's view of one SharedSlot (loop 1's row is what is read)
            if len(c) if not hasattr(c, "base") else c.k is not None:
                if self.k is None:
                    self.allocate(c.k)
                self.k[self.K - loop, :, :n], self.v[self.K - loop, :, :n] = c.k[0, :, :n], c.v[0, :, :n]

    def entries(self, loop, n):
        """Loop `loop`'s keys and values of the first n positions, (kv heads, n, head size) each."""
        return self.k[self.K - loop, :, :n], self.v[self.K - loop, :, :n]


@functools.lru_cache(maxsize=1024)
def pattern(loops, K, device=None):
    """A call's loops (a tuple) as loop_step takes them (B,), the buffer rows they use (B,) and those rows as a slice
    when evenly spaced (else None): made once per pattern (a decode repeats a few), not per call."""
    rows = [K - k for k in loops]
    step = rows[1] - rows[0] if len(rows) > 1 else 1
    even = step > 0 and all(b - a == step for a, b in zip(rows, rows[1:]))
    span = slice(rows[0], rows[-1] + 1, step) if even else None
    return torch.tensor(loops, device=device), torch.tensor(rows, device=device), span


def rows_at(caches, K, loops, where, device=None):
    """Every layer's Lanes set to one call's rows: lanes at loops (B,) and positions (B,) (python lists). The tensors
    are made once per call (the loops' once per pattern) and shared by the layers."""
    rows, span = pattern(tuple(loops), K, device)[1:]
    write = None
    if caches[0].share == "first":  # every lane reads loop 1's row; the lanes at loop 1 write it
        rows, span = pattern((1,) * len(loops), K, device)[1:]
        write = torch.tensor([i for i, k in enumerate(loops) if k == 1], dtype=torch.long, device=device)
    pos = torch.tensor(where, device=device)
    n = where[-1] + 1
    if all(b - a == 1 for a, b in zip(where, where[1:])):  # the decoder's lanes: consecutive positions
        sees = slice(where[0], n)
    else:
        sees = (torch.arange(n, device=pos.device) <= pos[:, None])[:, None, None]  # (B, 1, 1, keys)
    starts = pos[:, None]
    return [c.at(rows, span, pos, starts, sees, caches[0], write) for c in caches]


@dataclass(eq=False)
class Lane:
    """A position in flight: its token (committed, or proposed and not yet judged), loops done, what the next loop
    reads (1, 1, d), its learned positions (or None) and the distribution its token was proposed from (None: greedy
    or committed)."""
    pos: int
    tok: int
    x: torch.Tensor
    pe: torch.Tensor = None
    q: torch.Tensor = None
    loop: int = 0


def advance(model, run, caches, K, read, device):
    """One call: every lane in `run` one loop further (GPT.loop_step, a row per lane, each at its own loop); the
    indices of the lanes now at a loop in `read` and their head's float logits (the one done with loop K first, after
    the coda)."""
    loops = [a.loop + 1 for a in run]
    pe = torch.cat([a.pe for a in run]) if run[0].pe is not None else None
    x = torch.cat([a.x for a in run])  # (lanes, 1, d)
    h, x_next = model.loop_step(pattern(tuple(loops), K, device)[0], x, pe,
                                rows_at(caches, K, loops, [a.pos for a in run], device), K)
    for i, a in enumerate(run):
        a.loop, a.x = a.loop + 1, x_next[i:i + 1]
    reads = [i for i, a in enumerate(run) if a.loop in read]
    adjacent = reads and reads[-1] - reads[0] == len(reads) - 1
    hr = h[reads[0]:reads[-1] + 1] if adjacent else h[reads]  # a view when adjacent (the usual case), no gather
    if model.config.n_coda and run[0].loop == K:  # the position done with its loops passes the coda
        coda = model.f_theta(hr[:1], cache=rows_at(caches, K, [1], [run[0].pos], device), part="coda")
        hr = torch.cat([coda, hr[1:]])
    return reads, model.head(hr)[:, 0].float()


def prefill(model, idx, K, caches):
    """The prompt but its last token through every loop at once (GPT.hidden), into the Lanes `caches`."""
    if idx.size(1) > 1:
        first = model.new_cache(K)
        model.hidden(idx[:, :-1], n_loop=K, cache=first)
        for i, c in enumerate(caches):
            c.load([loop[i] for loop in first], idx.size(1) - 1)
    return caches


@torch.no_grad()
def pipelined(model, idx, max_new_tokens, pipe, temperature=1.0, top_k=None, n_loop=None, generator=None, n_vocab=None,
              stop=None, cache=None):
    """GPT.generate (batch 1) through pipelined self-speculation: one GPT.loop_step call per step over every lane in
    flight, each at its own loop (recurrence='none' is refused there). See the module's docstring and generate."""
    cfg, K = model.config, n_loop or model.config.n_loop
    check(model, idx, max_new_tokens, K, pipe.propose, pipe.recheck)
    out, end, device = idx[0].tolist(), idx.size(1) + max_new_tokens, idx.device
    caches = prefill(model, idx, K, cache if cache is not None else [Lanes(K, end, cfg.kv_share)
                                                                     for _ in range(cfg.n_layer)])
    greedy = temperature == 0

    def dist(logits):  # what a row decides from: its logits (greedy) or the sampling distribution
        return logits if greedy else sampling_probs(logits, temperature, top_k)

    def lane(tok, pos, q=None):
        pipe.entered += 1
        layers = rows_at(caches, K, [1], [pos], device) if cfg.n_prelude else None  # the prelude's keys, if any
        x, pe = enter(model, tok, pos, layers)
        return Lane(pos, tok, x, None if pe is None else pe.view(1, 1, -1), q)
    lanes, began = [lane(out[-1], len(out) - 1)], time.perf_counter()
    while len(out) < end:
        run = [a for a in lanes if a.pos <= end - 2]  # a lane past that only holds a proposal for the one before
        pipe.calls, pipe.lanes = pipe.calls + 1, pipe.lanes + len(run)
        t = time.perf_counter()
        reads, rows = advance(model, run, caches, K, (pipe.propose, pipe.recheck, K), device)
        pipe.call_seconds += time.perf_counter() - t
        rows = rows[:, :n_vocab]
        best = rows.argmax(-1).tolist() if greedy else None  # greedy: one read back to the host per call
        for j, (i, logits) in enumerate(zip(reads, rows)):
            a = run[i]
            if a not in lanes:  # dropped by a rejection before it in this call
                continue
            after = lanes[lanes.index(a) + 1] if lanes[-1] is not a else None
            if a.loop == K or a.loop == pipe.recheck:  # judge the proposal after it
                p = dist(logits)
                kept, tok = (best[j] == after.tok, best[j]) if greedy else judge(p, after.tok, after.q, generator)
                if a.loop == K:
                    pipe.judged, pipe.accepted = pipe.judged + 1, pipe.accepted + kept
                else:
                    pipe.rechecked, pipe.replaced = pipe.rechecked + 1, pipe.replaced + (not kept)
                if not kept:  # every lane from the rejected one on goes
                    del lanes[lanes.index(after):]
                    after = lane(tok, a.pos + 1)
                    lanes.append(after)
                after.q = None if greedy or a.loop == K else p  # from here on its token is loop q2's sample
                if a.loop == K:
                    lanes.remove(a)
                    out.append(tok)
                    pipe.committed += 1
                    if stop is not None and stop(idx.new_tensor([out])):
                        end = len(out)  # the loop ends here (one way out: the clock stops)
                        break
            elif a.pos + 1 < end:  # loop q proposes the token after it
                p = dist(logits)
                tok = best[j] if greedy else int(torch.multinomial(p, 1, generator=generator))
                lanes.append(lane(tok, a.pos + 1, None if greedy else p))
    pipe.seconds += time.perf_counter() - began
    return idx.new_tensor([out[:end]])
