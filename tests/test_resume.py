"""Nothing lost on resume: the checkpoint's config is the truth (a resume may change only checkpoint.RESUMABLE
keys, each change recorded in config.json), damaged checkpoints and ones without optimizer state are
refused, and an --eval_only row does not stand in for the run's own evaluation."""
import json
import os

import pytest
import torch

from conftest import run, tiny_train_args


def rows(out):
    drop = ("time", "cpu_time", "tok_per_s", "tflops", "mfu")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in drop} for line in f]


def one_line(r, *words):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("resume") / "run")
    r = run(tiny_train_args(tiny_data, out, "--max_iters=10", "--eval_interval=10", "--ema_decay=0.9"))
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.parametrize("change", ["--ema_decay=0", "--seed=1", "--batch_size=32", "--dtype=bfloat16",
                                    "--learning_rate=1e-3", "--label_smoothing=0.0", "--lr_decay_iters=99"])
def test_resume_refuses_what_the_weights_were_not_trained_with(trained, tiny_data, change):
    before = open(os.path.join(trained, "ckpt.pt"), "rb").read()
    r = run(tiny_train_args(tiny_data, trained, "--max_iters=20", "--eval_interval=10", "--ema_decay=0.9",
                            "--init_from=resume", change))
    key = change[2:].split("=")[0]
    one_line(r, f"{key}: the checkpoint was trained with", "a resume may change only")
    assert open(os.path.join(trained, "ckpt.pt"), "rb").read() == before


def test_resume_may_change_the_budget_and_config_json_records_it(trained, tiny_data, tmp_path):
    import shutil
    out = str(tmp_path / "copy")
    shutil.copytree(trained, out)
    r = run(tiny_train_args(tiny_data, out, "--max_iters=20", "--eval_interval=5", "--ema_decay=0.9",
                            "--init_from=resume", "--log_interval=5"))
    assert r.returncode == 0, r.stderr
    with open(os.path.join(out, "config.json")) as f:
        c = json.load(f)
    assert c["max_iters"] == 20 and c["dtype_resolved"] == "float32"
    assert len(c["resumes"]) == 1 and c["resumes"][0]["iter"] == 10
    assert c["resumes"][0]["changed"] == {"max_iters": [10, 20], "eval_interval": [10, 5], "log_interval": [10, 5],
                                          "out_dir": [trained, out]}  # moved folders are recorded too
    assert "ema" in torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    # a kernel may change on resume (equal numbers), but this run's Phi is exact: it has none, said in one line
    one_line(run(tiny_train_args(tiny_data, out, "--max_iters=20", "--eval_interval=5", "--ema_decay=0.9",
                                 "--init_from=resume", "--phi_kernel=csr")), "phi_kernel='csr' has no effect")


def test_flipped_bytes_in_tensor_data_are_found(trained, tmp_path):
    from discoloop.checkpoint import CheckpointError, load_checkpoint
    path = str(tmp_path / "ckpt.pt")
    blob = bytearray(open(os.path.join(trained, "ckpt.pt"), "rb").read())
    ck = torch.load(os.path.join(trained, "ckpt.pt"), weights_only=True)
    w = ck["model"]["transformer.wte.weight"]
    needle = w.reshape(-1)[100:104].numpy().tobytes()  # 16 bytes of the embedding, found in the zip's data
    at = bytes(blob).index(needle)
    blob[at + 1] ^= 0x40
    open(path, "wb").write(bytes(blob))
    loaded = torch.load(path, weights_only=True)  # torch reads it without complaint ...
    assert not torch.equal(loaded["model"]["transformer.wte.weight"], w)
    with pytest.raises(CheckpointError, match="is damaged"):  # ... the checksum does not
        load_checkpoint(path)


def test_checkpoint_without_optimizer_state_is_refused(trained, tiny_data, tmp_path):
    import shutil
    from discoloop.checkpoint import save_checkpoint
    out = str(tmp_path / "noopt")
    shutil.copytree(trained, out)
    ck = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    ck.pop("crc32")
    save_checkpoint({**ck, "optimizers": []}, os.path.join(out, "ckpt.pt"))
    r = run(tiny_train_args(tiny_data, out, "--max_iters=20", "--ema_decay=0.9", "--init_from=resume"))
    one_line(r, "no optimizer state")


def test_eval_only_after_an_abandoned_evaluation_changes_nothing(tiny_data, tmp_path):
    """A stop during the evaluation at iteration 10 saves the checkpoint without that row; --eval_only then
    appends its own row at 10; the resumed run must still evaluate 10 itself (the curriculum and early-stop
    rules read only the run's rows) and end as the uninterrupted run did."""
    live, cut = str(tmp_path / "live"), str(tmp_path / "cut")
    args = ["--eval_interval=10", "--split_join={'train_id': 'acc/val_id>=0.0'}"]
    assert run(tiny_train_args(tiny_data, live, "--max_iters=20", *args), fresh=True).returncode == 0
    assert run(tiny_train_args(tiny_data, cut, "--max_iters=10", *args)).returncode == 0
    with open(os.path.join(cut, "metrics.jsonl")) as f:
        kept = f.readlines()[:-1]  # the evaluation at 10 abandoned: as a stop during it leaves the folder
    with open(os.path.join(cut, "metrics.jsonl"), "w") as f:
        f.writelines(kept)
    r = run(tiny_train_args(tiny_data, cut, "--max_iters=10", *args, "--eval_only=True"))
    assert r.returncode == 0, r.stderr
    r = run(tiny_train_args(tiny_data, cut, "--max_iters=20", *args, "--init_from=resume"))
    assert r.returncode == 0, r.stderr
    assert [m for m in rows(cut) if not m.get("eval_only")] == rows(live)
    a, b = (torch.load(os.path.join(d, "ckpt.pt"), weights_only=True)["model"] for d in (live, cut))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_holding_nonfinite_optimizer_state_is_named(trained, tiny_data, tmp_path):
    """Weights finite, AdamW's second moment inf: the resume stops at once and blames the file itself (it never
    calls that file "the last good checkpoint"); our own saves are checked, weights and optimizer state alike."""
    import shutil
    from discoloop.checkpoint import save_checkpoint
    out = str(tmp_path / "inf")
    shutil.copytree(trained, out)
    ck = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    ck.pop("crc32")
    state = ck["optimizers"][0]["state"]
    next(iter(state.values()))["exp_avg_sq"].fill_(float("inf"))
    save_checkpoint(ck, os.path.join(out, "ckpt.pt"))
    r = run(tiny_train_args(tiny_data, out, "--max_iters=20", "--eval_interval=10", "--ema_decay=0.9",
                            "--init_from=resume"))
    one_line(r, "holds non-finite weights or optimizer state")
    assert "last good checkpoint" not in r.stderr
