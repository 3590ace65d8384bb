"""tokenizer.py: a checkpoint carries its tokenizer, so a re-prepared data folder or a replaced tokenizer file
cannot make sample.py or the export read it with another one; offline fetches fail in one line."""
import json
import os
import shutil

import pytest
import torch

import tokenizer
from checkpoint import load_checkpoint
from common import DataError
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
    assert tokenizer.tokenizer_for(load_checkpoint(out)).vocab == vocab  # the checkpoint's, not the folder's
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
    from common import pip_download
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
    from common import ConfigError
    with pytest.raises(ConfigError, match="has no folder 'nope'"):
        prep.open_source("sdist:plays==1.0:nope", "text")
    with pytest.raises(ConfigError, match="not found"):  # a missing file or folder says that it is missing
        next(prep.open_source(str(tmp_path / "missing_texts"), "text"))
