"""Natural-language data: decodes back to the exact sentences, answers follow the graph."""
import json
import os

import pytest
import torch

from conftest import REPO, run
from discoloop import tokenizer  # noqa: E402

import importlib.util

spec = importlib.util.spec_from_file_location("prep_nl", os.path.join(REPO, "data/nl/prepare.py"))
nl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nl)

SMALL = ["--n_entities=40", "--n_relations=8", "--out_degree=4", "--n_train=300", "--n_test=60", "--n_val=60"]


def word_encoding(n_words=150):
    """A local BPE in which the first census names and the relation nouns are single tokens, both
    after a space and (names) sentence-initially: every prefix of each form is a merge, so BPE
    walks up to the whole word. Stands in for GPT-2 in tests (no download)."""
    import tiktoken
    names = nl.read_names()[:n_words]
    ranks = {bytes([i]): i for i in range(256)}
    for w in [" " + n for n in names] + names + [" " + r for r in nl.RELATIONS]:
        for j in range(2, len(w) + 1):
            ranks.setdefault(w[:j].encode(), len(ranks))
    return tiktoken.Encoding("words", pat_str=tokenizer.GPT2_PAT, mergeable_ranks=ranks, special_tokens={})


@pytest.mark.parametrize("fmt,source,lead", [("direct", "census", True), ("reverse", "census", True),
                                             ("direct", "census_strict", False), ("reverse", "syllable", False)])
def test_round_trip_and_graph(tmp_path, fmt, source, lead):
    from configurator import configure
    out = str(tmp_path / fmt)
    c = configure(nl.DEFAULTS, [f"--out_dir={out}", f"--format={fmt}", f"--names={source}", f"--leading_space={lead}",
                                "--max_hops=3", "--eval_hops=4"] + SMALL)
    enc = tokenizer.byte_encoding() if source == "syllable" else word_encoding()
    nl.prepare(c, enc)
    meta = json.load(open(os.path.join(out, "meta.json")))
    splits, _, graphs = nl.sym.build(c)  # the symbolic examples behind every sentence
    name, rel = meta["names"], meta["relation_words"]
    assert len(set(name.values())) == len(name)
    answers = sorted(tuple(enc.encode_ordinary(" " + n)) for n in name.values())  # prefixes sort adjacent
    assert not any(b[:len(a)] == a for a, b in zip(answers, answers[1:])), "an answer is a prefix of another"
    for s, info in meta["splits"].items():
        lines = open(os.path.join(out, info["file"])).read().splitlines()
        texts = [json.loads(line) for line in open(os.path.join(out, f"{s}.text.jsonl"))]
        assert len(lines) == len(texts) == len(splits[s])
        for line, text, ex in zip(lines, texts, splits[s]):
            q, a = line.split("\t")
            ids = [meta["bpe_ids"][meta["vocab"].index(t)] for t in q.split()]
            ans = [meta["bpe_ids"][meta["vocab"].index(t)] for t in a.split()]
            assert enc.decode(ids) == text["question"] and enc.decode(ans) == text["answer"]
            assert (text["question"], text["answer"]) == nl.verbalize(ex, fmt, name, rel, " " if lead else "")
            assert text["answer"] == " " + name[ex[-1]]
            if lead and source != "syllable" and fmt == "direct":  # the subject is the same token as an answer
                assert ids[0] == enc.encode_ordinary(" " + name[ex[0]])[0]
            g = graphs["A" if ex[0] in graphs["A"] else "B"]
            e = ex[0]
            for r in ex[1:-1]:
                e = g[e][int(r[1:])]  # relation token "r12" is relation 12
            assert e == ex[-1]
    from probe import atom_graphs, bridges  # probe.py reads the symbolic example behind each sentence
    from discoloop.qa_data import QAData
    data = QAData(out)
    assert atom_graphs(data) == ["A" if ex[0] in graphs["A"] else "B" for ex in splits["train_atom"]]
    for s, info in meta["splits"].items():  # walking every hop of a question reaches its answer's first token
        if info["hops"] >= 2:
            X, Y = data.splits[s]
            first = Y[torch.arange(len(Y)), (Y != -1).int().argmax(1)]
            assert (bridges(data, s, info["hops"]) == first).all(), s
            if source != "syllable":  # one-token names: the bridge is not the answer (byte names all start with " ")
                assert (bridges(data, s, 1) != first).any(), s
    q = json.loads(open(os.path.join(out, "test_id.text.jsonl")).readline())["question"]
    assert q.startswith(" ") == lead
    assert (q.strip().startswith("Who is the ") and q.endswith("?\nAnswer:")) if fmt == "reverse" else q.endswith(" is")
    assert set(meta["token_kinds"].values()) <= {"entity", "relation", "filler"}
    if source != "syllable":  # one-token answers; one token layout per split when names are one token everywhere
        for s, info in meta["splits"].items():
            rows = [line.split("\t") for line in open(os.path.join(out, info["file"]))]
            assert all(len(a.split()) == 1 for _, a in rows)
            if source == "census_strict" or lead:
                assert len({len(q.split()) for q, _ in rows}) == 1, s


