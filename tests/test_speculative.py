"""Exact self-speculative decoding (speculative.py, issue 62) on random float64 models: greedy is GPT.generate's
output token for token for every recurrence, draft depth and length (block_size, max_new_tokens and stop included);
the caches cut back after rejections equal freshly built ones; sampling keeps the target distribution (enumerated
exactly on a tiny vocabulary); the scripts take the keys; bad input is one line."""
import math
from dataclasses import asdict

import pytest
import torch

from discoloop import speculative
from discoloop.checkpoint import save_checkpoint
from discoloop.common import ConfigError
from conftest import run
from model import GPT, Exit, GPTConfig, sampling_probs
from discoloop.speculative import Lanes, Pipeline, Speculative, accept, spec_option
from test_cli import one_line
from discoloop.tokenizer import get_encoding, record

BLOCK = 24


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Batch-1 decoding of tiny models is Python-bound: one thread each (two under xdist's two workers) is faster."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


CASES = [("none", {}), ("loop", {}), ("loop", {"pos_emb": "learned", "pos_every_loop": True, "per_loop_norm": True}),
         ("disco", {}), ("disco", {"phi_topk": 5}), ("disco", {"disco_gate": "learned"}),
         ("disco", {"disco_gate": "learned", "phi_topk": 4, "pos_emb": "learned", "sandwich_norm": True}),
         ("disco", {"n_layer": 3, "n_prelude": 1, "n_coda": 1}),
         ("ponder", {}),
         ("ponder", {"pos_emb": "learned", "ponder_scale_embeds": True, "ponder_multiply_steps": True, "phi_topk": 6})]
IDS = [r + "-" + "-".join(f"{k}={v}" for k, v in kw.items()) for r, kw in CASES]


def make(recurrence, scale=4.0, emb=0.3, **kw):
    """A float64 model whose loops change its mind (a draft is often wrong): matrices ~ N(0, scale^2 / fan_in), small
    embeddings (a tied head would otherwise read back its input token after every loop), perturbed norms and gate."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**dict(block_size=BLOCK, vocab_size=23, n_layer=2, n_head=2, n_embd=16,
                                    recurrence=recurrence, n_loop=3), **kw})).double().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, emb if n.startswith("transformer.w") else scale / p.size(-1) ** 0.5)
            else:
                p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("recurrence,kw", CASES, ids=IDS)
def test_greedy_is_generate_token_for_token(recurrence, kw):
    """Up to block_size (4 + 20 = 24): every draft depth below K = 3 and several draft lengths, drafts accepted and
    rejected (caches cut back) in each."""
    model = make(recurrence, **kw)
    prompt = torch.randint(0, 23, (1, 4), generator=torch.Generator().manual_seed(1))
    want = model.generate(prompt, BLOCK - 4, temperature=0)
    for d, n in ((1, 1), (1, 4), (2, 3)):
        spec = Speculative(d, n)
        got = speculative.generate(model, prompt, BLOCK - 4, spec, temperature=0)
        assert torch.equal(got, want), (d, n, got, want)
        assert spec.accepted + spec.rounds == BLOCK - 4 and 0 < spec.accepted < spec.drafted, spec


@pytest.mark.parametrize("for_stop,for_short", [(lambda: Speculative(1, 5), lambda: Speculative(2, 3)),
                                                   (lambda: Pipeline(1, 2), lambda: Pipeline(1))],
                         ids=["draft-then-verify", "pipelined"])
def test_stop_max_new_tokens_and_short_prompts(for_stop, for_short):
    """stop ends it at the same token (mid-round too); one new token; a one-token prompt; n_loop past K and a
    tokenizer's n_vocab below the model's rows: each decoder as plain greedy generation."""
    model = make("disco", phi_topk=5)
    prompt = torch.tensor([[3, 7, 1]])
    full = model.generate(prompt, 18, temperature=0)
    for at in (4, 9, 13):
        def stop(y, tok=int(full[0, at])):
            return int(y[0, -1]) == tok
        assert torch.equal(speculative.generate(model, prompt, 18, for_stop(), temperature=0, stop=stop),
                           model.generate(prompt, 18, temperature=0, stop=stop))
    for p, n, kw in ((prompt, 1, {}), (prompt[:, :1], 12, {}), (prompt, 12, {"n_loop": 5}),
                     (prompt, 12, {"n_vocab": 9})):
        assert torch.equal(speculative.generate(model, p, n, for_short(), temperature=0, **kw),
                           model.generate(p, n, temperature=0, **kw)), (p, n, kw)


@pytest.mark.parametrize("recurrence,kw", [CASES[0], CASES[2], CASES[6], CASES[7], CASES[9]], ids=IDS[0:1] + IDS[2:3] +
                         IDS[6:8] + IDS[9:10])
def test_the_cache_cut_back_is_a_fresh_one(recurrence, kw):
    """After rounds with rejected drafts, every (loop, layer) cache (prelude, coda and the draft's loops included)
    holds what one full-depth forward over the same tokens stores."""
    model = make(recurrence, **kw)
    spec, cache = Speculative(1, 4), model.new_cache()
    out = speculative.generate(model, torch.tensor([[5, 2, 9]]), 16, spec, temperature=0, cache=cache)
    assert spec.accepted < spec.drafted, "no draft was rejected: nothing was cut back"
    fresh = model.new_cache()
    with torch.no_grad():
        model.hidden(out[:, :-1], cache=fresh)
    for k, (loop, ref) in enumerate(zip(cache, fresh)):
        for i, (a, b) in enumerate(zip(loop, ref)):
            assert len(a) == len(b), (k, i, len(a), len(b))
            if len(b):
                torch.testing.assert_close((a.k, a.v), (b.k, b.v), rtol=0, atol=1e-10)


def chi2_bound(df, delta=1e-6):
    """Laurent-Massart: P(chi2_df >= df + 2 sqrt(df x) + 2x) <= exp(-x), x = ln(1/delta)."""
    x = math.log(1 / delta)
    return df + 2 * math.sqrt(df * x) + 2 * x


def pearson(counts, target, n):
    """(Pearson's statistic, its degrees of freedom) over cells expected >= 5 times, the rest pooled in one cell."""
    exp, big = target.flatten() * n, target.flatten() * n >= 5
    obs = counts.flatten()
    o = torch.cat([obs[big], obs[~big].sum()[None]])
    e = torch.cat([exp[big], exp[~big].sum()[None]])
    keep = e > 0
    return float(((o - e)[keep] ** 2 / e[keep]).sum()), int(keep.sum()) - 1


def test_the_accept_rule_keeps_the_distribution():
    """accept() alone, two drafts from a draft q very unlike the target p: the first two tokens kept (the second
    sampled from p after a first-token rejection) are distributed as p, not as q (Pearson, exact bound)."""
    g, V, N = torch.Generator().manual_seed(0), 4, 20000
    p0, q0 = torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([0.55, 0.05, 0.3, 0.1])
    P1, Q1 = torch.rand(V, V, generator=g).softmax(-1), torch.eye(V) * 0.7 + 0.075  # q: the second repeats the first
    P2 = torch.rand(V, V, V, generator=g).softmax(-1)
    counts = torch.zeros(V, V)
    for _ in range(N):
        x0 = int(torch.multinomial(q0, 1, generator=g))
        x1 = int(torch.multinomial(Q1[x0], 1, generator=g))
        a, nxt = accept(torch.stack([p0, P1[x0], P2[x0, x1]]), [x0, x1], torch.stack([q0, Q1[x0]]), g)
        kept = ([x0, x1][:a] + [nxt])[:2]
        if len(kept) == 1:  # the next round would give the second token: the verifier's own distribution
            kept.append(int(torch.multinomial(P1[kept[0]], 1, generator=g)))
        counts[kept[0], kept[1]] += 1
    target = p0[:, None] * P1
    stat, df = pearson(counts, target, N)
    assert stat < chi2_bound(df), (stat, df)
    wrong, _ = pearson(q0[:, None] * P1 * N, target, N)  # keeping every draft: its expected statistic
    assert wrong > 5 * chi2_bound(df)


def sampled_dist(model, prompt, n_loop, temperature, top_k):
    with torch.no_grad():
        return sampling_probs(model(prompt, n_loop=n_loop)[0][0, -1].float(), temperature, top_k)


@pytest.mark.parametrize("temperature,top_k", [(1.0, None), (0.7, 3)])
def test_sampling_keeps_the_distribution(temperature, top_k):
    """speculative.generate itself, V = 5, two new tokens (a draft of one, then the verifier's next): the pairs it
    samples follow the target's exact distribution (enumerated), which the draft's own differs from."""
    model = make("loop", vocab_size=5, n_layer=1, n_embd=8, block_size=8)
    prompt, V, N = torch.tensor([[1, 3]]), 5, 1500
    p1, q1 = (sampled_dist(model, prompt, n, temperature, top_k) for n in (None, 1))
    p2 = torch.stack([sampled_dist(model, torch.tensor([[1, 3, a]]), None, temperature, top_k) for a in range(V)])
    target = p1[:, None] * p2
    g, spec, counts = torch.Generator().manual_seed(0), Speculative(1, 2), torch.zeros(V, V)
    for _ in range(N):
        out = speculative.generate(model, prompt, 2, spec, temperature=temperature, top_k=top_k, generator=g)
        counts[out[0, 2], out[0, 3]] += 1
    stat, df = pearson(counts, target, N)
    assert stat < chi2_bound(df), (stat, df, counts / N, target)
    assert 0 < spec.accepted < spec.drafted == N  # both branches of the rule ran
    wrong, _ = pearson(q1[:, None] * p2 * N, target, N)  # every draft kept: expected statistic
    assert wrong > 2 * chi2_bound(df), wrong


def test_bad_input_is_one_line():
    model = make("disco")
    x = torch.tensor([[1, 2]])
    for bad, needle in ((lambda: Speculative(0, 4), "draft_loops=0"), (lambda: Speculative(1, 0), "draft_len=0"),
                        (lambda: speculative.generate(model, x, 4, Speculative(3, 2)), "draft_loops=3 is invalid"),
                        (lambda: speculative.generate(model, x.repeat(2, 1), 4, Speculative(1, 2)), "(2, 2)"),
                        (lambda: speculative.generate(model, x, 23, Speculative(1, 2)), "exceeds block_size=24")):
        with pytest.raises(ValueError, match=None) as e:
            bad()
        assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert spec_option(0, 4, model) is None and spec_option(2, 6, model) == Speculative(2, 6)
    for args, kw, needle in (((0, 8), {}, "speculative_len=8 has no effect with speculative decoding off"),
                             ((3, 4), {}, "allowed 0 (off) or 1..2"),
                             ((2, 4), {"n_loop": 2}, "allowed 0 (off) or 1..1"),
                             ((1, 4), {"exits": Exit("prob", 0.5)}, "exit_rule='prob'"),
                             ((1, 4), {"use_cache": False}, "use_cache=True")):
        with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            spec_option(*args, model, **kw)
    with pytest.raises(ConfigError, match="needs at least 2 loops"):
        spec_option(1, 4, make("loop", n_loop=1))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A random byte-level checkpoint (no training: exactness does not need a trained model)."""
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=64, vocab_size=257, n_layer=1, n_head=2, n_embd=32, n_loop=3, phi_topk=8)
    path = tmp_path_factory.mktemp("spec") / "ckpt.pt"
    save_checkpoint({"model": GPT(cfg).state_dict(), "model_args": asdict(cfg), "data_config": {"encoding": "bytes"},
                     "tokenizer": record(get_encoding({"encoding": "bytes"}))}, str(path))
    return str(path)


def test_sample_py_takes_it(ckpt):
    """Greedy sample.py text is the same with speculative decoding; its acceptance goes to stderr; inert or
    conflicting keys are one line."""
    args = ["sample.py", f"--ckpt={ckpt}", "--start=The cat", "--num_samples=1", "--max_new_tokens=30",
            "--temperature=0", "--threads=1"]
    a, b = run(args), run(args + ["--speculative_draft_loops=2", "--speculative_len=3"])
    assert a.returncode == 0 and b.returncode == 0, a.stderr[-2000:] + b.stderr[-2000:]
    assert a.stdout == b.stdout and "drafted tokens accepted" in b.stderr, b.stderr
    r = run(args[:-2] + ["--temperature=0.8", "--speculative_draft_loops=1", "--threads=1"])
    assert r.returncode == 0 and r.stdout.startswith("The cat"), r.stderr[-2000:]
    for extra, needle in ((["--speculative_len=7"], "speculative_len=7 has no effect"),
                          (["--speculative_draft_loops=3"], "allowed 0 (off) or 1..2"),
                          (["--speculative_draft_loops=1", "--use_cache=False"], "use_cache=True"),
                          (["--speculative_draft_loops=1", "--exit_rule=prob"], "exit_rule='prob'"),
                          (["--speculative_draft_loops=-1"], "speculative_draft_loops=-1")):
        one_line(run(args + extra), needle)


def test_bench_sample_row(ckpt):
    """bench.py sample prints the speculative row beside the cached one, all of its tokens the cached greedy's."""
    r = run(["bench.py", "sample", "config/pretrain_tiny.py", f"--ckpt={ckpt}", "--new_tokens=12", "--prompt=3",
             "--threads=1", "--speculative_draft_loops=1", "--speculative_len=3"])
    assert r.returncode == 0, r.stderr[-2000:]
    row = next(x for x in r.stdout.splitlines() if x.startswith("| speculative (draft 1 loops, 3 tokens) |"))
    assert "| 100.0% |" in row and "tokens/verification" in r.stdout, r.stdout
    one_line(run(["bench.py", "sample", "config/pretrain_tiny.py", f"--ckpt={ckpt}", "--speculative_len=2"]),
             "speculative_len=2 has no effect")


def test_generate_until_takes_it(ckpt):
    from eval_harness import DiscoLoopLM  # here: lm_eval's import is paid by this test only

    class Req:
        def __init__(self, *args):
            self.args = args
    reqs = [Req(c, {"until": ["\n\n"], "max_gen_toks": 10}) for c in ("The small cat", "x")]
    lm = DiscoLoopLM(ckpt, dtype="float32", speculative_draft_loops=1, speculative_len="3")
    assert lm.generate_until(reqs, disable_tqdm=True) == DiscoLoopLM(ckpt, dtype="float32").generate_until(
        reqs, disable_tqdm=True)
    assert lm.spec.rounds > 0


PIPES = [(1, 0), (2, 0), (1, 2)]


@pytest.mark.parametrize("recurrence,kw", CASES[1:], ids=IDS[1:])
def test_pipelined_greedy_is_generate_token_for_token(recurrence, kw):
    """Pipelined (issue 67): proposal depth 1 and 2, and 1 judged again at 2, up to block_size, proposals kept and
    rejected (lanes dropped) in each; 'none' is refused in one line."""
    model = make(recurrence, **kw)
    prompt = torch.randint(0, 23, (1, 4), generator=torch.Generator().manual_seed(1))
    want = model.generate(prompt, BLOCK - 4, temperature=0)
    for q, q2 in PIPES:
        pipe = Pipeline(q, q2)
        got = speculative.generate(model, prompt, BLOCK - 4, pipe, temperature=0)
        assert torch.equal(got, want), (q, q2, got, want)
        assert pipe.committed == BLOCK - 4 and 0 < pipe.accepted < pipe.judged, pipe
    with pytest.raises(ValueError, match="untied copies") as e:
        speculative.generate(make("none"), prompt, 4, Pipeline(1), temperature=0)
    assert "\n" not in str(e.value)



@pytest.mark.parametrize("recurrence,kw", [CASES[2], CASES[6], CASES[7], CASES[9]], ids=IDS[2:3] + IDS[6:8] + IDS[9:10])
def test_pipelined_cache_after_rejections_is_a_fresh_one(recurrence, kw):
    """After dropped lanes, every (loop, layer) entry of the committed positions (prelude, coda included) holds what one
    full-depth forward over the same tokens stores."""
    model = make(recurrence, **kw)
    prompt = torch.tensor([[5, 2, 9]])
    lanes, pipe = [Lanes(3, 19) for _ in range(model.config.n_layer)], Pipeline(1)
    out = speculative.generate(model, prompt, 16, pipe, temperature=0, cache=lanes)
    assert pipe.accepted < pipe.judged, "no proposal was rejected: no lane was dropped"
    fresh = model.new_cache()
    with torch.no_grad():
        model.hidden(out[:, :-1], cache=fresh)
    for k, loop in enumerate(fresh):
        for i, ref in enumerate(loop):
            if len(ref):
                n = len(ref)
                torch.testing.assert_close(lanes[i].entries(k + 1, n), (ref.k[0], ref.v[0]), rtol=0, atol=1e-10)


@pytest.mark.parametrize("q2", [0, 2])
def test_pipelined_sampling_keeps_the_distribution(q2):
    """Pipelined sampling, V = 5, K = 3, two new tokens (the second proposed at loop 1, judged at loop 3; with q2 = 2
    judged at loop 2 first): the pairs follow the target's exact distribution (enumerated)."""
    model = make("loop", vocab_size=5, n_layer=1, n_embd=8, block_size=8)
    prompt, V, N = torch.tensor([[1, 3]]), 5, 1500
    p1 = sampled_dist(model, prompt, None, 1.0, None)
    p2 = torch.stack([sampled_dist(model, torch.tensor([[1, 3, a]]), None, 1.0, None) for a in range(V)])
    target = p1[:, None] * p2
    g, pipe, counts = torch.Generator().manual_seed(0), Pipeline(1, q2), torch.zeros(V, V)
    for _ in range(N):
        out = speculative.generate(model, prompt, 2, pipe, temperature=1.0, generator=g)
        counts[out[0, 2], out[0, 3]] += 1
    stat, df = pearson(counts, target, N)
    assert stat < chi2_bound(df), (stat, df, counts / N, target)
    assert 0 < pipe.accepted < pipe.judged


def test_pipelined_keys_are_one_line():
    model = make("disco")
    assert spec_option(0, 4, model, propose=1, recheck=2) == Pipeline(1, 2)
    for args, kw, needle in (((0, 4), {"recheck": 2}, "speculative_recheck=2 has no effect"),
                             ((1, 4), {"propose": 1}, "are two decoders"),
                             ((0, 4), {"propose": 3}, "speculative_propose=3 is invalid with 3 loops"),
                             ((0, 4), {"propose": 2, "recheck": 2}, "no loop lies between"),
                             ((0, 4), {"propose": 1, "use_cache": False}, "use_cache=True")):
        with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            spec_option(*args, model, **kw)
    with pytest.raises(ConfigError, match="untied copies"):
        spec_option(0, 4, make("none"), propose=1)
