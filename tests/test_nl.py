"""Natural-language data: decodes back to the exact sentences, answers follow the graph."""
import json
import os

import pytest

from conftest import REPO, run

import importlib.util

spec = importlib.util.spec_from_file_location("prep_nl", os.path.join(REPO, "data/nl/prepare.py"))
nl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nl)

SMALL = ["--n_entities=40", "--n_relations=8", "--out_degree=4", "--n_train=300", "--n_test=60"]


@pytest.mark.parametrize("fmt", ["direct", "reverse"])
def test_round_trip_and_graph(tmp_path, fmt):
    from configurator import configure
    out = str(tmp_path / fmt)
    c = configure(nl.DEFAULTS, [f"--out_dir={out}", f"--format={fmt}", "--encoding=bytes", "--max_hops=3",
                                "--eval_hops=4"] + SMALL)
    enc = nl.tok.byte_encoding()
    nl.prepare(c, enc)
    meta = json.load(open(os.path.join(out, "meta.json")))
    splits, _, graphs = nl.sym.build(c)  # the symbolic examples behind every sentence
    name, rel = meta["names"], meta["relation_words"]
    assert len(set(name.values())) == len(name)
    names = sorted(name.values())
    assert not any(b.startswith(a) for a, b in zip(names, names[1:])), "a name is a prefix of another"
    for s, info in meta["splits"].items():
        lines = open(os.path.join(out, info["file"])).read().splitlines()
        texts = [json.loads(line) for line in open(os.path.join(out, f"{s}.text.jsonl"))]
        assert len(lines) == len(texts) == len(splits[s])
        for line, text, ex in zip(lines, texts, splits[s]):
            q, a = line.split("\t")
            ids = [meta["bpe_ids"][meta["vocab"].index(t)] for t in q.split()]
            ans = [meta["bpe_ids"][meta["vocab"].index(t)] for t in a.split()]
            assert enc.decode(ids) == text["question"] and enc.decode(ans) == text["answer"]
            assert (text["question"], text["answer"]) == nl.verbalize(ex, fmt, name, rel)
            assert text["answer"] == " " + name[ex[-1]]
            g = graphs["A" if ex[0] in graphs["A"] else "B"]
            e = ex[0]
            for r in ex[1:-1]:
                e = g[e][int(r[1:])]  # relation token "r12" is relation 12
            assert e == ex[-1]
    q = json.loads(open(os.path.join(out, "test_id.text.jsonl")).readline())["question"]
    assert (q.startswith("Who is the ") and q.endswith("?\nAnswer:")) if fmt == "reverse" else q.endswith(" is")
    assert set(meta["token_kinds"].values()) <= {"entity", "relation", "filler"}


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
    nl.prepare(configure(nl.DEFAULTS, [f"--out_dir={data}", "--encoding=bytes"] + SMALL), nl.tok.byte_encoding())
    out = str(tmp_path / "run")
    r = run(["train.py", "config/nl_direct.py", f"--data_dir={data}", f"--out_dir={out}", "--max_iters=20",
             "--eval_interval=10", "--n_embd=32", "--n_head=2", "--batch_size=64", "--threads=1", "--dtype=float32",
             "--block_size=96",
             f"--prepare_args=--encoding=bytes {' '.join(SMALL)}"])
    assert r.returncode == 0, r.stderr
    last = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))][-1]
    assert "acc/test_ood" in last and "acc1/train_id" in last
    r = run(["probe.py", "gate", f"--ckpt={out}", "--threads=1"])
    assert r.returncode == 0 and "loop1/entity" in r.stdout and "loop1/filler" in r.stdout, r.stderr
