"""Which files are the project's (ownership.py), and what happens to the ones that are not: a file is ours by a mark
inside it, or by a proof an earlier commit left in it (a checkpoint's content CRC, the plan cache's own old mark), never
by its shape or its name. An unmarked file is read where it is input and never written: a movable output (a JSON
result, a row log, a figure) goes beside it under a new name with one note naming both (ownership.target); an output
that cannot move (ckpt.pt, metrics.jsonl, an exit gate) is refused in one line (ownership.owned). Pipes, folders and
devices are refused before they are opened. (Folded from round 6, its hostile pass and round 7; issue 72 item 1.)"""
import json
import os
import shutil

import numpy as np
import pytest
import torch

from conftest import REPO, TINY_DATA, TINY_DATA_ARGS, TINY_MODEL, ok, old_tree, one_line, run, tiny_train_args

from discoloop.common import ConfigError
from discoloop.ownership import FIGURE_METADATA, MARK, owned, target

PRE_MARK = "082ca7f"  # the last commit before files carried the mark (ce527c9 "ownership by a mark")


def beside(r, path, to):
    """r printed the one note naming both files, and exited 0."""
    notes = [ln for ln in ok(r).stderr.splitlines() if "goes beside it" in ln]
    assert len(notes) == 1 and repr(str(path)) in notes[0] and repr(str(to)) in notes[0], r.stderr[-2000:]


def test_owned_reads_the_mark_not_the_name(tmp_path):
    """The one decision, each kind: absent or empty may be written; marked is ours; anything else is one line saying
    what was found; a pipe, a folder, a device are refused before they are opened."""
    f = tmp_path / "x.json"
    assert owned(str(f), "probe.py", "json") is False
    f.write_text("")
    assert owned(str(f), "probe.py", "json") is False
    f.write_text(json.dumps({"probe": "acc", "row": 1, "results": 2, "run": 3}))  # every key an older check wanted
    with pytest.raises(ConfigError, match="and no mark"):
        owned(str(f), "probe.py", "json")
    f.write_text(json.dumps({MARK: "probe.py acc"}))
    assert owned(str(f), "probe.py", "json") is True
    os.mkfifo(tmp_path / "pipe")
    for path, what in ((tmp_path / "pipe", "a named pipe"), (tmp_path, "a folder"), ("/dev/null", "a device")):
        for check in (owned, target):
            with pytest.raises(ConfigError, match=what):
                check(str(path), "probe.py", "json")
    pt = tmp_path / "ckpt.pt"
    torch.save({"model": {}, "model_args": {}}, pt)  # nanoGPT's checkpoint: not ours
    with pytest.raises(ConfigError, match="a torch file object with keys"):
        owned(str(pt), "checkpoint", "checkpoint")
    torch.save({"model": {}, "model_args": {}, "crc32": 12345}, pt)  # our shape, a made-up checksum: no proof
    with pytest.raises(ConfigError, match="no mark"):
        owned(str(pt), "checkpoint", "checkpoint")
    from discoloop.common import content_crc
    ck = {"model": {"w": torch.ones(2)}, "model_args": {}}
    torch.save({**ck, "crc32": content_crc(ck)}, pt)  # an earlier commit's checkpoint proves itself by its content
    assert owned(str(pt), "checkpoint", "checkpoint") is True
    pt.write_text("my notes")
    with pytest.raises(ConfigError, match="torch cannot read"):
        owned(str(pt), "checkpoint", "checkpoint")


@pytest.mark.parametrize("writer, users", [
    ("probe.py", {"probe": "acc", "notes": ["mine"]}),  # a user's notes JSON in probe.py's old shape
    ("eval_harness.py", {"row": "r", "results": {"t": {}}, "n_loop": None, "mean_loops": None}),  # eval_harness's
    ("exits.py", {"mine": 1}),
])
def test_a_shape_is_no_proof_the_output_goes_beside(tmp_path, writer, users, capsys):
    f = tmp_path / "r.json"
    f.write_text(json.dumps(users))
    got = target(str(f), writer, "json")
    assert got == str(tmp_path / "r.1.json") and json.loads(f.read_text()) == users
    assert "left as it is" in capsys.readouterr().err
    (tmp_path / "r.1.json").write_text(json.dumps({MARK: writer}))  # our own file beside it is ours next time
    assert target(str(f), writer, "json") == str(tmp_path / "r.1.json")
    (tmp_path / "r.1.json").write_text("someone's")  # ... and someone else's there too: the next free name
    assert target(str(f), writer, "json") == str(tmp_path / "r.2.json")


