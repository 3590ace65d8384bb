"""Round 7 (issue 68): upgrades keep working (what earlier commits wrote is the project's, replaced with one note; a
user's file still never), one exit gate per checkpoint, compute-only keys are the machine's business, sizes checked
against the weights before anything is built, one line for every refusal before the work it would waste."""
import json
import os
import shutil
import subprocess
import tarfile

import pytest
import torch

from conftest import REPO, TINY_DATA, TINY_DATA_ARGS, TINY_MODEL, byte_run, ok, old_tree, one_line, run, tiny_train_args

from discoloop.common import ConfigError
from discoloop.ownership import MARK, owned

PRE_MARK = "082ca7f"  # the last commit before files carried the mark (ce527c9 "ownership by a mark")
PRE_GATE_NAME = "8967c81"  # the last commit with one exit_gate.pt per folder


def test_one_gate_per_checkpoint_and_the_old_gate_still_opens(tiny_data, tmp_path_factory):
    """The commit before wrote one exit_gate.pt per folder: it still opens beside ckpt.pt; today's gate is named after
    its checkpoint, so training ckpt_<iter>.pt's gate replaces neither ckpt.pt's nor the old file."""
    src = old_tree(tmp_path_factory, PRE_GATE_NAME)
    out = tmp_path_factory.mktemp("gates") / "run"
    ok(run(tiny_train_args(tiny_data, str(out), "--max_iters=4", "--eval_interval=2", "--keep_every=2",
                           "--recurrence=loop"), cwd=src))
    gate = ["exits.py", "gate", "--gate_tokens=300", "--gate_iters=10"]
    ok(run([*gate, f"--ckpt={out}"], cwd=src))
    old = (out / "exit_gate.pt").read_bytes()
    assert "| gate " in ok(run(["exits.py", f"--ckpt={out}", "--exit_rule=gate", "--splits=test_id"])).stdout
    ok(run([*gate, f"--ckpt={out / 'ckpt_2.pt'}"]))
    ok(run([*gate, f"--ckpt={out}"]))
    assert (out / "exit_gate.pt").read_bytes() == old
    assert {"ckpt.exit_gate.pt", "ckpt_2.exit_gate.pt"} <= set(os.listdir(out))
    g2 = torch.load(out / "ckpt_2.exit_gate.pt", weights_only=True)
    assert g2["crc32"] != torch.load(out / "ckpt.exit_gate.pt", weights_only=True)["crc32"]
    # a gate that carries the mark but not the gate's keys; a named pipe where the gate is
    torch.save({MARK: "exit gate", "K": 2}, out / "ckpt.exit_gate.pt")
    one_line(run(["exits.py", f"--ckpt={out}", "--exit_rule=gate"]), "lacks 'gate'", "ckpt.exit_gate.pt")
    os.remove(out / "ckpt.exit_gate.pt")
    os.mkfifo(out / "ckpt.exit_gate.pt")
    one_line(run(["exits.py", f"--ckpt={out}", "--exit_rule=gate"], timeout=60), "is a named pipe")


def doctored(tiny_run, dest, **args):
    """tiny_run's checkpoint with model_args changed (a valid CRC: save_checkpoint writes it)."""
    from discoloop.checkpoint import save_checkpoint
    ck = torch.load(os.path.join(tiny_run, "ckpt.pt"), weights_only=True)
    ck = {k: v for k, v in ck.items() if k not in ("crc32", MARK)}
    os.makedirs(dest, exist_ok=True)
    shutil.copy(os.path.join(tiny_run, "config.json"), dest)
    save_checkpoint({**ck, "model_args": {**ck["model_args"], **args}}, os.path.join(dest, "ckpt.pt"))
    return str(dest)


