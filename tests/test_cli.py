"""A new user's first contact: --help everywhere, one-line errors (exit 2) for bad input, and the
shared device/dtype rule."""
import json
import os
import time

import numpy as np
import pytest
import torch

from discoloop.checkpoint import RESUME_KEYS, load_checkpoint
from discoloop.common import CheckpointError
from discoloop.common import DataError
from conftest import run, tiny_train_args
from discoloop.precision import pick_cpu_dtype

SCRIPTS = [["train.py"], ["eval_harness.py"], ["bench.py"], ["bench.py", "plan"], ["lab/breaks.py"],
           ["lab/compile.py"], ["lab/phi.py"], ["lab/sdpa.py"],
           ["data/symbolic/prepare.py"], ["data/nl/prepare.py"], ["data/pretrain/prepare.py"], ["data/pretrain/local_task.py"],
           ["sample.py"], ["bench.py", "sample"], ["bench.py", "step"], ["exits.py"], ["exits.py", "gate"]] \
    + [["probe.py", cmd] for cmd in ("acc", "lens", "sweep", "gate", "plot")]


@pytest.mark.parametrize("script", SCRIPTS, ids=" ".join)
def test_help_lists_every_key_with_a_meaning(script):
    flag = "--help" if script == ["train.py"] else "-h"  # configure() treats the two alike; both seen here
    r = run(script + [flag])
    assert r.returncode == 0, r.stderr
    options = r.stdout.split("options (--key=value", 1)[1].splitlines()[1:]
    assert options and all(line.startswith("  --") for line in options)
    bare = [line.split()[0] for line in options if len(line.split()) < 2]
    assert not bare, f"keys without a meaning: {bare}"


def test_probe_help_lists_the_commands():
    r = run(["probe.py", "--help"])
    assert r.returncode == 0 and all(c in r.stdout for c in ("acc", "lens", "sweep", "gate", "plot"))
    assert run(["train.py", "-h"]).returncode == 0


def one_line(r, *needles):
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, r.stderr[-2000:]
    for n in needles:
        assert n in err, err


@pytest.mark.parametrize("extra,needle", [
    (["--device=foo"], "device='foo'"), (["--device=mps"], "mps"), (["--seed=-1"], "seed=-1"),
    (["--threads=-1"], "threads=-1"), (["--beta1=1.5"], "beta1=1.5"), (["--adam_eps=-1"], "adam_eps=-1"),
    (["--out_dir="], "out_dir=''"), (["--learning_rate=1e999"], "learning_rate=inf"),
])
def test_bad_values_one_line(tiny_data, tmp_path, extra, needle):
    args = [a for a in tiny_train_args(tiny_data, str(tmp_path / "run")) if not a.startswith("--out_dir")] \
        + ([f"--out_dir={tmp_path / 'run'}"] if not any(e.startswith("--out_dir") for e in extra) else []) + extra
    one_line(run(args), needle)