def test_outputs_keep_users_files_and_pipes_do_not_hang(tiny_run, tmp_path):
    user = tmp_path / "mine.json"
    user.write_text(json.dumps({"probe": "acc", "notes": [1]}))  # round 7 replaced it as probe.py's old file
    beside(run(["probe.py", "acc", f"--ckpt={tiny_run}", f"--json={user}"]), user, tmp_path / "mine.1.json")
    assert json.loads(user.read_text()) == {"probe": "acc", "notes": [1]}
    assert json.loads((tmp_path / "mine.1.json").read_text())[MARK] == "probe.py acc"
    pipe = tmp_path / "pipe.json"
    os.mkfifo(pipe)
    one_line(run(["exits.py", f"--ckpt={tiny_run}", f"--json={pipe}"], timeout=60), "a named pipe")
    one_line(run(["bench.py", "step", "config/pretrain_tiny.py", "--vocab_size=64", "--steps=1", f"--json={pipe}"], timeout=60),
             "a named pipe")
    rows = tmp_path / "rows.jsonl"
    mine = json.dumps({"run": {"device": "cpu", "dtype": "float32", "torch": "2"}}) + "\n"  # a row log's old shape
    rows.write_text(mine)
    beside(run(["bench.py", "step", "config/pretrain_tiny.py", "--vocab_size=64", "--steps=0", f"--json={rows}"]),
           rows, tmp_path / "rows.1.jsonl")
    assert rows.read_text() == mine
    assert json.loads((tmp_path / "rows.1.jsonl").read_text().splitlines()[0])[MARK] == "rows"
    good = tmp_path / "p.json"  # the project's own result is replaced: the same command twice
    for _ in range(2):
        assert run(["probe.py", "acc", f"--ckpt={tiny_run}", f"--json={good}"]).returncode == 0
    assert json.loads(good.read_text())[MARK] == "probe.py acc"
    assert not (tmp_path / "p.1.json").exists()


