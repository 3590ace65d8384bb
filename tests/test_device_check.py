"""The device check's surfaces, probed as a hostile user would (issue 56 item 6; each case a probe of this session's
hostile pass, its verdict before the mend in the comment): bench.py step's --plan_cache and --json never extend or
replace a file that is not theirs, damaged plans are made again, a signal is one line; .ci/first_reached.py's
arguments are one line, its watcher counts only new rows, stops its command on any signal and says why it ended."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, run
from test_cli import one_line

STEP = ["bench.py", "step", "config/pretrain_tiny.py", "--vocab_size=64", "--n_embd=32", "--n_head=2", "--n_layer=1",
        "--block_size=16", "--batch_size=2", "--phi_topk=8", "--threads=1", "--dtype=float32", "--warmup=0"]
FR = ".ci/first_reached.py"


@pytest.mark.parametrize("content", [
    "hello\n",                       # a user's text file: was overwritten ("damaged: made again")
    "[1, 2, 3]",                     # a JSON list: was overwritten
    '{"name": "mypkg"}',             # a user's JSON object: plan keys were added into it
])
def test_plan_cache_never_rewrites_a_users_file(tmp_path, content):
    f = tmp_path / "mine.json"
    f.write_text(content)
    r = run(STEP + ["--steps=0", f"--plan_cache={f}"])  # left as it is; the cache goes beside it (ownership.target)
    assert r.returncode == 0 and "goes beside it" in r.stderr, r.stderr[-1500:]
    assert f.read_text() == content and json.loads((tmp_path / "mine.1.json").read_text())


def test_plan_cache_special_files(tmp_path):
    """A folder or a pipe is one line (a pipe hung in open); a symbolic link stays a link to the cache it names."""
    one_line(run(STEP + ["--steps=0", f"--plan_cache={tmp_path}"]), "a writable file path")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    one_line(run(STEP + ["--steps=0", f"--plan_cache={fifo}"], timeout=60), "is a named pipe, not a regular file")
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    link.symlink_to(target)
    assert run(STEP + ["--steps=0", f"--plan_cache={link}"]).returncode == 0
    assert link.is_symlink() and json.loads(target.read_text())["discoloop_mark"] == "plan cache"


@pytest.mark.parametrize("value", [0, -5, 1e300, True, "x", None])  # 0 was a ZeroDivisionError, the rest printed
def test_a_damaged_plan_entry_is_made_again(tmp_path, value):
    cache = tmp_path / "plans.json"
    assert run(STEP + ["--variants=loop", "--steps=0", f"--plan_cache={cache}"]).returncode == 0
    good = json.loads(cache.read_text())
    key = next(k for k in good if k != "discoloop_mark")
    cache.write_text(json.dumps({**good, key: value}))
    r = run(STEP + ["--variants=loop", "--steps=1", f"--plan_cache={cache}"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(cache.read_text())[key] == good[key]


def test_json_rows_go_only_to_their_own_file(tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("my notes\n")  # rows were appended after the user's lines
    r = run(STEP + ["--steps=1", f"--json={notes}"])
    assert r.returncode == 0 and "holds a first line that is not JSON" in r.stderr, r.stderr[-1500:]
    assert notes.read_text() == "my notes\n" and (tmp_path / "notes.1.md").read_text().count("\n") >= 2
    rows = tmp_path / "s.jsonl"  # --steps=0 with --json wrote nothing; now the plans are its rows
    assert run(STEP + ["--variants=loop,disco", "--steps=0", f"--json={rows}"]).returncode == 0
    assert run(STEP + ["--variants=loop", "--steps=1", f"--json={rows}"]).returncode == 0  # its own file: appended
    lines = [json.loads(x) for x in rows.read_text().splitlines()]
    assert [x.get("row") for x in lines] == [None, "loop", "disco", None, "loop"]
    assert lines[-1]["peak_alloc_GB"] is None  # NaN (no CUDA) is null, not the non-JSON literal NaN
    assert "MFU vs 989 TF" in run(STEP + ["--variants=loop", "--steps=1"]).stdout  # the basis is in the header


def test_ctrl_c_during_the_plan_is_one_line():
    p = subprocess.Popen([sys.executable, "bench.py", "step", "config/pretrain.py", "--steps=0", "--threads=1"],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(6)  # importing, then the 440M plan (fake tensors, ~15 s)
    p.send_signal(signal.SIGINT)  # was a KeyboardInterrupt traceback
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err.strip().splitlines()[-1].startswith("interrupted: SIGINT during"), err


@pytest.mark.parametrize("args,needle", [
    ([], "usage"),                                      # was an IndexError
    (["m.jsonl"], "usage"),                             # no condition: reported row 1 as a hit
    (["m.jsonl", "acc"], "condition 'acc' is invalid"),
    (["m.jsonl", "acc>0.9"], "condition 'acc>0.9' is invalid"),
    (["m.jsonl", "acc>=abc"], "condition 'acc>=abc' is invalid"),  # was a ValueError at the first matching row
    (["m.jsonl", "acc>=0.9", "--"], "nothing after '--'"),
    (["missing.jsonl", "acc>=0.9"], "does not exist"),  # said "not reached", exit 0
])
def test_first_reached_arguments_are_one_line(tmp_path, args, needle):
    (tmp_path / "m.jsonl").write_text('{"iter": 0, "time": 1.0, "acc": 0.95}\n')
    r = subprocess.run([sys.executable, os.path.join(REPO, FR)] + args, cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error:") and needle in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_first_reached_refuses_a_bad_grace(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(REPO, FR), "m.jsonl", "acc>=0.9"], cwd=tmp_path, capture_output=True,
                       text=True, env={**os.environ, "GRACE_S": "-1"})
    assert r.returncode == 2 and "GRACE_S='-1' is invalid" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_first_reached_watches_only_new_rows_and_says_how_it_ended(tmp_path):
    m = tmp_path / "m.jsonl"
    m.write_text('{"acc": 0.99}\n')  # an old row without time or iter (was a KeyError), already a hit
    r = subprocess.run([sys.executable, FR, str(m), "acc>=0.9"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0 and "first at None s" in r.stdout
    writer = ("import json, time, sys\ntime.sleep(1)\nopen(sys.argv[1], 'a').write(json.dumps({'iter': 7, 'time': 2.5, "
              "'acc': 0.95}) + '\\n')\ntime.sleep(60)")
    t = time.time()
    r = subprocess.run([sys.executable, FR, str(m), "acc>=0.9", "--", sys.executable, "-c", writer, str(m)],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    # the old row did not count (it stopped the command at 0 s), the new one did, and the watcher's stop is exit 0
    assert r.returncode == 0 and "first at 2.5 s" in r.stdout and "stopped at the hit" in r.stdout, r
    assert time.time() - t < 30
    r = subprocess.run([sys.executable, FR, str(m), "acc>=0.9", "--", "/nonexistent/cmd"], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 127 and "cannot run '/nonexistent/cmd'" in r.stderr  # was a FileNotFoundError traceback


def test_first_reached_fails_loudly(tmp_path):
    """Round 6: each of these said "not reached" and exited 0, or read the wrong rows."""
    m = tmp_path / "m.jsonl"
    m.write_text('{"iter": 0, "time": 1.0, "acc/test_id": 0.5}\n')

    def fr(*args, **kw):
        return subprocess.run([sys.executable, FR, *args], cwd=REPO, capture_output=True, text=True, timeout=60, **kw)
    r = fr(str(m), "acc/tset_id>=0.9")  # a misspelt metric
    assert r.returncode == 2 and "metric 'acc/tset_id' is in none of the 1 rows" in r.stderr, r.stderr
    notes = tmp_path / "notes.md"
    notes.write_text("# my notes\nacc>=0.9\n")
    r = fr(str(notes), "acc>=0.9")
    assert r.returncode == 2 and "line 1 is not JSON" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = fr(str(tmp_path / "never.jsonl"), "acc>=0.9", "--", sys.executable, "-c", "pass")
    assert r.returncode == 2 and "never appeared" in r.stderr, r.stderr
    rewrite = ("import sys, os, time\ntime.sleep(0.5)\nopen(sys.argv[1] + '.new', 'w').write('{\"acc/test_id\": 0.99}\\n')\n"
               "os.replace(sys.argv[1] + '.new', sys.argv[1])\ntime.sleep(30)")
    r = fr(str(m), "acc/test_id>=0.9", "--", sys.executable, "-c", rewrite, str(m))  # replaced under the watcher
    assert r.returncode == 3 and "truncated or replaced while watched" in r.stderr, (r.stdout, r.stderr)


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 124), (signal.SIGINT, 130)])
def test_first_reached_stops_a_stubborn_command_on_a_signal(tmp_path, sig, code):
    """A command that ignores SIGTERM is killed GRACE_S later (the watcher hung); Ctrl-C stops it too (it was orphaned)."""
    stubborn = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(120)"
    p = subprocess.Popen([sys.executable, FR, str(tmp_path / "m.jsonl"), "acc>=0.9", "--", sys.executable, "-c",
                          stubborn], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "GRACE_S": "1"})
    time.sleep(2)
    p.send_signal(sig)
    out, _ = p.communicate(timeout=40)
    assert p.returncode == code and "not reached" in out and "out of time" in out


def test_gpu_sh_refuses_an_empty_dry_and_a_missing_gpu(tmp_path):
    for env, needle in (({"DRY": ""}, "DRY= is invalid"), ({"DRY": "0"}, "DRY=0 needs a CUDA device")):
        r = subprocess.run(["bash", ".ci/gpu.sh"], cwd=REPO, env={**os.environ, "OUT": str(tmp_path / "o"), **env},
                           capture_output=True, text=True, timeout=60)
        if needle.startswith("DRY=0") and "torch.cuda" in r.stderr:
            continue
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