def test_nan_from_config_file_and_bad_paths(tiny_data, tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text("learning_rate = float('inf')\n")
    one_line(run(tiny_train_args(tiny_data, str(tmp_path / "r1")) + [str(cfg)]), "learning_rate=inf")
    one_line(run(["train.py", str(tmp_path)]), "is a directory")
    f = tmp_path / "afile"
    f.write_text("x")
    one_line(run(tiny_train_args(tiny_data, str(f))), "is a file")


def test_checkpoint_damage_one_line(tiny_data, tmp_path):
    out = tmp_path / "run"
    assert run(tiny_train_args(tiny_data, str(out), "--max_iters=5", "--eval_interval=5")).returncode == 0
    ckpt = out / "ckpt.pt"
    good = torch.load(ckpt, weights_only=True)
    one_line(run(tiny_train_args(tiny_data, str(out), "--init_from=resume", "--optimizer=muon", "--max_iters=6")),
             "optimizer")
    # the loader's checks in-process (train.py turns each CheckpointError into one line, as below)
    for key in ("iter_num", "config"):
        torch.save({k: v for k, v in good.items() if k != key}, ckpt)
        with pytest.raises(CheckpointError, match=f"'{key}'"):
            load_checkpoint(str(ckpt), required=RESUME_KEYS)
    torch.save({**good, "x": object()}, ckpt)  # not loadable with weights_only
    with pytest.raises(CheckpointError, match="not a readable checkpoint") as e:
        load_checkpoint(str(ckpt), required=RESUME_KEYS)
    assert "weights_only=False" not in str(e.value) and "\n" not in str(e.value)
    ckpt.write_bytes(b"")
    one_line(run(tiny_train_args(tiny_data, str(out), "--init_from=resume", "--max_iters=6")), "0 bytes")
    one_line(run(["probe.py", "acc", f"--ckpt={out}"]), "not a readable checkpoint")


def shards(tmp_path, tokens, vocab=50, meta_extra=None):
    d = tmp_path / "shards"
    d.mkdir()
    np.asarray(tokens, dtype=np.uint16).tofile(d / "train_000000.bin")
    np.asarray(tokens, dtype=np.uint16).tofile(d / "val_000000.bin")
    meta = {"kind": "tokens", "generator": "pretrain", "dtype": "uint16", "vocab_size": vocab, "eot": 0, "encoding": "bytes",
            "shards": {"train": [["train_000000.bin", len(tokens)]], "val": [["val_000000.bin", len(tokens)]]}}
    (d / "meta.json").write_text(json.dumps({**meta, **(meta_extra or {})}))
    return str(d)


PRETRAIN = ["train.py", "config/pretrain_tiny.py", "--dtype=float32", "--threads=1", "--max_iters=2", "--n_embd=32",
            "--n_loop=2", "--phi_topk=8", "--block_size=16"]


@pytest.mark.parametrize("case,needle", [
    ("bad_id", "holds token id 99"), ("short", "block_size=16 is longer than every shard"),
    ("no_shards", "lacks 'shards'"), ("cut_meta", "not valid JSON"),
    ("hash_type", "config.tokenizer_sha256='12345' is invalid: allowed a sha256 hex string"),
    ("dtype", "dtype='float64' is invalid"), ("shard_pairs", "shards="),
])
def test_shard_problems_one_line(tmp_path, case, needle):
    toks = list(np.arange(200) % 50)
    if case == "bad_id":
        toks[150] = 99  # far from any window a short run would sample
    extra = {"hash_type": {"config": {"encoding": "bytes", "tokenizer_file": "t.json", "tokenizer_sha256": 12345}},
             "dtype": {"dtype": "float64"}, "shard_pairs": {"shards": {"train": ["train_000000.bin"]}}}.get(case)
    d = shards(tmp_path, toks[:10] if case == "short" else toks, meta_extra=extra)
    if case == "no_shards":
        meta = json.loads(open(f"{d}/meta.json").read())
        del meta["shards"]
        open(f"{d}/meta.json", "w").write(json.dumps(meta))
    if case == "cut_meta":
        text = open(f"{d}/meta.json").read()
        open(f"{d}/meta.json", "w").write(text[:len(text) // 2])
    one_line(run(PRETRAIN + [f"--data_dir={d}", f"--out_dir={tmp_path / 'run'}"]), needle)


def test_shard_vocabulary_scan_is_cached_per_file(tmp_path):
    """The full-token scan runs once per shard file: the cache is used while a file's size and
    mtime are unchanged, and a rewritten shard is scanned again."""
    from discoloop.shards import TokenShards
    d = shards(tmp_path, list(np.arange(200) % 50))
    TokenShards(d, "train")
    cache = json.loads(open(f"{d}/max_token.json").read())
    assert cache["train_000000.bin"][2] == 49
    cache["train_000000.bin"][2] = 77  # a cached maximum past the vocabulary: the cache is the culprit, named (round 7)
    open(f"{d}/max_token.json", "w").write(json.dumps(cache))
    with pytest.raises(DataError, match="max_token.json' is wrong about shard 'train_000000.bin'.*delete"):
        TokenShards(d, "train")
    bad = np.arange(200, dtype=np.uint16) % 50
    bad[10] = 99
    time.sleep(0.01)
    bad.tofile(f"{d}/train_000000.bin")  # same size, new mtime: scanned again
    os.utime(f"{d}/train_000000.bin", ns=(time.time_ns(), time.time_ns() + 10**9))
    with pytest.raises(DataError, match="holds token id 99"):
        TokenShards(d, "train")


@pytest.mark.parametrize("content", ["[1, 2]", "7", '{"train_000000.bin": 49}', "{"])
def test_a_damaged_scan_cache_is_made_again(tmp_path, capsys, content):
    """max_token.json holding a list, a bare number, a torn entry or half a file: one line, 'damaged: made again',
    the shards scanned again and the file rewritten (it was an AttributeError or a TypeError)."""
    from discoloop.shards import TokenShards
    d = shards(tmp_path, list(np.arange(200) % 50))
    open(f"{d}/max_token.json", "w").write(content)
    TokenShards(d, "train")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "max_token.json' is damaged" in err[0] and "made again" in err[0], err
    assert json.loads(open(f"{d}/max_token.json").read())["train_000000.bin"][2] == 49


def test_probe_on_a_pretraining_checkpoint(tmp_path):
    d = shards(tmp_path, list(np.arange(400) % 50))
    out = tmp_path / "run"
    assert run(PRETRAIN + [f"--data_dir={d}", f"--out_dir={out}", "--eval_iters=1", "--eval_interval=2"]).returncode == 0
    one_line(run(["probe.py", "lens", f"--ckpt={out}"]), "trained on token shards")


def test_offline_downloads_name_the_way_out(tmp_path):
    env = {"TIKTOKEN_CACHE_DIR": str(tmp_path / "empty_cache"), "HTTPS_PROXY": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9", "DISCOLOOP_TOKENIZERS": str(tmp_path / "no_ranks"),
           "PIP_INDEX_URL": "http://127.0.0.1:9/simple"}  # not even the package index
    r = run(["data/nl/prepare.py", f"--out_dir={tmp_path / 'nl'}"], env=env)
    one_line(r, "--tiktoken_file")


def test_auto_dtype_rule():
    """fp32 unless bf16 is measured clearly faster; no bf16 flag, no timing at all."""
    def timer(speed):
        return lambda dtype, reps: 1.0 if dtype == torch.float32 else 1.0 / speed
    assert pick_cpu_dtype(True, timer(2.0)) == "bfloat16"     # the EPYC
    assert pick_cpu_dtype(True, timer(0.4)) == "float32"      # the Xeon: 2.5x slower
    assert pick_cpu_dtype(True, timer(0.01)) == "float32"     # no AVX-512: 100x slower
    assert pick_cpu_dtype(True, timer(1.1)) == "float32"      # not clearly faster
    calls = []
    assert pick_cpu_dtype(False, lambda d, r: calls.append(d) or 1.0) == "float32" and not calls
    slow = []
    pick_cpu_dtype(True, lambda d, r: slow.append((d, r)) or (1.0 if d == torch.float32 else 100.0))
    assert slow == [(torch.float32, 5), (torch.bfloat16, 1)]  # one slow try, no repeats


def test_round5_silent_keys_and_late_checks_are_one_line(tiny_data, tmp_path):
    """Issue 56: a typed key that does nothing (train.py and bench.py alike, one validator), bench.py compile's
    phi_topk past its toy vocabulary (was clamped), phi_topk past the data's vocabulary with vocab_size=0 (was a
    traceback where the model is built), data_args silent on a field the folder records otherwise (was ignored)."""
    out = str(tmp_path / "run")
    one_line(run(tiny_train_args(tiny_data, out, "--compile_mode=reduce-overhead")), "compile_mode=", "needs compile=True")
    one_line(run(["bench.py", "step", "config/pretrain.py", "--compile=False", "--compile_mode=reduce-overhead"]),
             "compile_mode=", "needs compile=True")
    one_line(run(["lab/compile.py", "config/pretrain.py", "--phi_topk=3000", "--modes=eager"]), "phi_topk=3000",
             "vocab_size=2048")
    (tmp_path / "a").mkdir()
    d = shards(tmp_path / "a", list(np.arange(200) % 50))
    one_line(run(PRETRAIN + [f"--data_dir={d}", f"--out_dir={out}", "--phi_topk=64"]), "phi_topk=64", "vocab_size=50", d)
    d = shards(tmp_path, list(np.arange(200) % 50), meta_extra={"config": {
        "data_files": "synthetic:web", "encoding": "bytes", "tokenizer_file": "tok.json", "val_tokens": 200}})
    one_line(run(PRETRAIN + [f"--data_dir={d}", f"--out_dir={out}",
                             "--data_args={'data_files': 'synthetic:web', 'encoding': 'bytes', 'val_tokens': 200}"]),
             "data_args tokenizer_file=''", "where data_args are silent", "made with tokenizer_file='tok.json'")


def test_round5_a_file_key_made_inert_is_noted_and_recorded(tiny_data, tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text('exec(open("config/symbolic.py").read())\nphi_topk = 4\n')  # the parent, found from the repo
    out = tmp_path / "run"
    args = tiny_train_args(tiny_data, str(out), "--recurrence=loop", "--max_iters=0")
    r = run([args[0], str(cfg)] + args[2:])
    assert r.returncode == 0, r.stderr[-2000:]
    notes = [line for line in r.stderr.splitlines() if line.startswith("note: phi_topk=4 has no effect")]
    assert len(notes) == 1 and str(cfg) in notes[0], r.stderr[-2000:]
    assert list(json.loads((out / "config.json").read_text())["inert"]) == ["phi_topk"]


@pytest.mark.parametrize("meta,needle", [
    ({"kind": "qa", "splits": {"train": "train.txt"}, "vocab": ["a"]}, "splits="),
    ({"kind": "qa", "splits": {"train": {"file": "t.txt", "train": True}}, "vocab": "abc"}, "vocab='abc'"),
    ({"kind": "qa", "vocab": ["a"]}, "lacks 'splits'"),
    ({"kind": "qa", "splits": {"train": {"file": "t.txt", "train": True}}, "vocab": ["a"], "config": []}, "config="),
])
def test_meta_json_fields_are_read_checked(tmp_path, meta, needle):
    """meta.json is read by one checked reader (data_meta.read_meta): a field of the wrong type or shape, or one
    missing, is one line naming the file and the field, never a KeyError or TypeError further on."""
    from discoloop.qa_data import QAData
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="meta.json") as e:
        QAData(str(tmp_path))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_precision_is_one_decision_with_its_reason(tmp_path, monkeypatch):
    """precision.decide_dtype is train.py's one call: what was chosen and why, the model built (and timed) only where
    a CPU's 'auto' needs it, never for a given dtype, a resumed checkpoint's or a GPU's rule."""
    from discoloop.precision import decide_dtype
    monkeypatch.setenv("DISCOLOOP_DTYPE_CACHE", str(tmp_path / "c.json"))
    built = []
    make = lambda: built.append(1) or torch.nn.Linear(2, 2)
    assert decide_dtype("bfloat16", "cpu", "float32", make) == ("bfloat16", "given", {})
    assert decide_dtype("auto", "cpu", "bfloat16", make) == ("bfloat16", "the checkpoint's", {})
    assert decide_dtype("auto", "cpu", None, None) == ("float32", "", {})  # a DDP rank > 0: rank 0's answer follows
    assert not built
    monkeypatch.setattr("discoloop.precision.model_cpu_dtype", lambda m, x, y, a: ("float32", f"timed {type(m).__name__} {x}", {"float32": 1.0}))
    assert decide_dtype("auto", "cpu", None, make, lambda: ("X", "Y"), {}) == ("float32", "timed Linear X", {"float32": 1.0})
    assert built == [1]


def test_a_mistyped_ckpt_leaves_no_folder_and_a_bad_meta_kind_is_one_line(tiny_run, tiny_data, tmp_path):
    """exits.py gate, exits.py and eval_harness.py made the folders of a mistyped --ckpt before refusing it; a
    meta.json whose kind is a list was 'unhashable' (issue 72 item 5)."""
    nowhere = tmp_path / "typo" / "run"
    for args in (["exits.py", "gate", f"--ckpt={nowhere}"], ["exits.py", f"--ckpt={nowhere}"],
                 ["eval_harness.py", f"--ckpt={nowhere}", f"--json={tmp_path / 'new' / 'e.json'}"]):
        r = run(args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-1500:]
        assert not (tmp_path / "typo").exists() and not (tmp_path / "new").exists(), args
    import shutil
    bad = tmp_path / "data"
    shutil.copytree(tiny_data, bad)
    meta = json.loads((bad / "meta.json").read_text())
    for kind in (["qa"], {"qa": 1}):
        (bad / "meta.json").write_text(json.dumps({**meta, "kind": kind}))
        for args in (tiny_train_args(str(bad), str(tmp_path / "r"), "--max_iters=1"),
                     ["exits.py", f"--ckpt={tiny_run}", f"--data_dir={bad}"]):
            one_line(run(args), "kind=", "is invalid")
