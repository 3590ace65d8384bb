"""No run loses work: failed saves leave no orphans, one run per out_dir, no silent overwrite,
eval_only changes nothing, interruptions keep every row, torn metrics lines, DDP preemption."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from discoloop.checkpoint import CheckpointError, save_checkpoint
from discoloop.runlog import read_metrics
from conftest import REPO, prepared, run, tiny_train_args


def start(args, **env):
    return subprocess.Popen([sys.executable] + args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, OMP_NUM_THREADS="1", **env))


def wait_for(path, p, timeout=120):
    t_end = time.time() + timeout
    while not os.path.exists(path):
        assert p.poll() is None and time.time() < t_end, p.communicate()
        time.sleep(0.05)


def rows(out):
    return read_metrics(os.path.join(out, "metrics.jsonl"))


def test_failed_save_removes_its_temp_file(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt.pt")

    def disk_full(obj, f):
        f.write(b"partial bytes")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(CheckpointError, match="No space left on device"):
        save_checkpoint({"a": 1}, path)
    assert os.listdir(tmp_path) == []


def test_start_clears_temp_files_of_dead_runs(tiny_data, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "ckpt.pt.tmp-discoloop-999999-0123456789abcdef").write_bytes(b"x" * 100)  # a dead run's own temp file
    (out / "run.lock").write_text("999999")  # the dead run's lock: what proves the folder train.py's
    assert run(tiny_train_args(tiny_data, str(out), "--max_iters=5", "--eval_interval=5")).returncode == 0
    assert not [f for f in os.listdir(out) if ".tmp-" in f]


# A user's files whose names look like the project's temp files or checkpoints: no start, resume, kill or
# overwrite of the run in that folder may delete or change them (the cleanup matches common.TMP_RE exactly).
LOOKALIKES = ["notes.tmp-1", "ckpt.pt.tmp-999999", "x.tmp-discoloop", "a.tmp-discoloop-12-xyz",
              "ckpt.pt.tmp-discoloop-1-0123456789ABCDEF", "ckpt_notes.pt", "ckpt_.pt", "ckpt.pt.bak", "my.tmp-draft.txt"]


def test_a_users_lookalike_files_survive_resume_kill_and_overwrite(tiny_data, tmp_path):
    out = str(tmp_path / "run")
    assert run(tiny_train_args(tiny_data, out, "--max_iters=10", "--eval_interval=5")).returncode == 0
    mine = {}
    for i, name in enumerate(LOOKALIKES):
        mine[name] = f"user data {i}".encode()
        open(os.path.join(out, name), "wb").write(mine[name])
    def intact():
        assert {n: open(os.path.join(out, n), "rb").read() for n in LOOKALIKES} == mine
    assert run(tiny_train_args(tiny_data, out, "--init_from=resume", "--max_iters=20", "--eval_interval=5")).returncode == 0
    intact()
    p = start(tiny_train_args(tiny_data, out, "--init_from=resume", "--max_iters=100000", "--eval_interval=20"))
    t_end = time.time() + 120
    while len(rows(out)) < 5 and time.time() < t_end and p.poll() is None:  # a few rows past the resume, then a kill
        time.sleep(0.05)
    p.kill()
    p.communicate()
    intact()
    r = run(tiny_train_args(tiny_data, out, "--max_iters=5", "--eval_interval=5", "--overwrite=True", "--keep_every=5"))
    assert r.returncode == 0, r.stderr
    intact()
    assert "ckpt_5.pt" in os.listdir(out)


def test_one_run_per_out_dir_and_a_killed_run_does_not_block(tiny_data, tmp_path):
    out = str(tmp_path / "run")
    p = start(tiny_train_args(tiny_data, out, "--max_iters=100000", "--eval_interval=20"))
    wait_for(os.path.join(out, "metrics.jsonl"), p)
    r = run(tiny_train_args(tiny_data, out, "--init_from=resume", "--max_iters=10"))
    assert r.returncode == 2 and f"PID {p.pid}" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    before = open(os.path.join(out, "metrics.jsonl")).read()
    assert before.strip()  # the second run deleted nothing
    wait_for(os.path.join(out, "ckpt.pt"), p)
    p.kill()
    p.communicate()
    r = run(tiny_train_args(tiny_data, out, "--init_from=resume", "--max_iters=45", "--eval_interval=20"))
    assert r.returncode == 0, r.stderr


def test_scratch_over_a_checkpoint_needs_the_key(tiny_data, tmp_path):
    out = str(tmp_path / "run")
    assert run(tiny_train_args(tiny_data, out, "--max_iters=10", "--eval_interval=5")).returncode == 0
    ckpt, metrics = open(f"{out}/ckpt.pt", "rb").read(), open(f"{out}/metrics.jsonl").read()
    r = run(tiny_train_args(tiny_data, out, "--max_iters=10"))
    assert r.returncode == 2 and "--overwrite=True" in r.stderr and "--init_from=resume" in r.stderr
    assert open(f"{out}/ckpt.pt", "rb").read() == ckpt and open(f"{out}/metrics.jsonl").read() == metrics
    assert run(tiny_train_args(tiny_data, out, "--max_iters=5", "--eval_interval=5", "--overwrite=True")).returncode == 0
    assert [r["iter"] for r in rows(out)] == [0, 5]


@pytest.mark.parametrize("init_from", ["scratch", "resume"])
def test_eval_only_evaluates_the_checkpoint_and_writes_no_weights(tiny_data, tmp_path, init_from):
    out = str(tmp_path / "run")
    assert run(tiny_train_args(tiny_data, out, "--max_iters=20", "--eval_interval=10")).returncode == 0
    files = {f: open(os.path.join(out, f), "rb").read() for f in ("ckpt.pt", "config.json")}
    before = rows(out)
    r = run(tiny_train_args(tiny_data, out, "--eval_only=True", f"--init_from={init_from}"))
    assert r.returncode == 0, r.stderr
    after = rows(out)
    assert after[:-1] == before and after[-1]["eval_only"] and after[-1]["iter"] == 20
    assert after[-1]["acc/test_id"] == before[-1]["acc/test_id"]  # the trained weights, not a fresh model
    assert {f: open(os.path.join(out, f), "rb").read() for f in files} == files
    r = run(tiny_train_args(tiny_data, str(tmp_path / "empty"), "--eval_only=True"))
    assert r.returncode == 2 and "not found" in r.stderr


SLOW = {"n_entities": 150, "n_relations": 8, "out_degree": 6, "n_train": 1500, "n_test": 1500, "n_val": 1500}


@pytest.fixture(scope="module")
def slow_data(tmp_path_factory):
    """A graph whose evaluation takes seconds at --eval_batch_size=1 (7,800 questions, one forward each, a
    stop request checked before each): room to send signals during an evaluation, with no test hook."""
    return prepared(tmp_path_factory, "data/symbolic/prepare.py", [f"--{k}={v}" for k, v in SLOW.items()])


def slow_args(data, out, *extra):
    args = [a for a in tiny_train_args(data, out, *extra) if not a.startswith(("--data_args", "--eval_batch_size"))]
    return args + [f"--data_args={SLOW}"] + ([] if any(a.startswith("--eval_batch_size") for a in extra)
                                             else ["--eval_batch_size=1"])


def test_stop_at_an_evaluation_boundary_keeps_the_row(slow_data, tmp_path):
    """SIGTERM during an evaluation abandons it at once; the resumed run evaluates that iteration,
    and rows right after a resume carry loss and lr."""
    out = str(tmp_path / "run")
    slow = ["--eval_interval=10", "--max_iters=30", "--log_interval=5"]
    p = start(slow_args(slow_data, out, *slow))
    wait_for(os.path.join(out, "ckpt.pt"), p)  # iteration 10 saved: the evaluation of 20 comes next
    while not any(r["iter"] == 10 for r in rows(out)):
        time.sleep(0.05)
    time.sleep(0.5)
    t = time.time()
    p.send_signal(signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 0 and "checkpoint saved" in stdout, stderr
    assert time.time() - t < 30
    r = run(slow_args(slow_data, out, *slow, "--init_from=resume", "--eval_batch_size=2048"))  # may change on resume
    assert r.returncode == 0, r.stderr
    its = [r["iter"] for r in rows(out)]
    assert its == sorted(set(its)) and {0, 10, 20, 30} <= set(its), its
    assert all("loss" in r and "lr" in r for r in rows(out) if r["iter"] > 0)


def test_stop_during_the_first_evaluation_claims_no_checkpoint(slow_data, tmp_path):
    out = str(tmp_path / "run")
    p = start(slow_args(slow_data, out, "--max_iters=100000"), PYTHONUNBUFFERED="1")
    while "parameters" not in p.stdout.readline():  # imports and data done (a fixed sleep raced them on a busy machine)
        assert p.poll() is None, p.communicate()
    time.sleep(0.5)  # the signal handlers are set, the (seconds-long) iteration-0 evaluation is under way
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 0, stderr
    saved = os.path.exists(os.path.join(out, "ckpt.pt"))
    assert ("checkpoint saved" in stdout) == saved and ("no checkpoint was written" in stdout) == (not saved)


def test_second_interrupt_stops_at_once(slow_data, tmp_path):
    out = str(tmp_path / "run")
    # one evaluation batch of a wider model takes seconds: the first signal is noticed only after it
    big = ["--n_embd=512", "--n_layer=4", "--n_head=8", "--eval_batch_size=4096"]
    p = start(slow_args(slow_data, out, "--max_iters=100000", *big), PYTHONUNBUFFERED="1")
    while "parameters" not in p.stdout.readline():  # started; the iteration-0 evaluation comes next
        assert p.poll() is None, p.communicate()
    time.sleep(0.3)  # ... and is under way (seconds long): both signals land inside it
    p.send_signal(signal.SIGINT)
    time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=30)
    assert p.returncode == 130 and "second SIGINT" in stderr and len(stderr.strip().splitlines()) == 1, stderr


def test_torn_metrics_line_never_blocks(tiny_data, tmp_path):
    out = str(tmp_path / "run")
    assert run(tiny_train_args(tiny_data, out, "--max_iters=10", "--eval_interval=5")).returncode == 0
    with open(f"{out}/metrics.jsonl", "a") as f:
        f.write('{"iter": 15, "acc/te')
    r = run(tiny_train_args(tiny_data, out, "--max_iters=15", "--eval_interval=5", "--init_from=resume"))
    assert r.returncode == 0 and "torn line" in r.stderr, r.stderr
    assert [m["iter"] for m in rows(out)] == [0, 5, 10, 15]
    with open(f"{out}/metrics.jsonl", "a") as f:
        f.write('{"iter": 20, "acc/te')
    r = run(["probe.py", "plot", out, f"--png={tmp_path}/c.png", f"--json={tmp_path}/c.json"])
    assert r.returncode == 0 and "torn line" in r.stderr, r.stderr


def children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


@pytest.mark.parametrize("who", ["rank1", "rank1_first"])
def test_ddp_preemption_ranks_agree_and_rank0_saves(tiny_data, tmp_path, who):
    out = str(tmp_path / "run")
    p = start(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
              + tiny_train_args(tiny_data, out, "--max_iters=100000", "--eval_interval=20", "--gradient_accumulation_steps=2"))
    wait_for(os.path.join(out, "ckpt.pt"), p, timeout=240)
    kids = children(p.pid)
    assert len(kids) == 2
    ranks = {}
    for k in kids:  # torchrun sets RANK in each child's environment
        env = open(f"/proc/{k}/environ", "rb").read().split(b"\0")
        ranks[int(next(e for e in env if e.startswith(b"RANK=")).split(b"=")[1])] = k
    os.kill(ranks[1], signal.SIGTERM)
    if who == "rank1_first":
        time.sleep(0.3)
        os.kill(ranks[0], signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 0, stderr[-3000:]
    assert "stopped at iteration" in stdout and "checkpoint saved" in stdout
    it = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["iter_num"]
    assert it > 20


def test_early_stop_row_rule():
    from discoloop.runlog import early_stop_row
    rows = [{"iter": i, "loss/val_id": v} for i, v in enumerate([5, 4, 3, 3.5, 3, 3.2, 2.9, 3.0, 3.1, 3.3])]
    # best 3 at row 2 (a tie at row 4 is no improvement); patience 2 -> stop at row 4
    assert early_stop_row(rows, "loss/val_id", 2) == 4
    assert early_stop_row(rows, "loss/val_id", 3) == 5
    assert early_stop_row(rows, "loss/val_id", 4) is None  # new best 2.9 at row 6, only 3 evaluations follow
    acc = [{"iter": i, "acc/val_id": v} for i, v in enumerate([0.1, 0.5, 0.5, 0.4])]
    assert early_stop_row(acc, "acc/val_id", 2) == 3  # higher is better for accuracy
    # rows without the metric (training-loss rows, eval_only rows) are not evaluations of the run
    mixed = [{"iter": 0, "acc/val_id": 0.5}, {"iter": 1, "loss": 1.0}, {"iter": 2, "acc/val_id": 0.4, "eval_only": True},
             {"iter": 3, "acc/val_id": 0.4}]
    assert early_stop_row(mixed, "acc/val_id", 1) == 3 and early_stop_row(mixed, "acc/val_id", 2) is None


def test_an_earlier_runs_work_is_not_replaced_without_overwrite(tiny_data, tmp_path):
    """A run folder whose ckpt.pt is gone still holds an earlier run's metrics.jsonl and kept checkpoints: a new run
    there is one line (resume it, or --overwrite=True), as with ckpt.pt; a folder where run.lock should be is one line."""
    out = tmp_path / "run"
    assert run(tiny_train_args(tiny_data, str(out), "--max_iters=4", "--eval_interval=2", "--keep_every=2")).returncode == 0
    os.remove(out / "ckpt.pt")
    rows = (out / "metrics.jsonl").read_text()
    r = run(tiny_train_args(tiny_data, str(out), "--max_iters=4"))
    assert r.returncode == 2 and "an earlier run's ckpt_2.pt" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert (out / "metrics.jsonl").read_text() == rows
    lock = tmp_path / "lock"
    (lock / "run.lock").mkdir(parents=True)
    r = run(tiny_train_args(tiny_data, str(lock), "--max_iters=1"))
    assert r.returncode == 2 and "run.lock" in r.stderr and "is a folder" in r.stderr, r.stderr
