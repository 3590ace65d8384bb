"""A data folder says what it is (meta.json: kind, generator, config), and a script deletes or rewrites only
a folder it can prove it made: anything else is one line, exit 2, and every file stays as it was."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, TINY_DATA, prepared, run, tiny_train_args

TOKENS = ["--data_files=synthetic:web", "--weights=1", "--encoding=bytes", "--max_tokens=6000",
          "--val_tokens=1000", "--shard_tokens=2000", "--num_proc=1"]


def snapshot(folder):
    """{relative path: sha256} of every file under folder."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return prepared(tmp_path_factory, "data/pretrain/prepare.py", TOKENS)


def refused(r, *words):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.stderr[-2000:]
    for w in words:
        assert w in lines[0], lines[0]


def test_meta_names_kind_and_generator(tiny_data, shards):
    for folder, kind, gen in ((tiny_data, "qa", "symbolic"), (shards, "tokens", "pretrain")):
        with open(os.path.join(folder, "meta.json")) as f:
            meta = json.load(f)
        assert (meta["kind"], meta["generator"]) == (kind, gen)


def test_qa_prepare_and_train_leave_a_token_folder_alone(shards, tmp_path):
    before = snapshot(shards)
    refused(run(["data/symbolic/prepare.py", f"--out_dir={shards}"] + TINY_DATA), "'tokens'", "left untouched")
    refused(run(tiny_train_args(shards, str(tmp_path / "run"), "--max_iters=1")), "left untouched")
    assert snapshot(shards) == before


def test_other_generators_leave_a_symbolic_folder_alone(tiny_data, tmp_path):
    copy = str(tmp_path / "sym")
    shutil.copytree(tiny_data, copy)
    before = snapshot(copy)
    # nl refuses before it needs its tokenizer; pretrain refuses before writing a shard or meta.json
    refused(run(["data/nl/prepare.py", f"--out_dir={copy}"] + TINY_DATA), "data/nl/prepare.py", "left untouched")
    refused(run(["data/pretrain/prepare.py", f"--out_dir={copy}"] + TOKENS), "'qa'", "left untouched")
    assert snapshot(copy) == before


def test_folders_from_before_kind_are_refused(tiny_data, tmp_path):
    """A folder written before meta.json named kind/generator (retired inference): one line, untouched."""
    copy = str(tmp_path / "old")
    shutil.copytree(tiny_data, copy)
    path = os.path.join(copy, "meta.json")
    with open(path) as f:
        meta = json.load(f)
    del meta["kind"], meta["generator"]
    with open(path, "w") as f:
        json.dump(meta, f)
    before = snapshot(copy)
    refused(run(["data/symbolic/prepare.py", f"--out_dir={copy}"] + TINY_DATA), "left untouched")
    assert snapshot(copy) == before


def foreign_folders(root, tiny_data):
    """A Hugging Face model, a prepared model folder, an export and a dataset: folders train.py did not write."""
    hf, model, export = root / "hf", root / "smollm2", root / "export"
    for folder, config in ((hf, {"model_type": "llama"}), (model, {"model_type": "llama"}),
                           (export, {"model_type": "discoloop"})):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        (folder / "model.safetensors").write_bytes(b"weights")
    (model / "meta.json").write_text(json.dumps({"kind": "model", "generator": "smollm2", "config": {}}))
    data = root / "data"
    shutil.copytree(tiny_data, data)
    return {"a Hugging Face model": hf, "data/smollm2/prepare.py": model, "export_hf.py": export,
            "data/symbolic/prepare.py": data}


def test_train_writes_only_into_its_own_run_folder(tiny_data, tmp_path):
    """Round 4's lost work: train.py's config.json replaced a Hugging Face folder's. Every folder train.py did not
    write is one line, exit 2, every file as it was; a run folder (its own) is used as before."""
    for who, folder in foreign_folders(tmp_path, tiny_data).items():
        before = snapshot(folder)
        refused(run(tiny_train_args(tiny_data, str(folder), "--max_iters=1")), who, "not train.py's")
        assert snapshot(folder) == before, who
    notes = tmp_path / "notes"  # a user's metrics.jsonl (a run file's name) beside their notes: not train.py's
    notes.mkdir()
    (notes / "metrics.jsonl").write_text('{"iter": 0}\n')
    (notes / "notes.txt").write_text("mine")
    before = snapshot(notes)
    refused(run(tiny_train_args(tiny_data, str(notes), "--max_iters=1")), "unknown files", "no run.lock")
    assert snapshot(notes) == before
    own = str(tmp_path / "run")
    assert run(tiny_train_args(tiny_data, own, "--max_iters=1")).returncode == 0
    r = run(tiny_train_args(tiny_data, own, "--max_iters=2", "--init_from=resume"))
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_folder_that_is_not_a_dataset_is_left_alone(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("my work")
    refused(run(["data/symbolic/prepare.py", f"--out_dir={folder}"] + TINY_DATA), "unknown files", "left untouched")
    refused(run(["data/pretrain/prepare.py", f"--out_dir={folder}"] + TOKENS), "unknown files")
    refused(run(["export_hf.py", "--ckpt=nothing.pt", f"--out_dir={folder}", "--overwrite=True"]), "unknown files")
    assert os.listdir(folder) == ["notes.txt"] and (folder / "notes.txt").read_text() == "my work"


def test_symbolic_config_on_an_nl_folder_is_refused(tiny_data, tmp_path):
    """dataset='nl' with a symbolic folder: the folder's generator decides, not the config's name."""
    copy = str(tmp_path / "sym")
    shutil.copytree(tiny_data, copy)
    args = tiny_train_args(copy, str(tmp_path / "run"), "--max_iters=1", "--dataset=nl")
    refused(run(args), "left untouched")


def test_two_prepares_of_one_folder_take_turns(tmp_path):
    out = str(tmp_path / "shared")
    cmd = [sys.executable, "data/symbolic/prepare.py", f"--out_dir={out}"] + TINY_DATA
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in results]
    from discoloop.qa_data import QAData
    assert QAData(out).vocab_size > 0  # complete and verified (checksums)
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


def test_prepare_under_a_file_is_one_line(tmp_path):
    """--out_dir=<a file>/out: the shared lock made the parent folder and raised FileExistsError; now one line."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    for script, args in (("data/symbolic/prepare.py", TINY_DATA), ("data/pretrain/prepare.py", TOKENS),
                         ("data/smollm2/prepare.py", [])):
        refused(run([script, f"--out_dir={afile / 'out'}"] + args), "a file", "choose a folder")
    assert afile.read_text() == "x"


def test_a_cut_shard_is_found_when_the_corpus_is_prepared_again(shards, tmp_path):
    """Preparing a finished token folder again said 'wrote' over a truncated shard; now one line, nothing touched."""
    copy = tmp_path / "tok"
    shutil.copytree(shards, copy)
    with open(copy / "train_000001.bin", "r+b") as f:
        f.truncate(1000)
    before = snapshot(str(copy))
    refused(run(["data/pretrain/prepare.py", f"--out_dir={copy}"] + TOKENS), "train_000001.bin", "damaged")
    assert snapshot(str(copy)) == before
