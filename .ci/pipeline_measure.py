"""Issue 67's side-by-side measurement at batch 1 on the CPU, one run per checkpoint, each row printed as measured:
plain cached greedy, draft-then-verify, pipelined (q = 1, 2; with and without a second depth), then the cost of one
GPT.loop_step call over n lanes (speculative.Lanes, n = 1..K) against plain's call over one token (a KVCache), and the
arithmetic model's speed-up beside the measured one.

    python .ci/pipeline_measure.py RUN [RUN ...] [--new_tokens=200] [--threads=1] [--reps=3] [--plain_loops=N]

--plain_loops=N also times plain cached decoding at N < K loops (the fewest of equal quality, chosen from the run's
per-loop validation loss: .ci/arms_measure.py), interleaved with the rest, and states every decoder against it.

Each decoder runs reps times, interleaved with the others, and keeps its fastest (a shared machine's load moves).

The model: a plain token costs t1 (K loop calls of one token, the head, measured alone). Pipelined, with a = the
share of proposals kept at loop K (and b = the share kept at the second depth q2), a token costs E calls,
E = a L + (1 - a) K, the lag L = q (without q2) or b q + (1 - b) q2: a kept proposal's lane is q (or q2) loops behind
the one committed, a rejected one restarts at loop 1. A call over the mean lanes in flight n costs A(n) (one
speculative.advance, its head read included), interpolated from the measured A(1..K); each lane started costs e (its
embedding), s lanes per token. What the decoder does between its calls (judging the rows read, starting lanes, its
bookkeeping) is a term of its own, j per call, timed inside the decoder (Pipeline.between: its wall time less its
calls'); e is then in j. Predicted speed-up: t1 / (E (A(n) + j)). Beside it, a call inside the decoder (its calls'
seconds over their number) against A(n) timed alone: the same call, so they should agree.
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run_args, from any folder
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo
from discoloop.checkpoint import load_checkpoint  # noqa: E402
from discoloop.common import ERRORS  # noqa: E402
from run_args import refuse, runs_and_options  # noqa: E402
from discoloop.from_checkpoint import model_from_checkpoint  # noqa: E402
from discoloop import speculative  # noqa: E402
from discoloop.speculative import Lane, Lanes, Pipeline, Speculative, rows_at  # noqa: E402

args, opts = runs_and_options(__doc__, __file__, {"new_tokens": 200, "threads": 1, "reps": 3, "plain_loops": ""})
N, threads, reps = opts["new_tokens"], opts["threads"], opts["reps"]
if not (opts["plain_loops"] == "" or opts["plain_loops"].isdecimal() and int(opts["plain_loops"]) >= 1):
    refuse(__file__, f"--plain_loops={opts['plain_loops']!r} is invalid: allowed a whole number >= 1 below each run's K")
FEW = int(opts["plain_loops"] or 0)
torch.set_num_threads(threads)


def timed(fn, reps):
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def call_costs(model, ctx, reps=200):
    """Seconds of one loop_step (plain's: one token, a KVCache per layer, ctx cached; and over n = 1..K lanes), of one
    plain token (GPT.hidden through K loops, the head, the argmax), of one pipelined call (speculative.advance over
    n = 1..K lanes at consecutive loops, its head read included) and of a lane's start (the embedding)."""
    K, d = model.config.n_loop, model.config.n_embd
    with torch.no_grad():
        cache = model.new_cache(K)
        model.hidden(torch.randint(0, model.config.vocab_size, (1, ctx)), cache=cache)
        x, tok = torch.randn(1, 1, d), torch.tensor([[1]])

        def crop():
            for c in (c for loop in cache for c in loop):
                c.crop(ctx)

        def plain():
            model.loop_step(2, x, None, cache[1], K)
            crop()

        def token():
            model.head(model.hidden(tok, cache=cache)[:, -1]).float().argmax(-1)
            crop()
        c1, t1 = timed(plain, reps), timed(token, reps)
        lanes = [Lanes(K, ctx + K + 1, model.config.kv_share) for _ in range(model.config.n_layer)]
        for i, c in enumerate(lanes):
            c.load([loop[i] for loop in cache], ctx)
        cn, an = [], []
        for n in range(1, K + 1):
            loops, where = list(range(K, K - n, -1)), list(range(ctx, ctx + n))
            xs, ks = torch.randn(n, 1, d), torch.tensor(loops)
            cn.append(timed(lambda: model.loop_step(ks, xs, None, rows_at(lanes, K, loops, where), K), reps))
            run = [Lane(p, 1, torch.randn(1, 1, d)) for p in where]

            def call():
                for a, k in zip(run, loops):
                    a.loop = k - 1
                speculative.advance(model, run, lanes, K, (1, K), None)
            an.append(timed(call, reps))
        e = timed(lambda: speculative.enter(model, 1, ctx, rows_at(lanes, K, [1], [ctx])), reps)
    return c1, cn, t1, an, e


def row(*cells):
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


PROMPT = 16  # random prompt tokens before the measured ones


def opened(run):
    """The run's model, or one line (before any run is measured) for what cannot be pipelined or does not fit."""
    try:
        model = model_from_checkpoint(load_checkpoint(run)).eval()
    except ERRORS as e:
        refuse(__file__, e)
    cfg = model.config
    if model.rec.copies or cfg.n_loop < 2:
        refuse(__file__, f"{run!r} has recurrence={cfg.recurrence!r}, n_loop={cfg.n_loop}: pipelining needs a loop of "
                         "shared blocks run at least twice (recurrence 'loop', 'disco' or 'ponder', n_loop >= 2)")
    if FEW and not FEW < cfg.n_loop:
        refuse(__file__, f"--plain_loops={FEW} is invalid for {run!r} (K={cfg.n_loop}): allowed 1..{cfg.n_loop - 1}")
    if PROMPT + N > cfg.block_size:
        room = cfg.block_size - PROMPT
        refuse(__file__, f"--new_tokens={N} after the {PROMPT}-token prompt needs block_size >= {PROMPT + N}, and "
                         f"{run!r} has {cfg.block_size}: " + (f"allowed --new_tokens=1..{room}" if room > 0 else
                                                               "its window is too short to time decoding"))
    return model


models = [(run, opened(run)) for run in args]
for run, model in models:
    K = model.config.n_loop
    torch.manual_seed(0)
    x = torch.randint(0, model.config.vocab_size, (1, PROMPT))
    print(f"\n{run}: {model.rec.label}, K={K}, {N} new tokens after a {PROMPT}-token random prompt, greedy, fp32, "
          f"threads {threads}", flush=True)
    row("decoder", "seconds", "tokens/s", "vs plain", "tokens/call", "proposals accepted", "lanes/call",
        "= plain greedy", "call in decoder / A(n) alone (ms)", "between calls j (ms)", "predicted", "pred/meas")
    row(*["---"] * 12)
    model.generate(x, 4, temperature=0)
    decoders = [None, Speculative(1, 2), Speculative(3, 4), Pipeline(1), Pipeline(2)] + (["fewer"] if FEW else [])
    decoders += [Pipeline(1, q2) for q2 in range(2, K)] + [Pipeline(2, q2) for q2 in range(3, K)]
    decoders = [d for d in decoders if d in (None, "fewer") or (d.propose if isinstance(d, Pipeline) else d.draft_loops) < K]
    if model.config.kv_share:  # draft-then-verify keeps a cache per (loop, layer): speculative.spec_option
        decoders = [d for d in decoders if not isinstance(d, Speculative)]
    best, got, costs, kept = [float("inf")] * len(decoders), [None] * len(decoders), [], list(decoders)
    for rep in range(reps):  # interleaved, the fastest of each: the load of a shared machine moves during a run
        for i, dec in enumerate(decoders):
            if dec == "fewer":  # plain cached decoding at FEW loops (its own tokens: a shallower model's)
                t = time.perf_counter()
                got[i] = model.generate(x, N, temperature=0, n_loop=FEW)
                best[i] = min(best[i], time.perf_counter() - t)
                continue
            if dec is not None:  # counters of the last repetition only (greedy: every repetition is the same)
                decoders[i] = dec = type(dec)(*([dec.draft_loops, dec.draft_len] if isinstance(dec, Speculative)
                                                else [dec.propose, dec.recheck]))
            t = time.perf_counter()
            got[i] = (model.generate(x, N, temperature=0) if dec is None else
                      speculative.generate(model, x, N, dec, temperature=0))
            took = time.perf_counter() - t
            if took < best[i]:  # the fastest repetition's counters and clocks
                best[i], kept[i] = took, dec
        costs.append(call_costs(model, 16 + N // 2))
    c1, cn, t1, an, e = [[min(c[j][n] for c in costs) for n in range(K)] if j in (1, 3) else min(c[j] for c in costs)
                         for j in range(5)]
    fewer = best[decoders.index("fewer")] if FEW else None
    plain, want = best[0], got[0]
    row("plain cached", round(plain, 3), round(N / plain, 1), "1.00", f"{1 / K:.2f}", "-", 1, "100%", "-", "-", "-",
        "-")
    if FEW:
        row(f"plain cached, {FEW} loops", round(fewer, 3), round(N / fewer, 1), f"{plain / fewer:.2f}", "-", "-", 1,
            "-", "-", "-", "-", "-")
    for dec, sec, out in zip(kept[1:], best[1:], got[1:]):
        if dec == "fewer":
            continue
        same = f"{(out == want).float().mean():.0%}"
        if isinstance(dec, Speculative):
            row(dec.name(), round(sec, 3), round(N / sec, 1), f"{plain / sec:.2f}", "-", dec.cells()[0], "-", same,
                "-", "-", "-", "-")
            continue
        a = dec.accepted / max(dec.judged, 1)
        b = 1 - dec.replaced / max(dec.rechecked, 1)
        lag = dec.propose if not dec.recheck else b * dec.propose + (1 - b) * dec.recheck
        E = a * lag + (1 - a) * K
        n = dec.lanes / dec.calls
        lo = min(int(n), K - 1)
        cost = an[lo - 1] + (n - lo) * (an[lo] - an[lo - 1])
        j = dec.between()
        pred = t1 / (E * (cost + j))
        row(dec.name(), round(sec, 3), round(N / sec, 1), f"{plain / sec:.2f}", f"{dec.committed / dec.calls:.2f}",
            f"{a:.1%}" + (f" (at {dec.recheck}: {b:.1%})" if dec.recheck else ""), f"{n:.2f}", same,
            f"{dec.call_seconds / dec.calls * 1e3:.3f} / {cost * 1e3:.3f}", f"{j * 1e3:.3f}", f"{pred:.2f}",
            f"{pred / (plain / sec):.2f}")
    if FEW:  # the rule: a speed-up is stated against plain decoding at the fewest loops of equal quality
        print(f"against plain cached at {FEW} loops ({N / fewer:.1f} tokens/s): " + ", ".join(
            f"{d.name()} {fewer / s:.2f}x" for d, s in zip(kept[1:], best[1:]) if isinstance(d, Pipeline)), flush=True)
    print(f"one loop_step call at {16 + N // 2} positions cached: plain (one token, KVCache) {c1 * 1e3:.3f} ms; "
          + ", ".join(f"{n + 1} lanes {c * 1e3:.3f} ms ({c / c1:.2f}x)" for n, c in enumerate(cn))
          + f"; a plain token {t1 * 1e3:.3f} ms; a pipelined call (advance) over 1..{K} lanes "
          + ", ".join(f"{c * 1e3:.3f}" for c in an) + f" ms; a lane's start {e * 1e3:.3f} ms", flush=True)
