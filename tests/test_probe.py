"""probe.py on a tiny checkpoint trained inside the test."""
import json
import os
import subprocess

import pytest
import torch

from conftest import REPO, TINY_DATA_ARGS, TINY_MODEL, run, tiny_train_args


@pytest.fixture(scope="module")
def tiny_ckpts(tiny_data, tmp_path_factory):
    outs = {}
    for rec, extra in (("loop", []), ("disco", ["--disco_gate=learned"]), ("none", [])):
        out = str(tmp_path_factory.mktemp("probe") / rec)
        r = run(tiny_train_args(tiny_data, out, "--max_iters=120", "--eval_interval=60", f"--recurrence={rec}", *extra))
        assert r.returncode == 0, r.stderr
        outs[rec] = out
    return outs


def probe(*args):
    r = run(["probe.py", *args, "--threads=1"])
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_acc_table_every_loop_count(tiny_ckpts, tiny_data):
    out = probe("acc", f"--ckpt={tiny_ckpts['loop']}", "--n_loop=1,2,4")
    assert "| n_loop | train_atom | train_id | test_id | test_ood | val_id | atoms_A | atoms_B |" in out
    res = json.load(open(os.path.join(tiny_ckpts["loop"], "probe_acc.json")))
    assert res.pop("probe") == "acc" and res.pop("discoloop_mark") == "probe.py acc" and set(res) == {"1", "2", "4"} and all(0 <= v <= 1 for r in res.values() for v in r.values())
    # n_loop=2 is the trained model: equals the final accuracy in training's last metrics line (fp32 both)
    last = [json.loads(line) for line in open(os.path.join(tiny_ckpts["loop"], "metrics.jsonl"))][-1]
    assert res["2"]["test_id"] == pytest.approx(last["acc/test_id"], abs=1e-4)
    assert res["1"]["train_atom"] == pytest.approx(last["acc1/train_atom"], abs=1e-4)
    from probe import atom_graphs
    from discoloop.qa_data import QAData
    graphs = atom_graphs(QAData(tiny_data))
    n_a, n_b = graphs.count("A"), graphs.count("B")
    assert n_a > 0 and n_b > 0 and n_a + n_b == len(graphs)
    for r in res.values():  # the two graphs' atoms make up train_atom
        assert n_a * r["atoms_A"] + n_b * r["atoms_B"] == pytest.approx(len(graphs) * r["train_atom"], abs=1e-6)


def test_atom_graphs_follow_the_facts(tiny_data):
    """Each atom's subject is placed in its graph, and a fact never leaves its graph."""
    from probe import atom_graphs
    from discoloop.qa_data import QAData
    data = QAData(tiny_data)
    ents = data.meta["entities"]
    X, Y = data.splits["train_atom"]
    for g, x, y in zip(atom_graphs(data), X[:, 0].tolist(), Y[:, 1].tolist()):
        assert data.meta["vocab"][x] in ents[g] and data.meta["vocab"][y] in ents[g]


def test_lens_values_in_range_and_disco_injected_state(tiny_ckpts):
    probe("lens", f"--ckpt={tiny_ckpts['disco']}")
    res = json.load(open(os.path.join(tiny_ckpts["disco"], "probe_lens.json")))
    where, _, _ = res.pop("where"), res.pop("probe"), res.pop("discoloop_mark")
    probe("acc", f"--ckpt={tiny_ckpts['disco']}", "--n_loop=2", "--json=" + os.path.join(tiny_ckpts["disco"], "acc2.json"))
    final = json.load(open(os.path.join(tiny_ckpts["disco"], "acc2.json")))["2"]
    assert set(res) == {"train_id", "val_id", "test_id", "test_ood"}
    for s, r in res.items():
        assert 0 <= r["P(b|H1)"] <= 1 and -1 <= r["cos(H1,W[b])"] <= 1 and "cos(H~1,W[b])" in r
        # final accuracy = P(b decoded) P(right | decoded) + P(not decoded) P(right | not decoded)
        ok, right_if_ok = r["argmax=b"], (0.0 if r["acc if argmax=b"] != r["acc if argmax=b"] else r["acc if argmax=b"])
        assert ok * right_if_ok - 1e-6 <= final[s] <= ok * right_if_ok + (1 - ok) + 1e-6
        assert r["pos"] == 1 and where[f"{s} b1"][1] == pytest.approx(r["argmax=b"])  # symbolic bridge: position 1
        assert len(where[f"{s} b1"]) == 3  # (entity, relation, relation)