def test_sizes_are_checked_against_the_weights_before_building(tiny_run, tmp_path):
    import time
    from discoloop.checkpoint import load_checkpoint
    from discoloop.common import CheckpointError
    from discoloop.from_checkpoint import model_from_checkpoint
    for args, blamed in (({"n_layer": 100000}, "n_layer=100000"), ({"recurrence": "none", "n_loop": 20000}, "n_loop=20000"),
                         ({"vocab_size": 10 ** 6}, "vocab_size=1000000")):
        ck = load_checkpoint(doctored(tiny_run, tmp_path / blamed, **args))
        t = time.perf_counter()
        with pytest.raises(CheckpointError, match="do not describe its weights") as e:
            model_from_checkpoint(ck)
        assert time.perf_counter() - t < 1 and blamed in str(e.value), str(e.value)
    one_line(run(["sample.py", f"--ckpt={tmp_path / 'n_layer=100000'}", "--max_new_tokens=1"], timeout=120), "n_layer=100000")


def test_every_size_is_checked_against_the_weights_before_building(tiny_run, tiny_data, tmp_path):
    """Issue 72 item 3: the check compared the block count and the embedding only; n_hidden, n_kv_head, mlp or a
    block_size of 10^8 on learned positions crashed load_state_dict or export_hf.py, or ran out of memory. Each is one
    line naming the weight and the keys that size it: opened, resumed, exported."""
    from discoloop.checkpoint import load_checkpoint
    from discoloop.common import CheckpointError
    from discoloop.from_checkpoint import model_from_checkpoint
    for args, weight, key in (({"n_hidden": 512}, "mlp.c_fc.weight", "n_hidden"), ({"n_kv_head": 1}, "attn.c_attn", "n_kv_head"),
                              ({"mlp": "swiglu"}, "mlp.c_fc.weight", "mlp"), ({"block_size": 10 ** 8}, "wpe", "block_size")):
        d = doctored(tiny_run, tmp_path / key, **args)
        with pytest.raises(CheckpointError, match="do not describe its weights") as e:
            model_from_checkpoint(load_checkpoint(d))
        assert weight in str(e.value) and key in str(e.value), str(e.value)
        one_line(run(["export_hf.py", f"--ckpt={d}", f"--out_dir={tmp_path / ('hf_' + key)}"]), weight)
        assert not (tmp_path / ("hf_" + key)).exists()
    one_line(run(tiny_train_args(tiny_data, str(tmp_path / "n_hidden"), "--init_from=resume", "--max_iters=8",
                                 "--recurrence=loop")), "mlp.c_fc.weight", "n_hidden")


def test_compute_only_keys_are_the_machines(tiny_run, tmp_path, monkeypatch):
    """'auto' checkpointing (resolved by a training run) opens as 'none', one note naming key and file; the retired fused
    kernel is compat's (read as 'auto': tests/test_export.py exports and loads one)."""
    from discoloop.from_checkpoint import runnable_here
    args = runnable_here({"phi_kernel": "csr", "activation_checkpointing": "auto", "n_layer": 1}, "x/ckpt.pt")
    assert args == {"phi_kernel": "csr", "activation_checkpointing": "none", "n_layer": 1}
    ck = doctored(tiny_run, tmp_path / "gpu", activation_checkpointing="auto")
    r = ok(run(["probe.py", "acc", f"--ckpt={ck}", f"--json={tmp_path / 'a.json'}"]))
    assert len([ln for ln in r.stderr.splitlines() if "activation_checkpointing='auto'" in ln and "gpu" in ln]) == 1


