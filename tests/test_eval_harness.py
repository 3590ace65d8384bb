"""eval_harness.py offline: local YAML tasks on a tiny checkpoint trained in the test."""
import json

import pytest
import torch
import torch.nn.functional as F

from conftest import mc_task, run

TINY = ["config/pretrain_tiny.py", "--max_iters=30", "--eval_interval=30", "--dtype=float32", "--eval_iters=2",
        "--threads=1", "--n_embd=64", "--n_loop=2", "--phi_topk=16", "--block_size=64"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("harness")
    out = str(d / "run")
    r = run(["train.py", *TINY, f"--out_dir={out}", f"--data_dir={d / 'shards'}"])
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def lm(ckpt):
    import datasets
    datasets.config.SLEEP_TIME_ON_THREADS_SHUTDOWN = 0
    from eval_harness import DiscoLoopLM
    return DiscoLoopLM(ckpt, batch_size=16, dtype="float32")


class Req:  # what the harness passes: an object with .args
    def __init__(self, *args):
        self.args = args


def direct_loglik(model, enc, context, continuation):
    ctx, cont = enc.encode_ordinary(context), enc.encode_ordinary(continuation)
    ids = torch.tensor([ctx + cont])
    logits, _ = model(ids[:, :-1])
    lp = F.log_softmax(logits.float(), -1)[0, len(ctx) - 1:]
    return lp.gather(1, torch.tensor(cont)[:, None]).sum().item()


PAIRS = [("The small cat sees", " the dog."), ("12 + 30 =", " 42."), ("The old", " river moves the tree. " * 2),
         ("x", "y"), ("The quiet teacher reads the book and the young student", " follows.")]


def test_loglikelihood_matches_direct_forward(lm):
    res = lm.loglikelihood([Req(c, x) for c, x in PAIRS], disable_tqdm=True)
    for (c, x), (ll, greedy) in zip(PAIRS, res):
        assert ll == pytest.approx(direct_loglik(lm.model, lm.enc, c, x), abs=1e-4)
        assert isinstance(greedy, bool)


def test_batch_size_does_not_change_results(lm):
    reqs = [Req(c, x) for c, x in PAIRS * 4]
    lm.batch = 1
    one = lm.loglikelihood(reqs, disable_tqdm=True)
    lm.batch = 16
    many = lm.loglikelihood(reqs, disable_tqdm=True)
    for a, b in zip(one, many):
        assert a[0] == pytest.approx(b[0], abs=1e-4) and a[1] == b[1]


def test_rolling_equals_sum_over_tokens(lm):
    text = "The red cat sees the dog. " * 8  # longer than block_size=64 bytes: several windows
    (ll,) = lm.loglikelihood_rolling([Req(text)], disable_tqdm=True)
    ids = lm.enc.encode_ordinary(text)
    # reference: every token scored once, in disjoint windows of block_size=64 predictions, each
    # token seeing the window's tokens before it (the harness's rolling scheme with context_len=1)
    total = 0.0
    full = [lm.eot_token_id] + ids
    for i in range(1, len(full)):
        ctx = full[(i - 1) // 64 * 64:i]
        logits, _ = lm.model(torch.tensor([ctx]))
        total += F.log_softmax(logits[0, -1].float(), -1)[full[i]].item()
    assert ll == pytest.approx(total, rel=1e-3)


def test_generate_until_stops(lm):
    (out,) = lm.generate_until([Req("The small cat", {"until": ["."], "max_gen_toks": 20})], disable_tqdm=True)
    assert "." not in out and len(out) <= 20


def test_local_tasks_through_the_harness(ckpt, tmp_path):
    mc_task(tmp_path, "tiny_mc", [{"question": "12 + 30 =", "choices": [" 42.", " 17.", " cat."], "label": 0},
                                  {"question": "The small cat sees the", "choices": [" dog.", " 7 + 1", " ==="], "label": 0},
                                  {"question": "3 * 3 =", "choices": [" 9.", " dog."], "label": 0}],
            metrics=("acc", "acc_norm"))
    lam = tmp_path / "lam.jsonl"
    lam.write_text("".join(json.dumps({"text": t}) + "\n" for t in [
        "The red cat sees the dog", "The old engine builds the city", "2 + 2 = 4"]))
    (tmp_path / "lam.yaml").write_text(f"""task: tiny_lambada
dataset_path: json
dataset_kwargs:
  data_files:
    test: {lam}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{text.split(' ')[:-1]|join(' ')}}}}"
doc_to_target: "{{{{' '+text.split(' ')[-1]}}}}"
metric_list:
  - metric: perplexity
  - metric: acc
""")
    js = str(tmp_path / "out.json")
    r = run(["eval_harness.py", f"--ckpt={ckpt}", "--tasks=tiny_mc,tiny_lambada", f"--include_path={tmp_path}",
             f"--json={js}", "--n_loop=3"], env={"HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(js))
    assert set(res["row"]) == {"tiny_mc", "tiny_lambada", "avg"} and res["n_loop"] == 3
    assert "acc_norm,none" in res["results"]["tiny_mc"]
    assert res["row"]["tiny_mc"] == pytest.approx(100 * res["results"]["tiny_mc"]["acc_norm,none"])
    assert "| tiny_mc | tiny_lambada | avg |" in r.stdout


def test_bad_input(ckpt, tmp_path):
    r = run(["eval_harness.py", f"--ckpt={tmp_path}/none.pt"])
    assert r.returncode == 2 and "not found" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run(["eval_harness.py", f"--ckpt={ckpt}", "--tasks=no_such_task"],
            env={"HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert r.returncode == 2 and "no_such_task" in r.stderr, r.stderr[-2000:]
    notes = tmp_path / "notes.txt"  # the hostile pass: --json replaced a user's file with the results
    notes.write_text("my notes")
    r = run(["eval_harness.py", f"--ckpt={ckpt}", "--tasks=no_such_task", f"--json={notes}"])
    assert r.returncode == 2 and "holds text that is not JSON" in r.stderr, r.stderr[-2000:]
    assert notes.read_text() == "my notes"


def test_passthrough_on_a_cpu_and_empty_tasks(ckpt, tmp_path):
    """The harness CLI asks for CUDA by default, and passes --device beside a device= in --model_args; an
    empty task would fail deep in its metrics; --json into a missing folder is made before the work."""
    from eval_harness import passthrough_args
    args = passthrough_args(["--model", "discoloop", "--model_args", f"ckpt={ckpt},device=cpu", "--tasks", "x"])
    assert args[args.index("--model_args") + 1] == f"ckpt={ckpt}" and args[args.index("--device") + 1] == "cpu"
    if not torch.cuda.is_available():
        assert passthrough_args(["--tasks", "x"])[-2:] == ["--device", "cpu"]
    assert passthrough_args(["--device", "cuda:1"]) == ["--device", "cuda:1"]  # what the user asked for stays
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    (tmp_path / "e.yaml").write_text(f"""task: empty_task
dataset_path: json
dataset_kwargs:
  data_files:
    test: {empty}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{text}}}}"
doc_to_target: "{{{{target}}}}"
""")
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    r = run(["eval_harness.py", f"--ckpt={ckpt}", "--tasks=empty_task", f"--include_path={tmp_path}",
             f"--json={tmp_path / 'new' / 'r.json'}"], env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "empty" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "new").exists()  # checked before the evaluation; a refusal leaves no folder behind


def test_generate_until_with_the_cache_is_the_old_greedy(lm):
    """generate_until runs each new token through the (loop, layer) cache; the text is what rerunning the whole
    window every step (the uncached greedy it replaced) gives."""
    contexts = ["The small cat", "12 + 30 = 42. 3 * 3 =", "x"]
    got = lm.generate_until([Req(c, {"until": ["\n\n"], "max_gen_toks": 12}) for c in contexts], disable_tqdm=True)
    for context, text in zip(contexts, got):
        ids, new = lm.tok_encode(context), []
        with torch.no_grad():
            for _ in range(12):
                logits = lm.model.head(lm.model.hidden(torch.tensor([ids + new]))[:, -1])
                nxt = int(logits[0].argmax())
                if nxt == lm.eot_token_id:
                    break
                new.append(nxt)
                if "\n\n" in lm.tok_decode(new):
                    break
        assert text == lm.tok_decode(new).split("\n\n")[0]


def test_sample_py_is_seeded_and_cache_blind(ckpt):
    """sample.py on a pretraining checkpoint: the tokenizer comes from its data, the same seed gives the same
    text with and without the cache, and bad values are one line."""
    args = ["sample.py", f"--ckpt={ckpt}", "--start=The small", "--num_samples=2", "--max_new_tokens=20",
            "--temperature=0.9", "--top_k=20", "--seed=3", "--threads=1"]
    a, b = run(args), run(args + ["--use_cache=False"])
    assert a.returncode == 0 and b.returncode == 0, a.stderr[-2000:] + b.stderr[-2000:]
    assert a.stdout == b.stdout and a.stdout.count("---------------") == 2 and a.stdout.startswith("The small")
    assert run(args[:-1] + ["--seed=4", "--threads=1"]).stdout != a.stdout
    for bad, needle in (("--temperature=-1", "temperature=-1"), ("--max_new_tokens=100000", "exceeds block_size")):
        r = run(args + [bad])
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr[-2000:]


def test_a_checkpoint_is_read_with_a_tokenizer_that_fits_it(ckpt, tmp_path):
    """sample.py and eval_harness.py on a checkpoint whose tokenizer and vocabulary differ: a model with more rows
    than its tokenizer has ids (vocab_size padding the data's) samples only ids the tokenizer can decode; a tokenizer
    with more ids than the model has rows, or a tokenizer record of a kind this code does not know, is one line
    naming what is wrong, not a KeyError or an IndexError in the embedding."""
    from discoloop.checkpoint import load_checkpoint, save_checkpoint
    from model import GPT, GPTConfig

    def variant(name, vocab_size=None, tokenizer=None):
        c = load_checkpoint(ckpt)
        c.pop("ema", None), c.pop("crc32")  # save_checkpoint writes the new content's
        if vocab_size:
            c["model_args"] = {**c["model_args"], "vocab_size": vocab_size}
            torch.manual_seed(0)  # untrained: every row, the padding too, gets its share of the samples
            c["model"] = GPT(GPTConfig.from_dict(c["model_args"])).state_dict()
        if tokenizer:
            c["tokenizer"] = tokenizer
        save_checkpoint(c, str(tmp_path / name / "ckpt.pt"))
        return str(tmp_path / name)

    args = ["--start=The", "--num_samples=1", "--max_new_tokens=40", "--temperature=1", "--top_k=0", "--threads=1"]
    r = run(["sample.py", f"--ckpt={variant('padded', vocab_size=400)}", *args])  # bytes: 257 ids
    assert r.returncode == 0 and r.stdout.startswith("The"), r.stderr[-2000:]
    for name, change, needle in (("small", dict(vocab_size=200), "has 257 tokens, more than the model's vocab_size=200"),
                                 ("foreign", dict(tokenizer={"kind": "sentencepiece"}), "'sentencepiece'")):
        path = variant(name, **change)
        for script in (["sample.py", f"--ckpt={path}", *args], ["eval_harness.py", f"--ckpt={path}", "--tasks=piqa"]):
            r = run(script)
            assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr[-2000:]


def test_adaptive_depth_scores_and_generates(ckpt):
    """exit_rule: all exits after loop 1 score as n_loop=1; never, as the trained K; the mean depth is counted on the
    real tokens; generate_until runs through GPT.generate with the same exits; a bad threshold is one line."""
    from eval_harness import DiscoLoopLM
    from discoloop.common import ConfigError
    reqs = [Req(c, x) for c, x in PAIRS]
    for kw, same in (({"exit_threshold": 0.0}, {"n_loop": 1}), ({"exit_threshold": 1.0}, {})):
        lm = DiscoLoopLM(ckpt, batch_size=4, dtype="float32", **{"exit_rule": "prob", **kw})
        ref = DiscoLoopLM(ckpt, batch_size=4, dtype="float32", **same)
        for a, b in zip(lm.loglikelihood(reqs, disable_tqdm=True), ref.loglikelihood(reqs, disable_tqdm=True)):
            assert a[0] == pytest.approx(b[0], abs=1e-5) and a[1] == b[1]
        n = sum(len(lm.enc.encode_ordinary(c + x)) - 1 for c, x in PAIRS)
        assert lm.loops == [n * (same.get("n_loop") or 2), n]
        gen = [Req("The small cat", {"until": ["\n\n"], "max_gen_toks": 8})]
        assert lm.generate_until(gen, disable_tqdm=True) == ref.generate_until(gen, disable_tqdm=True)
    with pytest.raises(ConfigError, match=r"threshold=1\.5, .*allowed"):
        DiscoLoopLM(ckpt, exit_rule="prob", exit_threshold=1.5)


def test_bench_sample_on_a_checkpoint_refuses_model_keys(ckpt):
    """bench.py sample --ckpt measures the checkpoint's shape and loops; the hostile pass: --n_loop=2 beside it ran the
    checkpoint's K and said nothing (a kl exit refused at n_loop=2 was accepted). Now one line."""
    args = ["bench.py", "sample", "config/pretrain_tiny.py", f"--ckpt={ckpt}", "--new_tokens=4", "--prompt=2", "--threads=1"]
    r = run(args)
    assert r.returncode == 0 and f"({ckpt})" in r.stdout, r.stderr[-2000:]
    r = run(args + ["--n_loop=2", "--n_embd=64"])
    assert r.returncode == 2 and "--n_embd, --n_loop have no effect with --ckpt" in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1