def test_sweep_alpha0_is_the_unmodified_model_and_alpha1_uses_bmax(tiny_ckpts, tmp_path):
    png = str(tmp_path / "sweep.png")
    probe("sweep", f"--ckpt={tiny_ckpts['loop']}", "--alphas=0,1", f"--png={png}", "--norm=unit")
    res = json.load(open(os.path.join(tiny_ckpts["loop"], "probe_sweep.json")))["results"]
    acc_json = str(tmp_path / "acc.json")  # its own acc run: tests may run in any order, on any worker
    probe("acc", f"--ckpt={tiny_ckpts['loop']}", "--n_loop=2", f"--json={acc_json}")
    acc = json.load(open(acc_json))
    assert res["0.00"]["test_id"] == pytest.approx(acc["2"]["test_id"])
    assert os.path.getsize(png) > 1000


def test_gate_probe(tiny_ckpts):
    out = probe("gate", f"--ckpt={tiny_ckpts['disco']}")
    assert "loop1/entity" in out and "loop1/relation" in out and "| loop1/pos2 | relation |" in out
    res = json.load(open(os.path.join(tiny_ckpts["disco"], "probe_gate.json")))
    # symbolic questions are (entity, relation, relation): the means by type are the means by position
    assert res["loop1/entity"] == pytest.approx(res["loop1/pos0"])
    assert res["loop1/relation"] == pytest.approx((res["loop1/pos1"] + res["loop1/pos2"]) / 2)
    assert "loop1/pos3" not in res  # answer positions are not question tokens


def test_plot(tiny_ckpts, tmp_path):
    png = str(tmp_path / "curves.png")
    out = probe("plot", *tiny_ckpts.values(), f"--png={png}")
    assert os.path.getsize(png) > 1000 and "| run |" in out


def test_plot_hops_reads_the_k_hop_splits(tiny_ckpts, tmp_path):
    """--hops=3 tabulates the *_3hop metrics (here written by hand into a log), and a run without them
    is a one-line error."""
    run3 = tmp_path / "run3"
    run3.mkdir()
    rows = [{"iter": i * 10, "epoch": i, "time": 60.0 * i, "cpu_time": 30.0 * i, "acc/test_id": 0.5,
             "acc/test_id_3hop": 0.3 * i, "acc/test_ood_3hop": 0.2 * i, "acc1/train_id_3hop": 0.9 - 0.3 * i}
            for i in range(4)]
    (run3 / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in rows))
    out = probe("plot", str(run3), "--hops=3", f"--png={tmp_path / 'c.png'}", f"--json={tmp_path / 'c.json'}")
    assert "| run3 | 3 | 3 | 1.5 | 0.9 | 0.6 |" in out  # last row: epoch, minutes, CPU minutes, 3-hop ID / OOD
    res = json.load(open(tmp_path / "c.json"))["run3"]["first"]
    assert res["test_id>=0.8"] == "3 (3.0; 1.5)" and res["test_ood>=0.8"] == "-" and res["stage1_collapse"] == 3
    r = run(["probe.py", "plot", tiny_ckpts["loop"], "--hops=3", f"--png={tmp_path / 'd.png'}"])
    assert r.returncode == 2 and "no test_id_3hop" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,needle", [
    (["acc", "--ckpt=/nonexistent/ckpt.pt"], "not found"),
    (["acc"], "needs --ckpt"),
    (["plot", "/nonexistent"], "no metrics.jsonl"),
    (["sweep", "--norm=l7"], "norm='l7' is invalid"),
    (["lens", "--nrom=rms"], "did you mean 'norm'"),
    (["nope"], "command 'nope' is invalid"),
])
def test_bad_input(args, needle):
    r = run(["probe.py", *args])
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_checkpoint_from_other_dataset_refused(tiny_ckpts, tmp_path):
    other = str(tmp_path / "other")
    assert run(["data/symbolic/prepare.py", f"--out_dir={other}", "--n_entities=30", "--n_relations=8",
                "--out_degree=4", "--n_train=200", "--n_test=50", "--n_val=50", "--seed=7"]).returncode == 0
    r = run(["probe.py", "acc", f"--ckpt={tiny_ckpts['loop']}", f"--data_dir={other}"])
    assert r.returncode == 2 and "another dataset" in r.stderr and "seed" in r.stderr