def test_refusals_and_notes_of_this_turns_keys(tiny_data, tiny_run, tmp_path):
    bench = ["bench.py", "step", "config/pretrain_tiny.py", "--vocab_size=64", "--steps=1", "--n_layer=1"]
    same = tmp_path / "same.json"
    one_line(run([*bench, f"--json={same}", f"--plan_cache={same}"]), "are one file")
    one_line(run([*bench, "--optimizer=adamw", "--cuda_graph=True"]), "cuda_graph=True has no effect")
    one_line(run(tiny_train_args(tiny_data, str(tmp_path / "l"), "--max_iters=1", "--recurrence=loop", "--n_loop=1",
                                 "--loop_loss=0.5")), "loop_loss=0.5 has no effect", "n_loop > 1")
    r = ok(run(tiny_train_args(tiny_data, str(tmp_path / "g"), "--max_iters=2", "--eval_interval=2",
                               "--optimizer=adamw", "--cuda_graph=True", "--activation_checkpointing=auto")))
    assert "note: cuda_graph=True on device 'cpu'" in r.stderr and "activation_checkpointing='auto' -> 'block'" in r.stdout
    run_dir = tmp_path / "rows"  # a metrics row without 'time' (hand-made or cut): the table says '-'
    shutil.copytree(tiny_run, run_dir)
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    rows[-1] = json.dumps({k: v for k, v in json.loads(rows[-1]).items() if k != "time"})
    (run_dir / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    ok(run(["probe.py", "plot", str(run_dir), f"--png={tmp_path / 'c.png'}"]))


@pytest.fixture(scope="module")
def token_run(tmp_path_factory):
    """Byte-level shards (prepare.py) and a tiny pretraining run on them (block_size 32, 2 loops)."""
    return byte_run(tmp_path_factory.mktemp("r7_tokens"), "--n_embd=32", "--n_head=2", "--n_layer=1", "--n_loop=2",
                    "--block_size=32", "--max_iters=2", "--eval_interval=2", "--lr_decay_iters=2")


def cut_train_shard(src, dest, n):
    """A copy of a shard folder whose training shard holds its first n tokens."""
    import numpy as np
    shutil.copytree(src, dest)
    meta = json.loads((dest / "meta.json").read_text())
    name = meta["shards"]["train"][0][0]
    np.fromfile(dest / name, dtype=meta["dtype"])[:n].tofile(dest / name)
    meta["shards"]["train"] = [[name, n]]
    (dest / "meta.json").write_text(json.dumps(meta))
    (dest / "max_token.json").unlink(missing_ok=True)
    return dest


def test_gate_on_training_shards_shorter_than_one_window(token_run, tmp_path):
    """exits.py gate read no window of training shards shorter than block_size + 1 tokens: a TypeError."""
    short = cut_train_shard(token_run / "shards", tmp_path / "short", 20)
    one_line(run(["exits.py", "gate", f"--ckpt={token_run / 'run'}", f"--data_dir={short}", "--gate_iters=1"]),
             "the train shards", "fewer than block_size=32 + 1 tokens", "(the longest: 20)")
    assert not os.path.exists(token_run / "run" / "ckpt.exit_gate.pt")


def test_job_ab_on_a_damaged_archive(tmp_path):
    """A .tar.gz cut short (a copy that stopped): an EOFError traceback."""
    import io
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        data = os.urandom(200_000)  # incompressible: the cut falls inside the member
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    cut = tmp_path / "old.tar.gz"
    cut.write_bytes(buf.getvalue()[:len(buf.getvalue()) // 2])
    r = subprocess.run([__import__("sys").executable, ".ci/job_ab.py", str(cut), "--dry"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    one_line(r, "is not a readable tar of a tree", "old.tar.gz")


def test_a_max_token_cache_that_lies_is_named(token_run, tmp_path):
    """max_token.json claims a smaller largest id than a shard holds, beside a lowered vocabulary: an IndexError deep
    in the embedding; a claim past the vocabulary blamed the shard for the cache's lie."""
    d = tmp_path / "lie"
    shutil.copytree(token_run / "shards", d)
    meta = json.loads((d / "meta.json").read_text())
    (d / "meta.json").write_text(json.dumps({**meta, "vocab_size": 200}))
    bins = [n for n in os.listdir(d) if n.endswith(".bin") and not n.startswith("pending")]

    def claim(top):
        (d / "max_token.json").write_text(json.dumps({n: [os.stat(d / n).st_size, os.stat(d / n).st_mtime_ns, top]
                                                      for n in bins}))
    claim(100)
    args = ["train.py", "config/pretrain_tiny.py", "--data_args={}", f"--data_dir={d}", f"--out_dir={tmp_path / 'run'}",
            "--vocab_size=200", "--phi_topk=0", "--phi_chunk=0", "--n_embd=32", "--n_head=2", "--n_layer=1",
            "--block_size=32", "--batch_size=2", "--max_iters=1", "--threads=1"]
    one_line(run(args), "max_token.json' is wrong about shard", "says the largest token id is 100",
             "holds at least 256", f"delete '{d / 'max_token.json'}'")
    (d / "meta.json").write_text(json.dumps(meta))  # the real vocabulary (257), a claim past it
    claim(300)
    one_line(run([a for a in args if a != "--vocab_size=200"]), "max_token.json' is wrong", "is 300", "holds 256")
    (d / "max_token.json").unlink()  # remade as it says: the run goes on
    ok(run([a for a in args if a != "--vocab_size=200"]))


def test_a_config_files_encoding_against_shards_of_a_tokenizer_file(tmp_path):
    """A config file's data_args say encoding='bytes'; the shards were made with a tokenizer.json (their encoding field
    the script's default, which the file overrides): the refusal named encoding='cl100k_base', which made nothing."""
    import numpy as np
    d = tmp_path / "shards"
    d.mkdir()
    for split in ("train", "val"):
        (np.arange(600) % 61).astype(np.uint16).tofile(d / f"{split}_000000.bin")
    made = {"data_files": "synthetic:web", "weights": "1", "encoding": "cl100k_base", "tokenizer_file": "/x/tokenizer.json",
            "tokenizer_eot": "<eot>", "val_tokens": 600, "tokenizer_sha256": "0" * 64}
    (d / "meta.json").write_text(json.dumps({"kind": "tokens", "generator": "pretrain", "dtype": "uint16", "vocab_size": 61,
                                             "eot": 0, "encoding": "hf:tokenizer.json", "config": made, "shards": {
                                                 "train": [["train_000000.bin", 600]], "val": [["val_000000.bin", 600]]}}))
    cfg = tmp_path / "c.py"
    cfg.write_text('exec(open("config/pretrain_tiny.py").read())\n'
                   'data_args = {"data_files": "synthetic:web", "weights": "1", "encoding": "bytes", "val_tokens": 600}\n')
    r = run(["train.py", str(cfg), f"--data_dir={d}", f"--out_dir={tmp_path / 'run'}", "--max_iters=0", "--threads=1"])
    one_line(r, "encoding='bytes'", "made with tokenizer_file='/x/tokenizer.json'")
    assert "cl100k_base" not in r.stderr
    # the same tokenizer file: its encoding field decides nothing, so it is not compared
    cfg.write_text('exec(open("config/pretrain_tiny.py").read())\ndata_args = {"data_files": "synthetic:web", "weights": '
                   '"1", "encoding": "bytes", "tokenizer_file": "/x/tokenizer.json", "tokenizer_eot": "<eot>", '
                   '"val_tokens": 600}\n')
    r = run(["train.py", str(cfg), f"--data_dir={d}", f"--out_dir={tmp_path / 'run'}", "--max_iters=0", "--threads=1"])
    one_line(r, "/x/tokenizer.json', which is not there now")  # the next check: the file itself


def mc_task(folder):
    """A local multiple-choice task (loglikelihood only: nothing is generated), 'r7_mc', tagged 'r7_tag'."""
    from conftest import mc_task as write
    return write(folder, "r7_mc", [{"question": "The small cat sees the", "choices": [" dog.", " ==="], "label": 0}],
                 tag="r7_tag")


def test_speculative_keys_on_a_task_that_only_scores(token_run, tmp_path):
    """--speculative_draft_loops on a multiple-choice task: nothing is generated, so it changed nothing, silently."""
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    r = run(["eval_harness.py", f"--ckpt={token_run / 'run'}", "--tasks=r7_mc", f"--include_path={mc_task(tmp_path)}",
             f"--json={tmp_path / 'e.json'}", "--speculative_draft_loops=1", "--dtype=float32"], env=env)
    one_line(r, "speculative_draft_loops=1 has no effect", "r7_mc", "multiple_choice", "generate_until")
    assert not (tmp_path / "e.json").exists()
    r = run(["eval_harness.py", "lm_eval", "--model", "discoloop", "--model_args",  # the harness CLI ('-t' = '--tasks')
             f"ckpt={token_run / 'run'},speculative_propose=1", "-t", "r7_mc", "--include_path", str(mc_task(tmp_path))],
            env=env)
    one_line(r, "speculative_propose=1 has no effect", "r7_mc", "multiple_choice")


def test_a_tag_of_tasks_that_only_score_is_noted_after_the_harness_cli(monkeypatch, capsys):
    """A tag or group names no output type before it loads: the harness CLI's models whose speculative keys met no
    generate_until request say so when the evaluation ends (eval_harness.note_idle_speculation)."""
    import types
    import eval_harness
    from discoloop.speculative import Pipeline
    idle, used = (types.SimpleNamespace(spec=Pipeline(1), generated=n) for n in (0, 3))
    monkeypatch.setattr(eval_harness, "MADE", [idle, used, types.SimpleNamespace(spec=None, generated=0)])
    eval_harness.note_idle_speculation()
    err = capsys.readouterr().err
    assert err.count("note:") == 1 and "pipelined (propose at loop 1) had no effect: the tasks only scored" in err, err


def test_the_lm_eval_cli_checks_model_args_before_its_log_lines(token_run):
    """`eval_harness.py lm_eval`: a value the model refuses (exit_min_loops past K, a draft as deep as the verifier, a
    missing gate) came after the harness's log lines; a key the model does not take (a typo) was ignored."""
    ck = token_run / "run"
    for args, needles in ((f"ckpt={ck},exit_rule=prob,exit_min_loops=5", ["exit_min_loops=5"]),
                          (f"ckpt={ck},speculative_draft_loops=5", ["speculative_draft_loops=5"]),
                          (f"ckpt={ck},exit_rule=gate", ["exit gate", "not found"]),
                          (f"ckpt={ck},n_lop=3", ["n_lop=3 is not a key", "n_loop"])):
        r = run(["eval_harness.py", "lm_eval", "--model", "discoloop", "--model_args", args, "--tasks", "piqa"])
        one_line(r, *needles)


def test_outputs_that_cannot_be_written_are_refused_before_the_work(token_run, tmp_path, monkeypatch, capsys):
    """exits.py gate (its gate beside the checkpoint), exits.py's and eval_harness.py's default JSON beside it: an
    unwritable place was found only at the end. Root writes anywhere chmod allows nothing, so the place is under /proc
    (no file can be made there) and the work itself is a trap."""
    import eval_harness
    import exits
    from discoloop.common import check_writable
    with pytest.raises(ConfigError, match="cannot write '/proc/discoloop-r7/x.json'.*somewhere"):
        check_writable("/proc/discoloop-r7/x.json", "somewhere")
    check_writable(str(tmp_path / "new" / "x.json"), "")  # made, proven writable, and removed: nothing left there
    assert not (tmp_path / "new").exists()

    def work(*_, **__):
        raise AssertionError("the work started")
    monkeypatch.setattr(exits, "load", work)
    monkeypatch.setattr(eval_harness, "DiscoLoopLM", work)
    ck = str(token_run / "run")
    for main, args, where in (
            (exits.main, ["gate", f"--ckpt={ck}"], ("gate_path", "/proc/discoloop-r7/ckpt.exit_gate.pt")),
            (exits.main, [f"--ckpt={ck}"], ("beside_checkpoint", "/proc/discoloop-r7/exits.json")),
            (eval_harness.main, [f"--ckpt={ck}", "--tasks=r7_mc", f"--include_path={mc_task(tmp_path)}"],
             ("beside_checkpoint", "/proc/discoloop-r7/eval_harness.json"))):
        module = exits if main is exits.main else eval_harness
        monkeypatch.setattr(module, where[0], lambda *_, p=where[1]: p)
        with pytest.raises(SystemExit) as e:
            main(args)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and f"cannot write '{where[1]}'" in err, err
    for args in (["exits.py", "gate", f"--ckpt={ck}"], ["exits.py", f"--ckpt={ck}"], ["eval_harness.py", f"--ckpt={ck}"]):
        if "gate" not in args:  # an output under a regular file
            one_line(run([*args, f"--json={token_run / 'run' / 'ckpt.pt' / 'x.json'}"]), "json=", "writable")


def test_a_resume_from_before_a_key_reads_it_as_its_default(tiny_data, tiny_run, tmp_path):
    """A checkpoint older than loop_sample (its config without the key) was trained with its default: a resume that
    types --loop_sample=0.5 changed how the weights train, silently (a key the checkpoint lacks was not compared)."""
    from discoloop.checkpoint import save_checkpoint
    old = tmp_path / "old"
    shutil.copytree(tiny_run, old)
    ck = torch.load(old / "ckpt.pt", weights_only=True)
    ck = {k: v for k, v in ck.items() if k not in ("crc32", MARK)}
    ck["config"] = {k: v for k, v in ck["config"].items() if k != "loop_sample"}
    save_checkpoint(ck, str(old / "ckpt.pt"))
    resume = tiny_train_args(tiny_data, str(old), "--max_iters=6", "--eval_interval=2", "--recurrence=loop",
                             "--init_from=resume")
    one_line(run([*resume, "--loop_sample=0.5"]), "loop_sample: the checkpoint was trained with 0.0", "now 0.5")
    ok(run(resume))  # the default continues it


def test_a_draft_length_beside_the_pipelined_decoder():
    """--speculative_propose=1 --speculative_len=8: refused as 'with speculative decoding off', which it is not."""
    from discoloop.speculative import spec_option
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, n_loop=3, vocab_size=16, block_size=8, recurrence="loop"))
    with pytest.raises(ConfigError, match=r"speculative_len=8 has no effect with speculative_propose=1: the pipelined") as e:
        spec_option(0, 8, model, propose=1)
    assert "off" not in str(e.value)
    with pytest.raises(ConfigError, match="speculative decoding off"):
        spec_option(0, 8, model)


@pytest.mark.parametrize("script", [".ci/arms_measure.py", ".ci/pipeline_measure.py"])
def test_the_measure_scripts_name_a_missing_run(script, tmp_path):
    """A developer script given a run folder that is not there: a traceback ending in CheckpointError (arms_measure.py
    after printing its table's header); no run at all: exit 0, nothing measured. A malformed option (a word for a
    number, a negative count, a key it does not take): a ValueError from deep inside (negative dimensions). Each is now
    one line with the usage, before any work."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "ckpt.pt").write_text("not read: the options are refused first")
    run_ = str(tmp_path / "run")
    for args, needle in (([str(tmp_path / "nope")], "nope' is neither a checkpoint"), ([], "no run given"),
                         ([run_, "--threads=abc"], "--threads='abc' is invalid: allowed a whole number >= 1"),
                         ([run_, "--threads=-3"], "--threads='-3' is invalid"),
                         ([run_, "--colour=red"], "'--colour=red' is invalid: allowed --key=value with key one of"),
                         ([run_, "--threads=\u00b2"], "is invalid: allowed a whole number >= 1")):  # isdigit's '²'
        r = run([script, *args], timeout=120)
        assert r.returncode != 0 and "Traceback" not in r.stderr and needle in r.stderr and "usage:" in r.stderr, r.stderr
        assert r.stdout == "", r.stdout
    if script.endswith("arms_measure.py"):  # the output and every run opened before the first is measured: one line
        for args, needle in ((["--json=/proc/no/x.json"], "cannot write '/proc/no/x.json'"), ([], "ckpt.pt")):
            r = run([script, run_, *args], timeout=120)
            err = r.stderr.strip()
            assert r.returncode != 0 and len(err.splitlines()) == 1 and needle in err and r.stdout == "", r.stderr


def test_loop_sample_without_loops_names_what_is_missing(tiny_data, tmp_path):
    """--recurrence=loop --n_loop=1 --loop_sample=0.5: the refusal said 'not recurrence='loop'', blaming the recurrence
    the user had right and not the n_loop=1 that made the key inert."""
    r = run(tiny_train_args(tiny_data, str(tmp_path / "r"), "--max_iters=1", "--recurrence=loop", "--n_loop=1",
                            "--loop_sample=0.5"))
    one_line(r, "loop_sample=0.5 has no effect", "n_loop > 1 (now 1)")
    assert "not recurrence='loop'" not in r.stderr


def test_bench_step_refuses_the_sampled_depth_it_does_not_time(tmp_path):
    """`bench.py step --loop_sample=0.5` timed full-depth steps and said nothing (as cuda_graph=True once did)."""
    bench = ["bench.py", "step", "config/pretrain_tiny.py", "--vocab_size=64", "--steps=1", "--n_layer=1"]
    one_line(run([*bench, "--loop_sample=0.5"]), "loop_sample=0.5 has no effect", "train.py", "every loop")
    one_line(run([*bench, "--optimizer=adamw", "--cuda_graph=True"]), "cuda_graph=True has no effect", "no CUDA graph")


def test_a_recheck_with_no_loop_left_offers_no_empty_range():
    """--speculative_propose=2 --speculative_recheck=2 with 3 loops: 'allowed 0 (none) or 3..2', a range with nothing."""
    from discoloop.speculative import spec_option
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, n_loop=3, vocab_size=16, block_size=8, recurrence="loop"))
    with pytest.raises(ConfigError, match="speculative_recheck=2 is invalid") as e:
        spec_option(0, 4, model, propose=2, recheck=2)
    assert "3..2" not in str(e.value) and "no loop lies between" in str(e.value), str(e.value)
    with pytest.raises(ConfigError, match=r"allowed 0 \(none\) or 2\.\.2$"):
        spec_option(0, 4, model, propose=1, recheck=3)


def test_a_folder_of_kept_checkpoints_without_ckpt_pt_names_them(token_run, tmp_path):
    """exits.py gate --ckpt=a folder holding only ckpt_<iter>.pt (ckpt.pt moved away): 'ckpt.pt not found', nothing
    on the checkpoints the folder does hold (their gates are named after them: --ckpt=RUN/ckpt_<iter>.pt)."""
    d = tmp_path / "kept"
    d.mkdir()
    for n in (2, 10):
        shutil.copy(token_run / "run" / "ckpt.pt", d / f"ckpt_{n}.pt")
    (d / "ckpt_2.exit_gate.pt").write_bytes(b"")  # a gate is not a checkpoint
    one_line(run(["exits.py", "gate", f"--ckpt={d}"]), "ckpt.pt' not found", "holds ckpt_2.pt, ckpt_10.pt: allowed one")
    assert not (d / "ckpt.exit_gate.pt").exists()


def test_the_measure_scripts_refuse_in_one_line_before_the_work(token_run, tiny_run, tmp_path):
    """Issue 72 item 4: the .ci measurement scripts are commands a user runs (RESULTS.md's recipes): what they cannot
    measure is one line, exit 2, before the work, from any folder."""
    run_dir = str(token_run / "run")
    one_line(run([os.path.join(REPO, ".ci", "arms_measure.py"), run_dir], cwd=tmp_path), "--windows=64 is invalid",
             "allowed 1..")
    r = ok(run([".ci/arms_measure.py", os.path.join(run_dir, "ckpt.pt"), "--windows=1"]))  # a checkpoint file
    assert "| run |" in r.stdout
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(os.path.join(run_dir, "ckpt.pt"), bare / "ckpt.pt")  # a run folder without metrics.jsonl
    assert "| - |" in ok(run([".ci/arms_measure.py", str(bare), "--windows=1"])).stdout
    one_line(run([os.path.join(REPO, ".ci", "pipeline_measure.py"), run_dir], cwd=tmp_path),
             "--new_tokens=200", "block_size >= 216", "allowed --new_tokens=1..16")
    one_line(run([".ci/pipeline_measure.py", tiny_run]), "its window is too short")
    flat = tmp_path / "flat"
    ok(run(["train.py", "config/pretrain_tiny.py", "--data_args={}", f"--data_dir={token_run / 'shards'}",
            f"--out_dir={flat}", "--n_embd=32", "--n_head=2", "--n_layer=1", "--n_loop=2", "--block_size=32",
            "--batch_size=4", "--gradient_accumulation_steps=1", "--max_iters=1", "--eval_interval=1", "--eval_iters=1",
            "--warmup_iters=1", "--lr_decay_iters=1", "--recurrence=none", "--threads=1"]))
    one_line(run([".ci/pipeline_measure.py", str(flat), "--new_tokens=4"]), "recurrence='none'")
    r = subprocess.run(["bash", os.path.join(REPO, ".ci", "exit_measure.sh"), "chnage"], capture_output=True, text=True)
    assert r.returncode == 2 and "'chnage' is not a measurement" in r.stderr and r.stdout == "", r.stderr