def test_census_needs_one_token_names(tmp_path):
    r = run(["data/nl/prepare.py", f"--out_dir={tmp_path}/x", "--encoding=bytes", "--names=census"] + SMALL)
    assert r.returncode == 2 and "are one 'bytes' token" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run(["data/nl/prepare.py", f"--out_dir={tmp_path}/y", "--encoding=bytes", "--names=nicknames"] + SMALL)
    assert r.returncode == 2 and "names='nicknames'" in r.stderr


def test_bad_format(tmp_path):
    r = run(["data/nl/prepare.py", f"--out_dir={tmp_path}/x", "--format=sideways", "--encoding=bytes"] + SMALL)
    assert r.returncode == 2 and "format='sideways'" in r.stderr


def test_gpt2_file_checked(tmp_path):
    fake = tmp_path / "gpt2.tiktoken"
    fake.write_text("SGVsbG8= 0\n")
    r = run(["data/nl/prepare.py", f"--out_dir={tmp_path}/x", f"--tiktoken_file={fake}"] + SMALL)
    assert r.returncode == 2 and "not usable" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_trains_on_nl(tmp_path):
    """QAData reads multi-token answers; a short run writes metrics for every split."""
    data = str(tmp_path / "d")
    from configurator import configure
    nl.prepare(configure(nl.DEFAULTS, [f"--out_dir={data}", "--encoding=bytes", "--names=syllable"] + SMALL),
               tokenizer.byte_encoding())
    out = str(tmp_path / "run")
    r = run(["train.py", "config/nl_direct.py", f"--data_dir={data}", f"--out_dir={out}", "--max_iters=20",
             "--eval_interval=10", "--n_embd=32", "--n_head=2", "--batch_size=64", "--threads=1", "--dtype=float32",
             "--block_size=96",
             "--data_args=" + repr({"format": "direct", "encoding": "bytes", "names": "syllable",
                                    **{a[2:].split("=")[0]: int(a.split("=")[1]) for a in SMALL}})])
    assert r.returncode == 0, r.stderr
    last = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))][-1]
    assert "acc/test_ood" in last and "acc1/train_id" in last
    r = run(["probe.py", "gate", f"--ckpt={out}", "--threads=1"])
    assert r.returncode == 0 and "loop1/entity" in r.stdout and "loop1/filler" in r.stdout, r.stderr
    r = run(["probe.py", "lens", f"--ckpt={out}", "--threads=1"])
    assert r.returncode == 0 and "| test_ood b1 |" in r.stdout, r.stderr
    where = json.load(open(os.path.join(out, "probe_lens.json")))["where"]
    assert all(0 <= v <= 1 for row in where.values() for v in row) and len(where["test_id b1"]) > 3