def test_truncated_checkpoint_refused(tiny_ckpts, tmp_path):
    bad = tmp_path / "ckpt.pt"
    bad.write_bytes(open(os.path.join(tiny_ckpts["loop"], "ckpt.pt"), "rb").read()[:500])
    r = run(["probe.py", "lens", f"--ckpt={bad}"])
    assert r.returncode == 2 and "not a readable checkpoint" in r.stderr


def test_bridge_chain_follows_the_atoms(tiny_data):
    """bridges(split, j) walks j atomic facts; walking all hops of a question must give its answer."""
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from probe import bridges
    from discoloop.qa_data import QAData
    data = QAData(tiny_data)
    for s, info in data.meta["splits"].items():
        if info["hops"] >= 2:
            X, Y = data.splits[s]
            answers = Y[Y != -1]
            assert (bridges(data, s, info["hops"]) == answers).all(), s
            assert (bridges(data, s, 1) != answers).any(), s   # depth 1 is the bridge, not the answer


def test_padded_data_reads_the_same_questions_and_probes(tiny_data, tmp_path_factory, tmp_path):
    """pad_left (hop extrapolation): the probes see each padded training question as its unpadded self, and a
    loops_by_hops run on padded data trains and probes end to end."""
    from conftest import TINY_DATA, prepared
    from probe import bridges, examples
    from discoloop.qa_data import QAData
    padded_dir = prepared(tmp_path_factory, "data/symbolic/prepare.py", TINY_DATA + ["--pad_left=2"])
    plain, padded = QAData(tiny_data), QAData(padded_dir)
    assert padded.meta["config"]["pad_left"] == 2
    for s in plain.splits:
        assert examples(padded, s) == examples(plain, s), s
        if plain.hops(s) >= 2:
            assert torch.equal(bridges(padded, s, 1), bridges(plain, s, 1)), s
    out = str(tmp_path / "run")
    args = tiny_train_args(padded_dir, out, "--max_iters=20", "--eval_interval=20", "--loops_by_hops=True",
                           "--pos_emb=rope")
    args = [a[:-1] + ", 'pad_left': 2}" if a.startswith("--data_args") else a for a in args]
    r = run(args)
    assert r.returncode == 0, r.stderr
    lens = probe("lens", f"--ckpt={out}")
    assert "| train_id | 1 |" in lens and "| test_id | 1 |" in lens


def test_probes_of_a_non_looped_checkpoint_on_deeper_splits(tmp_path_factory):
    """recurrence='none' has K untied copies and no loop past them: the lens leaves out the splits deeper than K and
    says so (it used to end in a traceback), acc refuses an explicit loop count past K instead of dropping it."""
    from conftest import TINY_DATA, prepared
    data = prepared(tmp_path_factory, "data/symbolic/prepare.py", TINY_DATA + ["--eval_hops=3"])
    out = str(tmp_path_factory.mktemp("flat3") / "run")
    args = tiny_train_args(data, out, "--max_iters=5", "--eval_interval=5", "--recurrence=none", "--n_loop=2")
    args = [a[:-1] + ", 'eval_hops': 3}" if a.startswith("--data_args") else a for a in args]
    assert run(args).returncode == 0
    lens = probe("lens", f"--ckpt={out}")
    assert "(left out: test_id_3hop, test_ood_3hop, deeper than the 2 untied copies" in lens and "| train_id |" in lens
    r = run(["probe.py", "acc", f"--ckpt={out}", "--n_loop=1,3"])
    assert r.returncode == 2 and "allowed loop counts 1..2" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "| 2 |" in probe("acc", f"--ckpt={out}") and "| 3 |" not in probe("acc", f"--ckpt={out}")


