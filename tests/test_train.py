"""train.py end to end on a tiny graph: metrics, checkpoints, resume, kill-safety, bad input."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO, run, tiny_train_args


def metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def stable(m):  # everything but wall-clock figures
    return {k: v for k, v in m.items() if k not in ("time", "cpu_time", "tok_per_s", "tflops", "mfu")}


def test_train_then_resume(tiny_data, tmp_path):
    out = str(tmp_path / "run")
    r = run(tiny_train_args(tiny_data, out, "--max_iters=30", "--eval_interval=10"))
    assert r.returncode == 0, r.stderr
    ms = metrics(out)
    assert [m["iter"] for m in ms] == [0, 10, 20, 30]
    assert {"acc/test_id", "acc/test_ood", "acc/train_atom", "acc1/train_id", "acc1/train_atom"} <= set(ms[-1])
    assert "acc1/test_ood" not in ms[-1]  # Stage-1 where plots and rules read it: training splits by default
    ck = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert ck["iter_num"] == 30 and ck["dtype_resolved"] == "float32"
    assert ck["elapsed"] >= ms[-1]["time"] > 0
    r = run(tiny_train_args(tiny_data, out, "--max_iters=50", "--eval_interval=10", "--init_from=resume"))
    assert r.returncode == 0, r.stderr
    assert [m["iter"] for m in metrics(out)] == [0, 10, 20, 30, 40, 50]
    times = [m["time"] for m in metrics(out)]
    assert times == sorted(times) and times[4] > ck["elapsed"]  # wall time continues across the resume
    cpu = [m["cpu_time"] for m in metrics(out)]
    assert cpu == sorted(cpu) and cpu[4] > ck["cpu_elapsed"] > 0  # and so does CPU time (budgets on a shared CPU)


def test_early_stop_on_validation_then_resume_takes_the_same_decision(tiny_data, tmp_path):
    """stop_metric reads only the validation split; a resumed run recomputes the decision from
    metrics.jsonl, so it stops where the uninterrupted run stopped, and more patience continues."""
    out = str(tmp_path / "run")
    # lr 0: val accuracy never changes, so the first evaluation stays the best (ties keep the first)
    args = ["--max_iters=100", "--eval_interval=5", "--stop_metric=acc/val_id", "--stop_patience=2",
            "--learning_rate=1e-9", "--min_lr=0"]
    r = run(tiny_train_args(tiny_data, out, *args))
    assert r.returncode == 0, r.stderr
    assert [m["iter"] for m in metrics(out)] == [0, 5, 10] and "early stop at iteration 10" in r.stdout
    assert torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["iter_num"] == 10
    r = run(tiny_train_args(tiny_data, out, *args, "--init_from=resume"))
    assert r.returncode == 0 and "early stop at iteration 10" in r.stdout, r.stderr
    assert [m["iter"] for m in metrics(out)] == [0, 5, 10]
    r = run(tiny_train_args(tiny_data, out, *args[:-3], "--stop_patience=4", "--learning_rate=1e-9",
                            "--min_lr=0", "--init_from=resume"))
    assert r.returncode == 0, r.stderr
    assert [m["iter"] for m in metrics(out)] == [0, 5, 10, 15, 20] and "loss/val_id" in metrics(out)[-1]


def test_resume_keeps_the_checkpoint_dtype(tiny_data, tmp_path):
    """dtype='auto' is decided by a timing on CPU; a resumed run must not re-decide it."""
    out = str(tmp_path / "run")
    r = run(tiny_train_args(tiny_data, out, "--max_iters=4", "--eval_interval=4", "--dtype=bfloat16"))
    assert r.returncode == 0, r.stderr
    assert torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["dtype_resolved"] == "bfloat16"
    r = run(tiny_train_args(tiny_data, out, "--max_iters=8", "--eval_interval=4", "--init_from=resume", "--dtype=auto"))
    assert r.returncode == 0, r.stderr
    assert "dtype bfloat16" in r.stdout


def test_learns_atoms(tiny_data, tmp_path):
    """Can fail: a broken loss/optimizer/data path would not memorize the 240 atomic facts."""
    out = str(tmp_path / "run")
    r = run(tiny_train_args(tiny_data, out, "--max_iters=600", "--eval_interval=600", "--n_embd=64",
                            "--weight_decay=0.0", "--label_smoothing=0.0", "--ema_decay=0"))
    assert r.returncode == 0, r.stderr
    assert metrics(out)[-1]["acc/train_atom"] > 0.9


def start(args):
    return subprocess.Popen([sys.executable] + args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_sigkill_anytime_then_resume_is_bit_identical(tiny_data, tmp_path):
    common = ["--max_iters=80", "--eval_interval=10", "--ema_decay=0.9"]  # EMA state must survive too
    ref = str(tmp_path / "ref")
    assert run(tiny_train_args(tiny_data, ref, *common)).returncode == 0
    out = str(tmp_path / "killed")
    for attempt in range(3):  # kill at random moments (possibly mid-checkpoint-write), resume each time
        args = tiny_train_args(tiny_data, out, *common, *(["--init_from=resume"] if attempt else []))
        p = start(args)
        ck = os.path.join(out, "ckpt.pt")
        t_end = time.time() + 60
        while not os.path.exists(ck) and time.time() < t_end and p.poll() is None:
            time.sleep(0.05)
        time.sleep(random.uniform(0.0, 1.0))
        p.kill()
        p.communicate()
    r = run(tiny_train_args(tiny_data, out, *common, "--init_from=resume"))
    assert r.returncode == 0, r.stderr
    assert [stable(m) for m in metrics(out)] == [stable(m) for m in metrics(ref)]
    a = torch.load(os.path.join(ref, "ckpt.pt"), weights_only=True)
    b = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    for part in ("model", "ema"):
        assert all(torch.equal(a[part][k], b[part][k]) for k in a[part])
    assert not torch.equal(a["model"]["transformer.wte.weight"], a["ema"]["transformer.wte.weight"])


def test_sigterm_saves_and_exits_cleanly(tiny_data, tmp_path):
    out = str(tmp_path / "run")
    p = start(tiny_train_args(tiny_data, out, "--max_iters=100000", "--eval_interval=50"))
    while not os.path.exists(os.path.join(out, "metrics.jsonl")):
        time.sleep(0.05)
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 0, stderr
    assert "stopped at iteration" in stdout
    it = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["iter_num"]
    assert 0 < it < 100000


def constant_rate(args):
    """A decay_lr=False command: without the tests' --warmup_iters, which a constant rate ignores (typed: refused)."""
    return [a for a in args if not a.startswith("--warmup_iters")]


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tiny_data, tmp_path):
    out = str(tmp_path / "run")
    assert run(tiny_train_args(tiny_data, out, "--max_iters=10", "--eval_interval=10")).returncode == 0
    # a resume may not change the learning rate (the checkpoint's config is the truth): give the checkpoint a
    # run that diverges from here on, as a run whose schedule blows up at iteration 10 would have
    from discoloop.checkpoint import save_checkpoint
    diverge = {"learning_rate": 1e30, "grad_clip": 0.0, "decay_lr": False, "warmup_iters": 200}  # a constant rate
    ck = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    ck.pop("crc32")
    save_checkpoint({**ck, "config": {**ck["config"], **diverge}}, os.path.join(out, "ckpt.pt"))
    before = open(os.path.join(out, "ckpt.pt"), "rb").read()
    r = run(constant_rate(tiny_train_args(tiny_data, out, "--max_iters=100", "--eval_interval=10", "--init_from=resume",
                                          "--learning_rate=1e30", "--grad_clip=0.0", "--decay_lr=False")))
    assert r.returncode == 2
    assert "non-finite" in r.stderr and "iteration 10) is kept" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert open(os.path.join(out, "ckpt.pt"), "rb").read() == before


