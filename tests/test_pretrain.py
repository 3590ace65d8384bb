"""Pretraining path: shard preparation round-trip and resume, DDP (gloo) == single process."""
import importlib.util
import json
import os

import numpy as np
import pytest
import torch

from conftest import REPO, run
from discoloop import tokenizer  # noqa: E402

spec = importlib.util.spec_from_file_location("prep_pt", os.path.join(REPO, "data/pretrain/prepare.py"))
prep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prep)

DOCS = {"web": [f"Document {i}: the quick brown fox {'jumps ' * (i % 7)}over é and 漢字 #{i}." for i in range(300)],
        "math": [f"{i} + {i * 3} = {i * 4}. Lemma {i}: x^2 >= 0." for i in range(200)]}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    paths = []
    for name, docs in DOCS.items():
        p = d / f"{name}.jsonl"
        p.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(docs)))
        paths.append(str(p))
    return ",".join(paths)


def config(corpus, out, **kw):
    from configurator import configure
    args = [f"--out_dir={out}", f"--data_files={corpus}", "--encoding=bytes", "--val_tokens=2000",
            "--shard_tokens=3000", "--max_tokens=10**9".replace("10**9", "1000000000"), "--batch_docs=16", "--num_proc=1"]
    return configure(prep.DEFAULTS, args + [f"--{k}={v}" for k, v in kw.items()], checks=prep.CHECKS)


def read_all(out, meta):
    toks = [np.fromfile(os.path.join(out, n), dtype=meta["dtype"]) for split in ("val", "train")
            for n, _ in meta["shards"][split]]
    return np.concatenate(toks)


def test_round_trip_and_mixture(corpus, tmp_path):
    out = str(tmp_path / "shards")
    meta = prep.prepare(config(corpus, out, short_source="fill"))  # all of both sources
    enc = tokenizer.byte_encoding()
    docs = enc.decode_bytes(read_all(out, meta).tolist()).split(b"<|endoftext|>")
    # every document comes back whole, each source's in its own order
    assert docs[-1] == b""
    texts = [d.decode() for d in docs[:-1]]
    assert sorted(texts) == sorted(DOCS["web"] + DOCS["math"])
    for name in DOCS:
        mine = [t for t in texts if t in set(DOCS[name])]
        assert mine == DOCS[name]
    assert all(n == 3000 for _, n in meta["shards"]["train"][:-1]) and meta["shards"]["val"][0][1] == 2000
    assert meta["dtype"] == "uint16"


def test_a_source_that_runs_out_stops_the_mix_in_one_line(corpus, tmp_path):
    """The math source holds ~7k byte tokens: a 60/40 budget of 1e9 cannot hold its share."""
    with pytest.raises(prep.ConfigError, match=r"ran out after .* the mix would drift; use max_tokens <= ") as e:
        prep.prepare(config(corpus, str(tmp_path / "s")))
    assert len(str(e.value).splitlines()) == 1
    msg = str(e.value)
    limit = int(msg.split("max_tokens <= ")[1].split(", add")[0].replace(",", ""))
    meta = prep.prepare(config(corpus, str(tmp_path / "s"), max_tokens=limit - 2000))  # resumes, and now holds
    web, math = meta["source_tokens"]
    assert abs(web / (web + math) - 0.6) < 0.02


def test_token_budget_and_60_40_mixture(corpus, tmp_path):
    meta = prep.prepare(config(corpus, str(tmp_path / "s"), max_tokens=8000))
    assert sum(n for _, n in meta["shards"]["train"]) == 8000
    web, math = meta["source_tokens"]
    assert abs(web / (web + math) - 0.6) < 0.06


@pytest.mark.parametrize("max_tokens", [600, 1500])
def test_mixture_holds_at_a_small_budget(corpus, tmp_path, max_tokens):
    """A 1,024-document batch from one source must not fill a small budget alone."""
    meta = prep.prepare(config(corpus, str(tmp_path / "s"), max_tokens=max_tokens, val_tokens=300, batch_docs=1024))
    web, math = meta["source_tokens"]
    assert sum(n for _, n in meta["shards"]["train"]) == max_tokens
    assert abs(web / (web + math) - 0.6) < 0.06, (web, math)


def test_resume_skips_finished_shards(corpus, tmp_path):
    out = str(tmp_path / "s")
    full = prep.prepare(config(corpus, str(tmp_path / "ref"), short_source="fill"))
    prep.prepare(config(corpus, out, max_tokens=6000))
    # simulate an interruption after two train shards: drop the rest and the meta
    state = json.load(open(os.path.join(out, "state.json")))
    mtime = os.path.getmtime(os.path.join(out, "train_000000.bin"))
    os.remove(os.path.join(out, "meta.json"))
    meta = prep.prepare(config(corpus, out, short_source="fill"))
    assert os.path.getmtime(os.path.join(out, "train_000000.bin")) == mtime  # not redone
    assert np.array_equal(read_all(out, meta), read_all(str(tmp_path / "ref"), full))
    assert state["shards"]["train"] == meta["shards"]["train"][:len(state["shards"]["train"])]


def test_bad_input(corpus, tmp_path):
    r = run(["data/pretrain/prepare.py", f"--out_dir={tmp_path}/a", "--data_files=/no/such.jsonl", "--weights=1", "--encoding=bytes"])
    assert r.returncode == 2 and "not found" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run(["data/pretrain/prepare.py", f"--out_dir={tmp_path}/b", f"--data_files={corpus}", "--weights=1",
             "--encoding=bytes"])
    assert r.returncode == 2 and "weights" in r.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    r = run(["data/pretrain/prepare.py", f"--out_dir={tmp_path}/c", f"--data_files={empty}", "--weights=1",
             "--encoding=bytes"])
    assert r.returncode == 2 and "no training shard" in r.stderr, r.stderr
    r = run(["data/pretrain/prepare.py", f"--out_dir={tmp_path}/d", f"--data_files={corpus}", "--encoding=nope"])
    assert r.returncode == 2 and "encoding='nope'" in r.stderr