def test_arms_measure_json_never_appends_to_a_users_file(tiny_run, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("my notes\n")
    r = run([".ci/arms_measure.py", tiny_run, "--windows=1", f"--json={text}"])
    assert r.returncode != 0 or "goes beside it" in r.stderr, r.stderr  # a symbolic run has no token shards
    assert text.read_text() == "my notes\n"
    one_line(run([".ci/arms_measure.py", tiny_run, f"--json={tmp_path}"]), "a folder")


def test_plot_default_figure_is_not_a_users_file(tiny_run, tmp_path):
    (tmp_path / "curves.png").write_bytes(b"\x89PNG a user's figure")
    beside(run([os.path.join(REPO, "probe.py"), "plot", tiny_run], cwd=tmp_path), "curves.png", "curves.1.png")
    assert (tmp_path / "curves.png").read_bytes() == b"\x89PNG a user's figure"
    fig = tmp_path / "ours.png"
    for _ in range(2):  # a figure the project drew carries the mark and is replaced
        assert run(["probe.py", "plot", tiny_run, f"--png={fig}"]).returncode == 0
    assert owned(str(fig), "figure", "png") is True and not (tmp_path / "ours.1.png").exists()


def test_owned_says_what_it_found(tmp_path):
    """A torch list was 'a torch file with keys list'; a JSON whose mark is not a string was 'a JSON dict with keys
    ['discoloop_mark', ...] without the mark'."""
    pt = tmp_path / "ckpt.pt"
    torch.save([1, 2], pt)
    with pytest.raises(ConfigError) as e:
        owned(str(pt), "checkpoint", "checkpoint")
    assert "keys list" not in str(e.value), str(e.value)
    js = tmp_path / "r.json"
    js.write_text(json.dumps({MARK: 1, "mine": 2}))
    with pytest.raises(ConfigError) as e:
        owned(str(js), "probe.py", "json")
    assert "without the mark" not in str(e.value), str(e.value)


def test_a_large_pdf_the_project_drew_is_its_own(tmp_path):
    """A PDF keeps its Info dictionary (the mark) at its end, and owned() reads the first MiB: the project's own PDF
    figure over 1 MiB was refused as 'without the mark'."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    ax.imshow(np.random.default_rng(0).random((640, 640, 3)), interpolation="none")
    path = tmp_path / "fig.pdf"
    fig.savefig(path, metadata=FIGURE_METADATA)
    plt.close(fig)
    assert path.stat().st_size > 1 << 20
    assert owned(str(path), "figure", "png") is True


def test_owned_follows_links_and_names_before_deciding(tmp_path):
    """A link to a user's file or to a pipe is judged by its target; earlier_work refuses a folder named ckpt_3.pt
    and a user's ckpt_<unicode digit>.pt (str.isdigit) in one line, deleting nothing."""
    from discoloop.checkpoint import earlier_work
    from discoloop.common import CheckpointError
    (tmp_path / "notes.txt").write_text("mine")
    os.symlink(tmp_path / "notes.txt", tmp_path / "link.json")
    with pytest.raises(ConfigError, match="not JSON"):
        owned(str(tmp_path / "link.json"), "probe.py", "json")
    os.mkfifo(tmp_path / "pipe")
    os.symlink(tmp_path / "pipe", tmp_path / "pipe.jsonl")
    with pytest.raises(ConfigError, match="named pipe"):
        target(str(tmp_path / "pipe.jsonl"), "rows", "json")
    for name, make in (("ckpt_3.pt", lambda p: p.mkdir()), ("ckpt_\u0663.pt", lambda p: p.write_text("mine"))):
        d = tmp_path / f"out{len(name)}{ord(name[5])}"
        d.mkdir()
        make(d / name)
        with pytest.raises(CheckpointError, match=name):
            earlier_work(str(d))
        assert (d / name).exists()


@pytest.fixture(scope="module")
def pre_mark(tmp_path_factory):
    """A run folder, its probe_acc.json, a curves.png, a plan cache and a row log (bench.py step --steps=0: no
    run.device in it), made by the pre-mark commit."""
    src = old_tree(tmp_path_factory, PRE_MARK)
    d = tmp_path_factory.mktemp("pre_mark")
    ok(run(["data/symbolic/prepare.py", f"--out_dir={d / 'data'}", *TINY_DATA], cwd=src))
    ok(run(["train.py", "config/symbolic.py", f"--data_dir={d / 'data'}", f"--out_dir={d / 'run'}",
            f"--data_args={TINY_DATA_ARGS}", *TINY_MODEL, "--max_iters=2", "--eval_interval=2", "--recurrence=loop"],
           cwd=src))
    ok(run(["probe.py", "acc", f"--ckpt={d / 'run'}"], cwd=src))
    ok(run(["probe.py", "plot", str(d / "run"), f"--png={d / 'curves.png'}"], cwd=src))
    ok(run(["bench.py", "step", "config/pretrain_tiny.py", "--vocab_size=64", "--steps=0", "--n_layer=1",
            f"--plan_cache={d / 'plans.json'}", f"--json={d / 'rows.jsonl'}"], cwd=src))
    return d


def test_what_the_commit_before_the_mark_wrote_stays_as_it_was(pre_mark, tmp_path):
    """Its checkpoint proves itself (its content CRC) and resumes; its plan cache carries a mark of its own and is
    extended; its results, figure and row log prove nothing, so they stay byte for byte and today's go beside them
    with one note each; nothing is refused for being old."""
    d = pre_mark
    before = {n: (d / n).read_bytes() for n in ("run/probe_acc.json", "curves.png", "rows.jsonl")}
    beside(run(["probe.py", "acc", f"--ckpt={d / 'run'}"]), d / "run" / "probe_acc.json", d / "run" / "probe_acc.1.json")
    beside(run(["probe.py", "plot", str(d / "run"), f"--png={d / 'curves.png'}"]), d / "curves.png", d / "curves.1.png")
    plans = json.loads((d / "plans.json").read_text())
    r = ok(run(["bench.py", "step", "config/pretrain_tiny.py", "--vocab_size=64", "--steps=1", "--n_layer=1",
                f"--plan_cache={d / 'plans.json'}", f"--json={d / 'rows.jsonl'}"]))
    assert sum("earlier commit" in ln for ln in r.stderr.splitlines()) == 1, r.stderr  # the plan cache, proven
    assert sum("goes beside it" in ln for ln in r.stderr.splitlines()) == 1, r.stderr  # the row log
    assert set(plans) <= set(json.loads((d / "plans.json").read_text()))  # its plans are kept
    assert json.loads((d / "rows.1.jsonl").read_text().splitlines()[0])[MARK] == "rows"
    assert before == {n: (d / n).read_bytes() for n in before}
    res = tmp_path / "resumed"  # the old run resumes: its ckpt.pt proves itself and is replaced
    shutil.copytree(d / "run", res)
    r = ok(run(tiny_train_args(str(d / "data"), str(res), "--max_iters=4", "--eval_interval=2",
                               "--recurrence=loop", "--init_from=resume")))
    assert torch.load(res / "ckpt.pt", weights_only=True)[MARK] == "checkpoint"
    gone = tmp_path / "gone"  # without its ckpt.pt, the old metrics.jsonl proves nothing: one line, kept as it is
    shutil.copytree(d / "run", gone)
    os.remove(gone / "ckpt.pt")
    log = (gone / "metrics.jsonl").read_bytes()
    one_line(run(tiny_train_args(str(d / "data"), str(gone), "--max_iters=2", "--eval_interval=2",
                                 "--overwrite=True")), "metrics.jsonl")
    assert (gone / "metrics.jsonl").read_bytes() == log