@pytest.mark.parametrize("eval_interval", [1, 2])
def test_divergence_never_saves_nonfinite_weights(tiny_data, tmp_path, eval_interval):
    """An update that makes the weights non-finite is caught before the next evaluation saves them."""
    out = str(tmp_path / "run")
    r = run(constant_rate(tiny_train_args(tiny_data, out, "--learning_rate=1e30", "--decay_lr=False",
                                          f"--eval_interval={eval_interval}", "--max_iters=6")))
    assert r.returncode == 2 and "non-finite" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    path = os.path.join(out, "ckpt.pt")
    if os.path.exists(path):
        model = torch.load(path, weights_only=True)["model"]
        assert all(torch.isfinite(v).all() for v in model.values() if v.is_floating_point())
        assert "is kept" in r.stderr
    else:
        assert "no checkpoint was written" in r.stderr


@pytest.mark.parametrize("extra,needle", [
    (["--n_loop=0"], "n_loop=0"),
    (["--phi_tau=-1"], "phi_tau=-1"),
    (["--n_head=5"], "n_head=5"),
    (["--recurence=loop"], "did you mean 'recurrence'"),
    (["--batch_size=big"], "batch_size='big'"),
    (["--block_size=2"], "block_size=2"),
    (["--optimizer=sgd"], "optimizer='sgd'"),
    (["--init_from=resume"], "not found"),
    (["--ema_decay=1.5"], "ema_decay=1.5"),
    (["--stop_metric=acc/test_ood"], "stop_metric='acc/test_ood'"),
    (["--stop_metric=acc/val_ood"], "stop_metric='acc/val_ood' is not among"),
    (["--stop_metric=loss/val_id", "--stop_patience=0"], "stop_patience=0"),
    (["--pos_shift=6"], "pos_shift=6 with training sequences of 3 tokens needs block_size >= 9"),
    (["--loops_by_hops=True", "--n_loop=1", "--recurrence=loop"],
     "split 'train_id' needs 2 loops (2 hops), more than n_loop=1 trained loops: allowed n_loop >= 2"),
    (["--loops_by_hops=True", "--extra_loops=1"],
     "split 'train_id' needs 3 loops (2 hops + extra_loops=1), more than n_loop=2 trained loops: allowed n_loop >= 3"),
    (["--extra_loops=1", "--n_loop=3"], "extra_loops=1 adds loops to loops_by_hops's; allowed 0 without it"),
    (["--extra_loops=-1"], "extra_loops=-1 is invalid: allowed an integer >= 0"),
])
def test_bad_input_one_line(tiny_data, tmp_path, extra, needle):
    r = run(tiny_train_args(tiny_data, str(tmp_path / "run"), "--max_iters=5", *extra))
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_missing_config_file(tmp_path):
    r = run(["train.py", "config/nope.py"])
    assert r.returncode == 2 and r.stderr.strip() == "error: config file 'config/nope.py' not found"