def test_plot_refuses_bad_figures_epochs_and_folders(tiny_ckpts, tmp_path):
    """Each one line before any figure: a --png matplotlib cannot write by its suffix (it used to fail after the work),
    an at_epoch other than -1 below 0, an at_epoch before a run's first evaluation (an IndexError), a token-shard run
    without or with a damaged config.json (a traceback), a folder given twice (one run silently dropped)."""
    loop = tiny_ckpts["loop"]
    pre = tmp_path / "pre"
    pre.mkdir()
    (pre / "metrics.jsonl").write_text("".join(json.dumps({"iter": i * 10, "time": 6.0 * i, "loss": 3 - 0.1 * i,
                                                           "val_loss": 3.1 - 0.1 * i}) + "\n" for i in range(1, 4)))
    for args, needle in [([loop, f"--png={tmp_path / 'q.txt'}"], "png="),
                         ([loop, "--at_epoch=-5"], "at_epoch=-5.0 is invalid: allowed -1"),
                         ([str(pre), "--at_epoch=5"], "no evaluation at or before at_epoch=5 (its first is at 10)"),
                         ([str(pre)], "no config.json in"),
                         ([loop, loop], "is given twice"), ([loop, "--hops=1"], "hops=1")]:
        r = run(["probe.py", "plot", *args, f"--png={tmp_path / 'c.png'}"] if "--png" not in " ".join(args)
                else ["probe.py", "plot", *args])
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert "Traceback" not in r.stderr
    assert ".png, .pdf, .svg" in run(["probe.py", "plot", loop, "--png=q.txt"]).stderr
    (pre / "config.json").write_text('{"batch')
    r = run(["probe.py", "plot", str(pre), f"--png={tmp_path / 'c.png'}"])
    assert r.returncode == 2 and "cannot be read as JSON" in r.stderr
    (pre / "config.json").write_text(json.dumps({"batch_size": 2, "gradient_accumulation_steps": 1, "block_size": 16}))
    probe("plot", str(pre), f"--png={tmp_path / 'c.svg'}", "--at_epoch=20", f"--json={tmp_path / 'p.json'}")
    assert json.load(open(tmp_path / "p.json"))["pre"]["iter"] == 20 and os.path.getsize(tmp_path / "c.svg") > 1000


def test_plot_keeps_runs_that_share_a_name(tiny_ckpts, tmp_path):
    import shutil
    for sub in ("a", "b"):
        shutil.copytree(tiny_ckpts["loop"], tmp_path / sub / "run")
    probe("plot", str(tmp_path / "a" / "run"), str(tmp_path / "b" / "run"), f"--png={tmp_path / 'c.png'}",
          f"--json={tmp_path / 'c.json'}")
    assert len(json.load(open(tmp_path / "c.json"))) == 4  # the mark, "probe" and one row per run, not one overwriting the other


def test_probe_without_a_command_is_one_line():
    r = run(["probe.py"])
    assert r.returncode == 2 and "a command is required" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_token_shard_data_dir_is_named(tiny_ckpts, tmp_path):
    """--data_dir of token shards for a question-answer checkpoint: the folder is named, not the checkpoint blamed."""
    shards = tmp_path / "shards"
    assert run(["data/pretrain/prepare.py", f"--out_dir={shards}", "--encoding=bytes", "--num_proc=1",
                "--data_files=synthetic:web", "--weights=1", "--max_tokens=2000", "--val_tokens=500"]).returncode == 0
    r = run(["probe.py", "acc", f"--ckpt={tiny_ckpts['loop']}", f"--data_dir={shards}"])
    assert r.returncode == 2 and f"data_dir='{shards}' is not a question-answer dataset" in r.stderr


def test_a_key_of_another_command_is_one_line(tiny_ckpts):
    """--norm means nothing to acc, --raw nothing to plot: accepted silently, they would look applied."""
    for args, needle in [(["acc", f"--ckpt={tiny_ckpts['loop']}", "--norm=unit"], "--norm does not apply to probe.py acc"),
                         (["plot", tiny_ckpts["loop"], "--raw=True"], "--raw does not apply to probe.py plot")]:
        r = run(["probe.py", *args])
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_gpu_symbolic_script_dry_runs_on_cpu(tiny_data, tmp_path):
    """.ci/gpu_symbolic.sh, the anchors' recipe for a lent GPU, runs end to end on the CPU with a tiny model: train,
    then Table 1 and Fig. 2's probes on the kept and the last checkpoint, each exiting 0."""
    out = tmp_path / "gpu"
    env = dict(os.environ, OUT=str(out), DEVICE="cpu", TRAIN_S="240", OMP_NUM_THREADS="1")
    r = subprocess.run(["bash", ".ci/gpu_symbolic.sh", f"--data_dir={tiny_data}", f"--data_args={TINY_DATA_ARGS}", *TINY_MODEL,
                        "--dropout=0.0", "--max_iters=6", "--keep_every=4", "--eval_interval=4", "--warmup_iters=2"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    summary = (out / "summary.txt").read_text()
    assert r.returncode == 0 and "train exit 0" in summary, (summary, (out / "train.log").read_text()[-2000:])
    for name in ("ckpt_4", "ckpt"):  # the kept checkpoint and the last
        assert f"probed {name}: acc/lens/sweep exits 0/0/0" in summary, summary
    assert "| n_loop |" in (out / "ckpt.acc.md").read_text() and (out / "ckpt.sweep.png").is_file()
