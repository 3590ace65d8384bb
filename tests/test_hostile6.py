"""Hostile pass over round 6 (issue 63 item 6), as a careless or hostile user would try it: the project's mark
(ownership.owned) against files with the project's names, links, pipes and each other's files; a resume's architecture;
retired kernels; the one inert-key rule; meta.json's 'hops'; data_args against hand-made shards; pretrained sizes;
.ci/first_reached.py. Each test asserts the behaviour wanted (one line naming the file and the field, nothing lost,
nothing hung, nothing silent); the ones at the end of the list are regressions that hold now."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import REPO, one_line, run, tiny_train_args

from discoloop.common import ConfigError, DataError
from discoloop.ownership import FIGURE_METADATA, MARK, owned


def first_reached(args, timeout=20):
    return subprocess.run([sys.executable, ".ci/first_reached.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_overwrite_keeps_a_users_metrics_jsonl(tiny_data, tmp_path):
    """metrics.jsonl carries no mark: beside an empty run.lock (any tool's lock file) a user's (or another
    framework's) metrics.jsonl was called "an earlier run's" and --overwrite=True replaced it."""
    d = tmp_path / "theirs"
    d.mkdir()
    (d / "run.lock").write_text("")
    (d / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    r = run(tiny_train_args(tiny_data, str(d), "--max_iters=1", "--eval_interval=1", "--overwrite=True"))
    assert (d / "metrics.jsonl").read_text() == '{"step": 1, "loss": 2.0}\n', "a user's metrics.jsonl was replaced"
    one_line(r, "metrics.jsonl")


def test_the_mark_says_what_wrote_a_file(tmp_path):
    """owned() accepts any mark for any kind: a row log (bench.py step --json) was appended to bench.py's own plan
    cache (one JSON line), which then no longer reads; a probe's result was read and rewritten as a plan cache."""
    from discoloop import train_config
    from discoloop.bench_log import RowLog, cached_plan, read_plan_cache
    cache = tmp_path / "plan.json"
    c = {**train_config.defaults(), "vocab_size": 64, "n_embd": 32, "n_head": 2, "n_layer": 1, "block_size": 16,
         "batch_size": 2, "phi_topk": 8, "activation_checkpointing": "none", "plan_cache": str(cache)}
    cached_plan(c, "loop", torch.float32)  # the cache as bench.py step writes it
    before = cache.read_text()
    assert RowLog(["a"], str(cache), {"x": 1}).path == str(tmp_path / "plan.1.json")  # beside it (ownership.target)
    assert cache.read_text() == before, "rows were appended to the plan cache"
    result = tmp_path / "probe_acc.json"  # as probe.py writes its result
    result.write_text(json.dumps({MARK: "probe.py acc", "probe": "acc", "1": {"val_id": 0.5}}, indent=1))
    kept = result.read_text()
    cached_plan({**c, "plan_cache": str(result)}, "loop", torch.float32)
    assert result.read_text() == kept and read_plan_cache(str(tmp_path / "probe_acc.1.json"))


# --- hangs --------------------------------------------------------------------------------------------------------

def test_a_resume_from_a_named_pipe_does_not_hang(tiny_data, tmp_path):
    """checkpoint.resume_architecture opens ckpt.pt before anything checks what it is: a named pipe there blocked
    train.py --init_from=resume for ever (earlier_work, which refuses pipes, comes later)."""
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / "ckpt.pt")
    try:
        r = run(tiny_train_args(tiny_data, str(out), "--init_from=resume"), timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("train.py --init_from=resume hung on a named pipe at out_dir/ckpt.pt")
    one_line(r, "ckpt.pt")  # one line naming the file, not a hang


def test_first_reached_does_not_hang_on_a_named_pipe(tmp_path):
    pipe = tmp_path / "metrics.jsonl"
    os.mkfifo(pipe)
    try:
        r = first_reached([str(pipe), "acc>=0.9"], timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail("first_reached.py hung opening a named pipe (with -- CMD, even a SIGTERM does not end it)")
    assert r.returncode == 2 and "pipe" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# --- tracebacks ---------------------------------------------------------------------------------------------------

def test_bench_plan_of_a_fused_config_is_not_a_traceback():
    """bench.py plan is arithmetic for a GPU run, made anywhere: with phi_kernel='fused' on a CPU its fake-tensor
    step imported phi_triton, whose ValueError ended in a traceback (device='auto' is refused: 'needs a CUDA
    device', though nothing runs)."""
    if torch.cuda.is_available():
        pytest.skip("CUDA runs the fused kernel")
    r = run(["bench.py", "plan", "config/pretrain_tiny.py", "--vocab_size=64", "--n_embd=32", "--n_head=2",
             "--n_layer=1", "--block_size=16", "--batch_size=2", "--phi_topk=8", "--phi_kernel=fused", "--device=cuda",
             "--world_size=1", "--activation_checkpointing=none"], env={"TRITON_INTERPRET": "0"})
    assert "Traceback" not in r.stderr, r.stderr[-1500:]
    assert r.returncode == 0 or len(r.stderr.strip().splitlines()) == 1, r.stderr[-1500:]


# --- silent -------------------------------------------------------------------------------------------------------

def test_first_reached_with_nothing_to_judge_is_not_a_figure(tmp_path):
    """'not reached', exit 0, for a misspelt metric in an empty file, and for a watched command that wrote no row to
    a file that was there before it (the same as a file that never appears, which is refused)."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    r = first_reached([str(empty), "acc/tset_id>=0.9"])
    assert r.returncode != 0 and "not reached" not in r.stdout, r.stdout + r.stderr
    old = tmp_path / "old.jsonl"
    old.write_text('{"iter": 0, "acc": 0.5}\n')
    r = first_reached([str(old), "acc>=0.9", "--", sys.executable, "-c", "pass"])
    assert r.returncode != 0 and "not reached" not in r.stdout, r.stdout + r.stderr


def test_first_reached_sees_a_file_rewritten_in_place(tmp_path):
    """A metrics file truncated and rewritten in place (the same inode) to at least its old size between two polls:
    its rows were read from the old size on, and the hit reported was the second row's (iter 1), not this run's
    first (iter 0)."""
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"iter": 0, "time": 1, "acc": 0.1, "pad": "x" * 40}) + "\n")
    rewrite = ("import json, sys, time\n"
               "p = sys.argv[1]; L = len(open(p, 'rb').read())\n"
               "r0 = json.dumps({'iter': 0, 'time': 5, 'acc': 0.99}); r0 = r0[:-1] + ' ' * (L - 1 - len(r0)) + '}'\n"
               "f = open(p, 'r+'); f.truncate(0); f.write(r0 + '\\n' + json.dumps({'iter': 1, 'time': 6, 'acc': 0.99}) + '\\n')\n"
               "f.close(); time.sleep(3)\n")
    r = first_reached([str(path), "acc>=0.9", "--", sys.executable, "-c", rewrite, str(path)])
    assert r.returncode == 3 or "iter 0)" in r.stdout, r.stdout + r.stderr


def test_seed_at_temperature_zero_is_refused_like_top_k(tiny_run):
    """The one inert rule: greedy decoding (temperature 0) draws nothing, so --seed does nothing there, as --top_k
    (refused) does; it passed without a word."""
    one_line(run(["sample.py", f"--ckpt={tiny_run}", "--start=e1", "--temperature=0", "--seed=7",
                  "--max_new_tokens=2", "--num_samples=1"]), "seed=7", "temperature")


def test_a_dangling_json_link_keeps_the_link(tiny_run, tmp_path):
    """owned() lets a dangling link be written "(a dangling link: its target is made)", and the plan cache keeps a
    link a link; probe.py's --json replaced the user's link with a file and never made its target."""
    link, target = tmp_path / "latest.json", tmp_path / "results" / "acc.json"
    target.parent.mkdir()
    os.symlink(target, link)
    assert run(["probe.py", "acc", f"--ckpt={tiny_run}", f"--json={link}"]).returncode == 0
    assert os.path.islink(link) and target.is_file()


# --- wrong blame, unnamed file or field ---------------------------------------------------------------------------

def test_meta_json_hops_names_the_split(tiny_data, tmp_path):
    """'hops' >= 1 is checked (regressions first), but the line names the field 'splits' and shows the first 60
    characters of the whole object (a valid split's), not which split's 'hops' is wrong."""
    from discoloop.data_meta import read_meta
    d = tmp_path / "data"
    shutil.copytree(tiny_data, d)
    meta = json.loads((d / "meta.json").read_text())
    for bad in (0, -1, True, "2", None, 1.0):
        meta["splits"]["test_id"]["hops"] = bad
        (d / "meta.json").write_text(json.dumps(meta))
        with pytest.raises(DataError, match="hops' >= 1"):
            read_meta(str(d))
    meta["splits"]["test_id"]["hops"] = 0
    (d / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError) as e:
        read_meta(str(d))
    assert "test_id" in str(e.value) and "hops=0" in str(e.value).replace("'hops': 0", "hops=0"), str(e.value)


def test_a_data_args_typo_is_named(tmp_path):
    """data_args={'encodng': ...} on hand-made shards: refused, but for the script's default encoding, never naming
    the key the user mistyped."""
    d = tmp_path / "shards"
    d.mkdir()
    for split in ("train", "val"):
        (np.arange(600) % 61).astype(np.uint16).tofile(d / f"{split}_000000.bin")
    (d / "meta.json").write_text(json.dumps({"kind": "tokens", "dtype": "uint16", "vocab_size": 61, "eot": 0,
                                             "encoding": "bytes", "shards": {"train": [["train_000000.bin", 600]],
                                                                             "val": [["val_000000.bin", 600]]}}))
    one_line(run(["train.py", "config/pretrain_tiny.py", f"--data_dir={d}", f"--out_dir={tmp_path / 'run'}",
                  "--data_args={'encodng': 'bytes'}", "--max_iters=0", "--threads=1"]), "encodng")


def test_pretrained_positions_count_in_the_size_check(tmp_path):
    """check_fits counts weights, not the positions: max_position_embeddings=10**11 passed, and the rope table of
    that many rows ended as 'out of memory ...: lower batch_size' (common's hook), naming neither file nor field."""
    from discoloop.pretrained import pretrained_architecture
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
        "max_position_embeddings": 10 ** 11}))
    with pytest.raises(DataError, match="max_position_embeddings|block_size|positions"):
        pretrained_architecture(str(folder))


def test_a_retired_kernel_typed_says_where_it_went(tiny_data, tmp_path):
    """A checkpoint's phi_kernel='dense' reads as 'auto' with a note naming lab/phi.py; the same value on the command
    that made that run is 'invalid: allowed ...', so the run's own command cannot resume it and nothing says why."""
    r = run(tiny_train_args(tiny_data, str(tmp_path / "r"), "--recurrence=disco", "--phi_topk=4", "--phi_kernel=dense",
                            "--max_iters=0"))
    assert "lab/phi.py" in r.stderr, r.stderr[-1500:]


def test_a_fused_kernel_a_config_file_sets_is_noted_where_it_does_nothing(tiny_data, tmp_path):
    """A config file's phi_kernel='fused' (a GPU config) on a CPU loop run, where Phi is never decoded: the key is
    inert (a note, train.py's rule) but was refused as 'needs a CUDA device'."""
    if torch.cuda.is_available():
        pytest.skip("CUDA runs the fused kernel")
    cfg = tmp_path / "gpu.py"
    cfg.write_text('phi_kernel = "fused"\n')
    r = run(tiny_train_args(tiny_data, str(tmp_path / "r"), "--recurrence=loop", "--max_iters=0", str(cfg)),
            env={"TRITON_INTERPRET": "0"})
    assert r.returncode == 0 and "phi_kernel" in r.stderr, r.stderr[-1500:]


def test_eval_only_is_not_refused_for_a_file_it_never_touches(tiny_data, tiny_run, tmp_path):
    """eval_only replaces and deletes nothing, yet a user's ckpt_9.pt beside the run refused it: 'only such a file
    is replaced or deleted'."""
    out = tmp_path / "run"
    shutil.copytree(tiny_run, out)
    (out / "ckpt_9.pt").write_text("a user's notes")
    r = run(tiny_train_args(tiny_data, str(out), "--eval_only=True", "--recurrence=loop"))
    assert r.returncode == 0, r.stderr[-1500:]
    assert (out / "ckpt_9.pt").read_text() == "a user's notes"


def test_a_checkpoints_bad_value_names_the_file(tiny_run, tmp_path):
    """'checkpoint model config is invalid: phi_kernel=5 ...' named neither the checkpoint nor where the value is."""
    from discoloop.checkpoint import content_crc
    ck = torch.load(os.path.join(tiny_run, "ckpt.pt"), weights_only=True)
    ck.pop("crc32")
    ck["model_args"]["phi_kernel"] = 5
    path = tmp_path / "ckpt.pt"
    torch.save({**ck, "crc32": content_crc(ck)}, path)
    one_line(run(["probe.py", "acc", f"--ckpt={path}", f"--json={tmp_path / 'p.json'}"]), str(path), "phi_kernel=5")


# --- regressions that hold ----------------------------------------------------------------------------------------


def test_first_reached_fails_loudly_on_what_it_can_see(tmp_path):
    rows = tmp_path / "m.jsonl"
    rows.write_text('{"iter": 0, "acc": 0.5}\nnot json\n{"iter": 2, "acc": 0.9}\n')
    r = first_reached([str(rows), "acc>=0.9"])
    assert r.returncode == 2 and "line 2 is not JSON" in r.stderr, r.stderr
    rows.write_text('{"iter": 0, "acc": 0.5}\n{"iter": 2, "acc": 0.9}\n')
    r = first_reached([str(rows), "acc/tset>=0.9"])
    assert r.returncode == 2 and "'acc/tset' is in none" in r.stderr, r.stderr
    r = first_reached([str(tmp_path / "never.jsonl"), "acc>=0.9", "--", sys.executable, "-c", "pass"])
    assert r.returncode == 2 and "never appeared" in r.stderr, r.stderr


def test_a_retired_kernel_is_one_note_in_the_other_readers(tiny_data, tmp_path):
    """Beside probe.py and sample.py (tests/test_round6.py): exits.py and bench.py sample --ckpt open a checkpoint
    recorded with phi_kernel='dense' with exactly one note each."""
    from discoloop.checkpoint import content_crc
    out = tmp_path / "run"
    r = run(tiny_train_args(tiny_data, str(out), "--max_iters=2", "--eval_interval=2", "--recurrence=disco",
                            "--phi_topk=4"))
    assert r.returncode == 0, r.stderr[-2000:]
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    ck.pop("crc32")
    for key in ("model_args", "config"):
        ck[key]["phi_kernel"] = "dense"
    torch.save({**ck, "crc32": content_crc(ck)}, out / "ckpt.pt")
    for cmd in (["exits.py", f"--ckpt={out}", "--exit_thresholds=0.5", f"--json={tmp_path / 'e.json'}"],
                ["bench.py", "sample", "config/pretrain_tiny.py", f"--ckpt={out}", "--new_tokens=2", "--prompt=2",
                 "--threads=1"]):
        r = run(cmd)
        assert r.returncode == 0, r.stderr[-2000:]
        assert sum("phi_kernel='dense'" in x for x in r.stderr.splitlines()) == 1, r.stderr