def test_bad_sources_are_refused_before_out_dir_is_made(tmp_path):
    """A source is checked when it is opened, not when its first row is read: a folder without .txt files (it read as
    no documents and failed at the end), a missing file, a hub source without its CONFIG part, each one line, and
    out_dir is not made (it used to be left behind, empty)."""
    (tmp_path / "no_txt").mkdir()
    (tmp_path / "no_txt" / "a.md").write_text("not a .txt")
    for source, needle in [(tmp_path / "no_txt", "is a folder without .txt files"), (tmp_path / "x.jsonl", "not found"),
                           ("hf:nobody", "allowed hf:NAME:CONFIG")]:
        r = run(["data/pretrain/prepare.py", f"--out_dir={tmp_path / 'out'}", f"--data_files={source}", "--weights=1",
                 "--encoding=bytes", "--num_proc=1"], env={"HF_DATASETS_OFFLINE": "1"})
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / "out").exists()


TINY = ["config/pretrain_tiny.py", "--max_iters=8", "--eval_interval=4", "--log_interval=1", "--dtype=float32",
        "--eval_iters=2", "--threads=1", "--n_embd=64", "--n_loop=2", "--phi_topk=16"]


@pytest.fixture(scope="module")
def tiny_shards(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny") / "shards")


def test_ddp_two_processes_equal_single_process(tiny_shards, tmp_path):
    single, ddp = str(tmp_path / "single"), str(tmp_path / "ddp")
    r = run(["train.py", *TINY, f"--out_dir={single}", f"--data_dir={tiny_shards}"])
    assert r.returncode == 0, r.stderr
    r = run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py", *TINY,
             f"--out_dir={ddp}", f"--data_dir={tiny_shards}"], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    ms = [[json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))] for d in (single, ddp)]
    assert [m["iter"] for m in ms[0]] == [m["iter"] for m in ms[1]] == [0, 4, 8]
    for a, b in zip(*ms):
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-4)
        if "loss" in a:
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
    wa = torch.load(os.path.join(single, "ckpt.pt"), weights_only=True)["model"]
    wb = torch.load(os.path.join(ddp, "ckpt.pt"), weights_only=True)["model"]
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-3, atol=1e-5)
    assert ms[0][-1]["val_loss"] < ms[0][0]["val_loss"]  # it learns


def test_pretrain_resume(tiny_shards, tmp_path):
    out = str(tmp_path / "run")
    r = run(["train.py", *TINY, f"--out_dir={out}", f"--data_dir={tiny_shards}", "--max_iters=4"])
    assert r.returncode == 0, r.stderr
    r = run(["train.py", *TINY, f"--out_dir={out}", f"--data_dir={tiny_shards}", "--init_from=resume"])
    assert r.returncode == 0, r.stderr
    ref = str(tmp_path / "ref")
    assert run(["train.py", *TINY, f"--out_dir={ref}", f"--data_dir={tiny_shards}"]).returncode == 0
    strip = lambda m: {k: v for k, v in m.items() if k not in ("time", "cpu_time", "tok_per_s", "tflops")}
    a = [strip(json.loads(line)) for line in open(os.path.join(out, "metrics.jsonl"))]
    b = [strip(json.loads(line)) for line in open(os.path.join(ref, "metrics.jsonl"))]
    assert a[-1]["val_loss"] == b[-1]["val_loss"]


def test_training_windows_without_replacement():
    """One pass visits every window once, in a seeded order; the next pass draws a new order."""
    from discoloop.shards import WindowOrder
    order = WindowOrder(np.array([1000, 257, 64]), 64, seed=3)
    assert order.total == 15 + 4 + 0
    shard, start = order(np.arange(order.total))
    assert len(set(zip(shard.tolist(), start.tolist()))) == order.total  # no window twice
    assert all(s + 64 + 1 <= [1000, 257, 64][sh] for sh, s in zip(shard, start))
    again = order(np.arange(order.total, 2 * order.total))
    assert sorted(zip(*again)) == sorted(zip(shard, start)) and list(zip(*again)) != list(zip(shard, start))
    same = WindowOrder(np.array([1000, 257, 64]), 64, seed=3)(np.arange(5))
    assert np.array_equal(same[1], start[:5])


def test_hugging_face_tokenizer_file(corpus, tmp_path):
    """The paper's tokenizer comes as a tokenizer.json: a tiny one trained here stands in for it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(DOCS["web"] + DOCS["math"], trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<eot>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = str(tmp_path / "tokenizer.json")
    tok.save(path)
    out = str(tmp_path / "s")
    meta = prep.prepare(config(corpus, out, tokenizer_file=path, tokenizer_eot="<eot>", short_source="fill"))
    enc = tokenizer.get_encoding({**prep.DEFAULTS, "tokenizer_file": path, "tokenizer_eot": "<eot>"})
    assert meta["encoding"] == "hf:tokenizer.json" and meta["vocab_size"] == tok.get_vocab_size()
    docs = enc.decode(read_all(out, meta).tolist()).split("<eot>")
    assert sorted(d for d in docs if d) == sorted(DOCS["web"] + DOCS["math"])
    r = run(["data/pretrain/prepare.py", f"--out_dir={tmp_path}/x", f"--data_files={corpus}", f"--tokenizer_file={path}",
             "--tokenizer_eot=<nope>"])
    assert r.returncode == 2 and "tokenizer_eot='<nope>'" in r.stderr