def test_resume_with_other_model_or_data_refused(tiny_data, tmp_path):
    out = str(tmp_path / "run")
    assert run(tiny_train_args(tiny_data, out, "--max_iters=10", "--eval_interval=10")).returncode == 0
    r = run(tiny_train_args(tiny_data, out, "--max_iters=20", "--init_from=resume", "--n_embd=64"))
    assert r.returncode == 2 and "n_embd" in r.stderr
    other = str(tmp_path / "other")
    prep = run(["data/symbolic/prepare.py", f"--out_dir={other}", "--n_entities=30", "--n_relations=8",
                "--out_degree=4", "--n_train=200", "--n_test=50", "--n_val=50", "--seed=3"])
    assert prep.returncode == 0
    args = tiny_train_args(other, out, "--max_iters=20", "--init_from=resume")
    args = [a if not a.startswith("--data_args") else a[:-1] + ", 'seed': 3}" for a in args]
    r = run(args)
    assert r.returncode == 2 and "seed" in r.stderr, r.stderr


def cut(path, how):
    with open(path, "rb") as f:
        b = f.read()
    with open(path, "wb") as f:
        f.write(how(b))


@pytest.mark.parametrize("damage,needle", [
    (lambda d: os.remove(os.path.join(d, "test_ood.txt")), "is missing"),
    (lambda d: open(os.path.join(d, "test_id.txt"), "a").write("e1 r1 zz9 e2\n"), "does not match meta.json"),
    (lambda d: open(os.path.join(d, "train_id.txt"), "w").close(), "does not match meta.json"),
    (lambda d: open(os.path.join(d, "meta.json"), "w").write("{"), "not valid JSON"),
    # silent wrong data: a file cut mid-line ('e20 r31 r36' would read as question 'e20 r31', answer 'r36'),
    # a file cut at a line boundary (half the data), a file of random bytes
    (lambda d: cut(os.path.join(d, "train_id.txt"), lambda b: b[:b.rindex(b" ")]), "does not match meta.json"),
    (lambda d: cut(os.path.join(d, "train_id.txt"), lambda b: b[:b.index(b"\n", len(b) // 2) + 1]), "does not match meta.json"),
    (lambda d: cut(os.path.join(d, "test_ood.txt"), lambda b: os.urandom(len(b))), "does not match meta.json"),
])
def test_damaged_dataset_one_line_or_made_again(tiny_data, tmp_path, damage, needle):
    """A damaged split file of a folder the symbolic generator made is made again, byte for byte, before training
    (the generator is deterministic: nothing is lost); a damaged meta.json (whose folder is it?) is one line."""
    import shutil
    from test_folders import snapshot
    d = str(tmp_path / "data")
    shutil.copytree(tiny_data, d)
    damage(d)
    r = run(tiny_train_args(d, str(tmp_path / "run"), "--max_iters=5"))
    if needle == "not valid JSON":
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    else:
        assert r.returncode == 0 and "is damaged or missing: making" in r.stdout, (r.stdout[-1000:], r.stderr[-1000:])
        assert snapshot(d) == snapshot(tiny_data)


def test_split_join_curriculum_stream(tiny_data):
    """A late split is absent before its join iteration and present after; the stream before a join
    does not depend on when the join is (what lets a resume move a join that has not acted yet); and
    without split_join the stream is the one every earlier run trained on."""
    import numpy as np
    from discoloop.common import DataError
    from discoloop.qa_data import QAData
    plain, late, later = QAData(tiny_data), QAData(tiny_data, None, {"train_id": 20}), QAData(tiny_data, None, {"train_id": 50})
    n_atom = len(plain.splits["train_atom"][0])
    rows = lambda d, it: {tuple(r) for r in d.get_batch(it, 64, 0, 1, 0)[0].tolist()}  # noqa: E731
    atoms = {tuple(r) for r in plain.train_X[:n_atom].tolist()}
    assert all(rows(late, it) <= atoms for it in range(20))                 # only atoms before the join
    assert any(not rows(late, it) <= atoms for it in range(20, 30))          # two-hop questions after it
    assert all(rows(late, it) == rows(later, it) for it in range(20))       # the join's value acts only from it on
    spe = plain.steps_per_epoch(64)
    perm = np.random.default_rng([0, 1]).permutation(len(plain.train_X))[:64]
    assert torch.equal(plain.get_batch(spe, 64, 0, 1, 0)[0], plain.train_X[torch.from_numpy(perm)])
    for bad, needle in (({"test_id": 5}, "not a training split"), ({"train_id": -1}, "must be an iteration"),
                        ({"train_id": 5, "train_atom": 5}, "no training split")):
        with pytest.raises(DataError, match=needle):
            QAData(tiny_data, None, bad)


def test_loops_by_hops_batches_and_evaluation(tiny_data):
    """loops_by_hops: a batch carries each row's hop count (facts 1, 2-hop questions 2) and every split is
    evaluated after as many loops as its hops; off, the batch has no loop counts (the default runs')."""
    from model import GPT, GPTConfig
    from discoloop.qa_data import QAData, accuracy
    data = QAData(tiny_data)
    assert data.get_batch(0, 64, 0, 1, 0)[2] is None
    data.loops_by_hops = True
    x, y, loops = data.get_batch(3, 64, 0, 1, 0)
    answer_at = (y != -1).long().argmax(1)  # the question's last token: fact 'a r' at 1, 2-hop 'a r1 r2' at 2
    assert torch.equal(loops, answer_at) and set(loops.tolist()) == {1, 2}
    data.extra_loops = 2  # 0..2 loops more per row; the parts of one global batch are its rows' loop counts
    whole = data.get_batch(3, 64, 0, 1, 0)
    parts = [data.get_batch(3, 64, p, 2, 0) for p in range(2)]
    extra = whole[2] - (whole[1] != -1).long().argmax(1)
    assert set(extra.tolist()) == {0, 1, 2} and torch.equal(torch.cat([p[2] for p in parts]), whole[2])
    data.extra_loops = 0
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=data.vocab_size, n_layer=1, n_head=2, n_embd=32, n_loop=2)).eval()
    got = data.evaluate(model, 512)
    for s in ("train_atom", "test_id"):
        acc, _, loss = accuracy(model, *data.splits[s], n_loop=data.hops(s))
        assert (got[f"acc/{s}"], got[f"loss/{s}"]) == (round(acc, 5), round(loss, 5))
    assert got["loss/train_atom"] != round(accuracy(model, *data.splits["train_atom"], n_loop=2)[2], 5)


def test_split_join_resume_may_move_only_future_joins(tiny_data, tmp_path):
    """Integer joins and rule joins ('metric>=x': the split joins at the first evaluation where it held)
    are one decision whether the run was interrupted or not, and a resume may change only what has not
    acted yet."""
    from discoloop.curriculum import join_iteration, joins_acted, parse_join_rule
    out, live = str(tmp_path / "run"), str(tmp_path / "live")
    r = run(tiny_train_args(tiny_data, out, "--max_iters=10", "--eval_interval=10", "--split_join={'train_id': 100}"))
    assert r.returncode == 0, r.stderr
    r = run(tiny_train_args(tiny_data, out, "--max_iters=20", "--eval_interval=10", "--init_from=resume",
                            "--split_join={}"))  # {} = in the mix since iteration 0, which the checkpoint was not
    assert r.returncode == 2 and "only joins at or after iteration 10 may change" in r.stderr, r.stderr
    r = run(tiny_train_args(tiny_data, out, "--max_iters=10", "--init_from=resume",
                            "--split_join={'train_id': 12}"))  # not acted yet at iteration 10: may move (nothing to train)
    assert r.returncode == 0, r.stderr
    # a rule that holds at iteration 10 but not at 0: the batches before a join do not depend on it
    loss = [json.loads(line)["loss/train_atom"] for line in open(f"{out}/metrics.jsonl")]
    assert loss[1] < loss[0], loss
    rule = f"{{'train_id': 'loss/train_atom<={(loss[0] + loss[1]) / 2}'}}"
    assert join_iteration([{"iter": 0, "loss/train_atom": loss[0]}, {"iter": 10, "loss/train_atom": loss[1]}],
                          eval(rule)["train_id"]) == 10
    r = run(tiny_train_args(tiny_data, out, "--max_iters=20", "--eval_interval=10", "--init_from=resume",
                            f"--split_join={rule}"))  # fired at 10 = the resume point: not acted yet, may be set
    assert r.returncode == 0 and "train_id joins the mix at iteration 10" in r.stdout, r.stderr
    r = run(tiny_train_args(tiny_data, live, "--max_iters=20", "--eval_interval=10", f"--split_join={rule}"))
    assert r.returncode == 0 and "train_id joins the mix at iteration 10" in r.stdout, r.stderr
    rows = [[json.loads(line) for line in open(f"{d}/metrics.jsonl")] for d in (out, live)]
    drop = ("time", "cpu_time", "tok_per_s", "tflops")
    assert [{k: v for k, v in r.items() if k not in drop} for r in rows[0]] == \
           [{k: v for k, v in r.items() if k not in drop} for r in rows[1]]  # resumed run == uninterrupted one
    r = run(tiny_train_args(tiny_data, out, "--max_iters=30", "--eval_interval=10", "--init_from=resume",
                            "--split_join={'train_id': 15}"))  # the rule acted at 10 already: refused in one line
    assert r.returncode == 2 and "only joins at or after iteration 20 may change" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert joins_acted(eval(rule), rows[0], 20) == joins_acted({"train_id": 10}, rows[0], 20) == {"train_id": 10}
    for bad in ("acc/val_id>0.9", "acc/val_id>=x", "acc/val_id>=nan"):
        with pytest.raises(ValueError, match="allowed 'metric>=number'"):
            parse_join_rule(bad)
    r = run(tiny_train_args(tiny_data, live, "--overwrite=True", "--split_join={'train_id': 'acc/test_id>=0.5'}"))
    assert r.returncode == 2 and "a test split must not steer training" in r.stderr, r.stderr


def test_stage1_readouts_where_asked(tiny_data, tmp_path):
    """stage1_splits='all' reports every split's Stage-1 accuracy; a stop rule on acc1/val_id adds that split;
    the final accuracies and losses do not depend on which Stage-1 readouts are made."""
    rows = {}
    for name, extra in {"all": ["--stage1_splits=all"], "rule": ["--stop_metric=acc1/val_id", "--stop_patience=100"],
                        "default": []}.items():
        out = str(tmp_path / name)
        r = run(tiny_train_args(tiny_data, out, "--max_iters=10", "--eval_interval=10", *extra))
        assert r.returncode == 0, r.stderr
        rows[name] = metrics(out)[-1]
    assert {"acc1/test_id", "acc1/test_ood", "acc1/val_id"} <= set(rows["all"])
    assert "acc1/val_id" in rows["rule"] and "acc1/test_id" not in rows["rule"]
    final = lambda m: {k: v for k, v in stable(m).items() if not k.startswith("acc1/")}
    assert final(rows["all"]) == final(rows["default"]) == final(rows["rule"])
    assert {k: v for k, v in rows["all"].items() if k in rows["default"] and k.startswith("acc1/")} == \
        {k: v for k, v in rows["default"].items() if k.startswith("acc1/")}


def test_round3_train_refusals_are_one_line(tiny_data, tmp_path):
    """Silently wrong before: a Stage-1 prefix that matches nothing, an old and a new key name both given,
    data_args that would move the data folder, a folder where the run writes metrics.jsonl."""
    from test_cli import one_line
    out = str(tmp_path / "run")
    one_line(run(tiny_train_args(tiny_data, out, "--stage1_splits=bogus")), "stage1_splits='bogus'")
    one_line(run(tiny_train_args(tiny_data, out, "--disco_topk=8", "--phi_topk=16")), "disco_topk=8", "give only phi_topk")
    one_line(run(tiny_train_args(tiny_data, out, "--data_args={'out_dir': 'elsewhere'}")), "data_args=", "out_dir")
    os.makedirs(os.path.join(out, "metrics.jsonl"))
    one_line(run(tiny_train_args(tiny_data, out, "--max_iters=1")), "metrics.jsonl", "is a folder")
    assert os.listdir(out) == ["metrics.jsonl"]


def test_token_corpus_refuses_keys_it_would_ignore(tmp_path):
    """Shards are prepared once and have no splits: data_args that say otherwise than the folder (e.g. another
    tokenizer_file: the run would train on the old ids) and Stage-1 splits are one line each, not ignored."""
    from test_cli import PRETRAIN, one_line, shards
    made = {"data_files": "synthetic:web", "encoding": "bytes", "tokenizer_file": "", "val_tokens": 200}
    d = shards(tmp_path, list(range(50)) * 4, meta_extra={"kind": "tokens", "config": made})
    out = str(tmp_path / "run")
    one_line(run(PRETRAIN + [f"--data_dir={d}", f"--out_dir={out}", "--data_args={'tokenizer_file': 'other.json'}"]),
             "data_args tokenizer_file='other.json'", "made with tokenizer_file=''", "--data_args={}")
    one_line(run(PRETRAIN + [f"--data_dir={d}", f"--out_dir={out}", "--data_args={}", "--stage1_splits=bogus"]),
             "stage1_splits='bogus'", "token corpus", "allowed only the default 'train'")
    r = run(PRETRAIN + [f"--data_dir={d}", f"--out_dir={out}", f"--data_args={made}", "--max_iters=0"])
    assert r.returncode == 0, r.stderr[-1500:]  # the folder's own values, stated again


def test_cpu_precision_is_decided_once_per_machine_and_shape(tmp_path, monkeypatch):
    """dtype='auto' times the step once; the next start of the same command reuses the decision instead of timing
    again (a 1.4x speed-up timed against a 1.25x threshold flipped in one start out of six)."""
    from discoloop import precision
    monkeypatch.setenv("DISCOLOOP_DTYPE_CACHE", str(tmp_path / "c.json"))
    calls = []
    decide = lambda answer: (lambda: calls.append(answer) or answer)
    assert precision.cached_cpu_dtype("shape A", decide("bfloat16"))[0] == "bfloat16"
    assert precision.cached_cpu_dtype("shape A", decide("float32")) == ("bfloat16", precision.cached_cpu_dtype("shape A", decide("x"))[1])
    assert calls == ["bfloat16"]  # timed once; the flip a second timing would give never happens
    assert precision.cached_cpu_dtype("shape B", decide("float32"))[0] == "float32" and calls == ["bfloat16", "float32"]
    os.remove(tmp_path / "c.json")  # the reset: delete the file
    assert precision.cached_cpu_dtype("shape A", decide("float32"))[0] == "float32"


@pytest.mark.parametrize("edit", ["float16", "fp32", None])
def test_cpu_precision_cache_is_read_like_input(tmp_path, monkeypatch, capsys, edit):
    """A cache entry edited to what a CPU step cannot compute in here (float16 on a CPU, a typo, not a string): one
    warning line naming the file and the value, timed again and rewritten, never used; the other entries stay."""
    from discoloop import precision
    path = tmp_path / "c.json"
    monkeypatch.setenv("DISCOLOOP_DTYPE_CACHE", str(path))
    precision.cached_cpu_dtype("shape A", lambda: "float32")
    key = next(iter(json.loads(path.read_text())))
    other = key.replace("shape A", "shape B")
    path.write_text(json.dumps({key: edit, other: "bfloat16"}))
    capsys.readouterr()
    assert precision.cached_cpu_dtype("shape A", lambda: "bfloat16") == ("bfloat16", f"timed now (kept in {path})")
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("warning:") and str(path) in err
    assert repr(edit) in err and "allowed ('float32', 'bfloat16')" in err
    assert json.loads(path.read_text()) == {key: "bfloat16", other: "bfloat16"}


@pytest.mark.parametrize("what", ["not json", "someone's json", "a fifo", "a link to /dev/null", "a folder"])
def test_a_cache_path_that_is_not_the_cache_is_never_written(tmp_path, monkeypatch, capsys, what):
    """DISCOLOOP_DTYPE_CACHE naming someone's file, a pipe, a device (through a link) or a folder: one warning, the
    precision timed and not kept, the path exactly as it was (no hang on a pipe)."""
    from discoloop import precision
    path = tmp_path / "c.json"
    if what == "not json":
        path.write_text("my notes")
    elif what == "someone's json":
        path.write_text(json.dumps({"name": "my-package"}))
    elif what == "a fifo":
        os.mkfifo(path)
    elif what == "a link to /dev/null":
        os.symlink(os.devnull, path)
    else:
        path.mkdir()
    before = (path.is_file() and path.read_text(), os.path.islink(path), path.is_dir())
    monkeypatch.setenv("DISCOLOOP_DTYPE_CACHE", str(path))
    capsys.readouterr()
    assert precision.cached_cpu_dtype("shape A", lambda: "bfloat16") == ("bfloat16", "timed now (not kept)")
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a CPU precision cache" in err
    assert (path.is_file() and path.read_text(), os.path.islink(path), path.is_dir()) == before


def test_train_auto_dtype_twice_gives_one_choice(tiny_data, tmp_path):
    env = {"DISCOLOOP_DTYPE_CACHE": str(tmp_path / "c.json")}
    choices = []
    for i in range(2):
        out = str(tmp_path / f"run{i}")
        r = run(tiny_train_args(tiny_data, out, "--max_iters=0", "--dtype=auto"), env=env)
        assert r.returncode == 0, r.stderr[-1500:]
        cfg = json.load(open(os.path.join(out, "config.json")))
        choices.append((cfg["dtype_resolved"], cfg["dtype_decided"].split(" (")[0]))
    assert choices[0][0] == choices[1][0] and choices[0][1] == "timed now" and choices[1][1] == "decided earlier on this machine"


def test_out_of_memory_anywhere_is_one_line():
    code = "import discoloop.common; raise RuntimeError('[enforce fail at alloc_cpu.cpp:118] DefaultCPUAllocator: can\\'t allocate memory')"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and "out of memory" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_init_from_a_run_folder_branches(tiny_data, tmp_path):
    """--init_from=<run folder>: a new run starts from another run's weights (and weight average) with its own
    optimizer settings, from iteration 0, recorded in config.json; the source is untouched; a resume stays strict."""
    src, br = str(tmp_path / "src"), str(tmp_path / "branch")
    assert run(tiny_train_args(tiny_data, src, "--max_iters=6", "--eval_interval=6")).returncode == 0
    before = open(os.path.join(src, "ckpt.pt"), "rb").read()
    r = run(tiny_train_args(tiny_data, br, f"--init_from={src}", "--max_iters=4", "--eval_interval=2",
                            "--weight_decay=0.03", "--label_smoothing=0"))
    assert r.returncode == 0, r.stderr[-2000:]
    src_rows = [json.loads(x) for x in open(os.path.join(src, "metrics.jsonl"))]
    rows = [json.loads(x) for x in open(os.path.join(br, "metrics.jsonl"))]
    assert rows[0]["iter"] == 0 and rows[0]["acc/test_id"] == src_rows[-1]["acc/test_id"]  # the source's weights
    assert rows[0]["loss/test_ood"] == pytest.approx(src_rows[-1]["loss/test_ood"], abs=1e-6)
    cfg = json.load(open(os.path.join(br, "config.json")))
    assert cfg["init_from"] == src and cfg["init_kind"] == "run" and cfg["init_iter"] == 6
    assert cfg["init_changed"]["weight_decay"] == [0.3, 0.03] and cfg["init_fresh"] == []
    assert open(os.path.join(src, "ckpt.pt"), "rb").read() == before
    r = run(tiny_train_args(tiny_data, br, "--init_from=resume", "--max_iters=6", "--eval_interval=2",
                            "--weight_decay=0.03", "--label_smoothing=0"))
    assert r.returncode == 0, r.stderr[-2000:]
    from test_cli import one_line
    one_line(run(tiny_train_args(tiny_data, str(tmp_path / "b2"), f"--init_from={tmp_path / 'nothing'}")), "nothing there")
    one_line(run(tiny_train_args(tiny_data, str(tmp_path / "b3"), f"--init_from={src}", "--n_embd=48")),
             "no place of that shape")


def test_keep_every_keeps_probe_checkpoints(tiny_data, tmp_path):
    out = str(tmp_path / "run")
    r = run(tiny_train_args(tiny_data, out, "--max_iters=6", "--eval_interval=2", "--keep_every=4"))
    assert r.returncode == 0, r.stderr[-2000:]
    from discoloop.checkpoint import load_checkpoint
    assert sorted(n for n in os.listdir(out) if n.startswith("ckpt")) == ["ckpt.pt", "ckpt_4.pt"]
    assert load_checkpoint(os.path.join(out, "ckpt_4.pt"))["iter_num"] == 4 and load_checkpoint(out)["iter_num"] == 6
    from test_cli import one_line
    one_line(run(tiny_train_args(tiny_data, str(tmp_path / "r2"), "--eval_interval=2", "--keep_every=3")), "keep_every=3")
