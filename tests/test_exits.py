"""exits.py: adaptive depth against fixed K (question-answer and token data), and the learned exit (`exits.py gate`,
exit_rule='gate' wherever exits are offered), on tiny checkpoints trained inside the test."""
import hashlib
import json
import os
import shutil

import pytest
import torch

from conftest import one_line, run, tiny_train_args

TOKENS = ["config/pretrain_tiny.py", "--data_args={}", "--n_embd=32", "--n_head=2", "--n_layer=1", "--n_loop=3",
          "--block_size=32", "--batch_size=4", "--gradient_accumulation_steps=1", "--max_iters=6", "--eval_interval=6",
          "--eval_iters=1", "--warmup_iters=2", "--lr_decay_iters=6", "--phi_topk=0", "--phi_chunk=0", "--threads=1"]


def exits(*args):
    r = run(["exits.py", *args, "--threads=1"])
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def shards(folder, val):
    assert run(["data/pretrain/prepare.py", f"--out_dir={folder}", "--encoding=bytes", "--num_proc=1",
                "--data_files=synthetic:web", "--weights=1", "--max_tokens=20000", f"--val_tokens={val}"]).returncode == 0


@pytest.fixture(scope="module")
def qa_ckpts(tiny_data, tmp_path_factory):
    outs = {}
    for rec, extra in (("disco", ["--disco_gate=learned"]), ("none", [])):
        out = str(tmp_path_factory.mktemp("exits") / rec)
        r = run(tiny_train_args(tiny_data, out, "--max_iters=120", "--eval_interval=60", f"--recurrence={rec}", *extra))
        assert r.returncode == 0, r.stderr
        outs[rec] = out
    return outs


@pytest.fixture(scope="module")
def token_runs(tmp_path_factory):
    """Two pretraining runs on the same shards, seeds 0 and 1 (two models of one shape), and a too-short val set."""
    d = tmp_path_factory.mktemp("exits_tokens")
    shards(d / "shards", 2000)
    shards(d / "short", 20)
    for seed in (0, 1):
        r = run(["train.py", *TOKENS, f"--data_dir={d / 'shards'}", f"--out_dir={d / f'run{seed}'}", f"--seed={seed}"])
        assert r.returncode == 0, r.stderr[-2000:]
    return d


def test_threshold_zero_is_one_loop(qa_ckpts, tmp_path):
    """Threshold 0 exits every token after loop 1, so each split scores as the fixed one-loop model with one loop per
    token; the table, the JSON and the figure are written; bad exits are one line."""
    out = exits(f"--ckpt={qa_ckpts['disco']}", "--exit_thresholds=0,0.9", f"--png={tmp_path / 'e.png'}",
                f"--json={tmp_path / 'e.json'}")
    assert "| prob 0 | test_id | 2 |" in out and "| fixed n=1 | fixed n=2 |" in out and os.path.exists(tmp_path / "e.png")
    res = json.load(open(tmp_path / "e.json"))
    assert res["discoloop_mark"] == "exits.py" and res["exit_rule"] == "prob"
    for s, r in res["adaptive"]["0"].items():
        assert r["acc"] == pytest.approx(res["fixed"]["1"][s], abs=1e-9) and r["mean_loops"] == 1, s
        assert r["answer_exit_hist"] == [1.0, 0.0]
    for args, needle in ((["--exit_thresholds=1.5"], "threshold=1.5"), (["--exit_rule=sure"], "exit_rule='sure'"),
                         (["--n_loop=2,3"], "n_loop"), (["--gate_bound=0.1"], "--gate_bound does not apply")):
        one_line(run(["exits.py", f"--ckpt={qa_ckpts['disco']}", *args]), needle)
    for rule in ("prob", "gate"):
        one_line(run(["exits.py", f"--ckpt={qa_ckpts['none']}", f"--exit_rule={rule}"]), "recurrence='none'")
    one_line(run(["exits.py", "gate", f"--ckpt={qa_ckpts['none']}"]), "recurrence='none'")
    one_line(run(["exits.py", "exit", f"--ckpt={qa_ckpts['disco']}"]), "verb 'exit' is invalid")


def test_probe_exit_says_where_it_went(qa_ckpts):
    one_line(run(["probe.py", "exit", f"--ckpt={qa_ckpts['disco']}", "--exit_thresholds=0.5"]),
             "probe.py exit moved to exits.py: python exits.py --ckpt=")


def test_a_users_file_and_every_threshold_are_kept(qa_ckpts, tmp_path):
    """--json onto a user's text file replaced it (lost work); repeated thresholds that print alike lost rows in the
    JSON (silent). A user's file is left as it is (the output goes beside it, issue 72), repeats are one line;
    thresholds that differ are kept apart."""
    mine, theirs, fig = tmp_path / "user.txt", tmp_path / "user.json", tmp_path / "fig.png"
    mine.write_text("hi\n")
    theirs.write_text('{"mine": 1}')
    fig.write_text("not a figure")
    for args, needle in (([f"--json={mine}"], "holds text that is not JSON"),
                         ([f"--json={theirs}"], "holds a JSON object with keys ['mine']"),
                         ([f"--png={fig}", f"--json={tmp_path / 'r.json'}"], "without the figure mark")):
        r = run(["exits.py", f"--ckpt={qa_ckpts['disco']}", "--exit_thresholds=0.9", "--splits=test_id", *args])
        assert r.returncode == 0 and needle in r.stderr and "goes beside it" in r.stderr, r.stderr[-1500:]
    assert (tmp_path / "user.1.txt").exists() and (tmp_path / "user.1.json").exists() and (tmp_path / "fig.1.png").exists()
    for args, needle in ((["--exit_thresholds=0.5,0.5,0.50000000000001"], "repeats a threshold"),
                         (["--exit_thresholds=0,-0"], "repeats a threshold"),
                         (["--splits=test_id,test_id"], "repeats a split"),
                         (["--windows=3"], "applies to a pretraining run's validation shards")):
        one_line(run(["exits.py", f"--ckpt={qa_ckpts['disco']}", *args]), needle)
    assert mine.read_text() == "hi\n" and theirs.read_text() == '{"mine": 1}' and fig.read_text() == "not a figure"
    out = tmp_path / "again.json"  # a result of exits.py is replaced: the same command twice
    for _ in range(2):
        exits(f"--ckpt={qa_ckpts['disco']}", "--exit_thresholds=0.9999999,1", f"--json={out}", f"--png={fig}.png",
              "--splits=test_id")
    assert set(json.load(open(out))["adaptive"]) == {"0.9999999", "1"}


def test_token_shards_read_validation_loss(qa_ckpts, tiny_data, token_runs, tmp_path):
    """A pretraining run: validation loss against mean loops per token. Threshold 0 exits every token after loop 1, so
    its loss is the fixed one-loop loss; a prob threshold of 1 never fires: the fixed-K loss, nothing exited or
    changed. A question-answer checkpoint on these shards, this run on question-answer data or on shards too short
    for one window, and --splits, are one line."""
    out, sh = token_runs / "run0", token_runs / "shards"
    text = exits(f"--ckpt={out}", "--exit_thresholds=0,1", "--windows=20", f"--json={tmp_path / 'e.json'}",
                 f"--png={tmp_path / 'e.png'}")
    res = json.load(open(tmp_path / "e.json"))
    assert "| prob 0 (min 1) | 1 | 66.7% |" in text and res["windows"] == 20 and os.path.exists(tmp_path / "e.png")
    zero, one = res["adaptive"]["0"]["val"], res["adaptive"]["1"]["val"]
    assert zero["loss"] == pytest.approx(res["fixed"]["1"]["val"], abs=1e-6) and zero["mean_loops"] == 1
    assert zero["exited"] == 1 and 0 <= zero["changed_top1"] <= 1
    assert one == {"loss": pytest.approx(res["fixed"]["3"]["val"], abs=1e-6), "mean_loops": 3, "exited": 0,
                   "changed_top1": 0, "changed_all": 0}
    assert zero["changed_all"] == pytest.approx(zero["changed_top1"])  # every token exited: the two shares agree
    assert res["fixed"]["1"]["val"] != pytest.approx(res["fixed"]["3"]["val"], abs=1e-6)  # the two ends differ
    for args, needle in (([f"--ckpt={out}", "--splits=test_id"], "a pretraining run has one"),
                         ([f"--ckpt={qa_ckpts['disco']}", f"--data_dir={sh}"], "is not a question-answer dataset"),
                         ([f"--ckpt={out}", f"--data_dir={tiny_data}"], "is not a token shard dataset"),
                         ([f"--ckpt={out}", f"--data_dir={token_runs / 'short'}"], "fewer than block_size=32 + 1 tokens")):
        one_line(run(["exits.py", *args]), needle)


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_gate_trains_calibrates_and_runs_everywhere(token_runs, tmp_path):
    """`exits.py gate` writes ckpt.exit_gate.pt beside the checkpoint (marked; ckpt.pt untouched), calibrated on the val
    windows: measured there again by exits.py at its own threshold, at most `bound` of the exited tokens' top-1 is not
    loop K's. exit_rule='gate' then runs in exits.py, sample.py and eval_harness.py; the 'improve' label trains too."""
    from eval_harness import DiscoLoopLM
    from test_eval_harness import Req
    run0 = token_runs / "run0"
    before = sha(run0 / "ckpt.pt")
    text = exits("gate", f"--ckpt={run0}", "--gate_tokens=2000", "--calib_windows=0", "--gate_bound=0.2",
                 "--gate_iters=50")
    assert "calibrated: threshold" in text and sha(run0 / "ckpt.pt") == before
    rec = torch.load(run0 / "ckpt.exit_gate.pt", weights_only=True)
    assert rec["discoloop_mark"] == "exit gate" and rec["label"] == "agree" and rec["K"] == 3 and rec["bound"] == 0.2
    assert rec["gate_features"] == "change" and rec["gate"]["w.weight"].shape == (1, 5)
    assert rec["calibration"]["met"] and rec["calibration"]["changed_top1"] <= 0.2
    assert rec["training"]["bce"] <= rec["training"]["constant_bce"] + 1e-6  # the gate learned at least the constant
    exits(f"--ckpt={run0}", "--exit_rule=gate", f"--json={tmp_path / 'g.json'}")  # every val window: the calibration data
    res = json.load(open(tmp_path / "g.json"))
    key = f"{rec['threshold']:.12g}"
    assert set(res["adaptive"]) == {"0.5", "0.7", "0.8", "0.9", "0.95", "0.99", key}
    assert res["adaptive"][key]["val"]["changed_top1"] <= 0.2
    assert res["adaptive"][key]["val"]["mean_loops"] == pytest.approx(rec["calibration"]["mean_loops"], abs=1e-9)
    r = run(["sample.py", f"--ckpt={run0}", "--exit_rule=gate", "--max_new_tokens=4", "--num_samples=1", "--threads=1"])
    assert r.returncode == 0 and f"adaptive depth (gate {rec['threshold']:g})" in r.stderr, r.stderr[-2000:]
    lm = DiscoLoopLM(str(run0), batch_size=4, dtype="float32", exit_rule="gate")
    assert lm.exits.rule == "gate" and lm.exits.threshold == rec["threshold"]
    lm.loglikelihood([Req("The small cat", " sees the dog.")], disable_tqdm=True)
    assert lm.loops[1] > 0 and lm.loops[1] <= lm.loops[0] <= 3 * lm.loops[1]
    exits("gate", f"--ckpt={run0}", "--gate_tokens=2000", "--gate_label=improve", "--gate_iters=20",
          "--gate_features=state")  # replaces its own; issue 62's gate on the state
    rec = torch.load(run0 / "ckpt.exit_gate.pt", weights_only=True)
    assert rec["label"] == "improve" and rec["gate_features"] == "state" and rec["gate"]["w.weight"].shape == (1, 32 + 3)
    exits(f"--ckpt={run0}", "--exit_rule=gate", "--windows=2", f"--json={tmp_path / 's.json'}")
    good = rec["gate"]["w.weight"].clone()
    for key, value, needles in (  # hand-edited or damaged: one line naming what is wrong (a NaN gate never exits)
            ("gate_features", "colour", ["gate_features='colour' is invalid", "['change', 'state']"]),
            ("w.weight", torch.full_like(good, float("nan")), ["w.weight is not finite"]),
            ("w.weight", good[:, :6], ["w.weight of shape (1, 6), expected (1, 35)"]),
            ("w.weight", good.to(torch.complex64), ["complex64, not real numbers"]),
            ("crc32", "x", ["crc32='x' (allowed an integer >= 0)"])):
        bad = {**rec, "gate": {**rec["gate"], key: value}} if key == "w.weight" else {**rec, key: value}
        torch.save(bad, run0 / "ckpt.exit_gate.pt")
        one_line(run(["exits.py", f"--ckpt={run0}", "--exit_rule=gate", "--threads=1"]), *needles)
    torch.save({k: v for k, v in rec.items() if k != "gate_features"} | {"gate": {**rec["gate"], "w.weight": good[:, :6]}},
               run0 / "ckpt.exit_gate.pt")  # a file that names no kind is read as issue 62's: said when it fails
    one_line(run(["exits.py", f"--ckpt={run0}", "--exit_rule=gate", "--threads=1"]), "read as issue 62's 'state' gate")
    torch.save(rec, run0 / "ckpt.exit_gate.pt")  # as it was, for the tests after this one


def test_the_change_features_and_an_issue_62_gate():
    """The 'change' gate reads max p, the top-1 flip, log(1 + KL) and |h_k - h_k-1| / |h_k| from the loop before, and
    whether this is loop 1 (then the three are 0); a gate file of issue 62's two layers (state, dist) loads as the one
    layer over their concatenation and scores the same."""
    from discoloop.from_checkpoint import ExitGate
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=7, n_embd=8, n_head=2, n_layer=1, n_loop=3, block_size=8)).eval()
    h0, h1 = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    p0, p1 = torch.softmax(torch.randn(2, 3, 7), -1), torch.softmax(torch.randn(2, 3, 7) * 3, -1)
    first = ExitGate.features("change", model, h0, p0, None)
    assert torch.equal(first[..., 1:], torch.tensor([0.0, 0, 0, 1]).expand(2, 3, 4))
    assert torch.allclose(first[..., 0], p0.amax(-1))
    x = ExitGate.features("change", model, h1, p1, (p0, h0))
    kl = (p0 * (p0.log() - p1.log())).sum(-1)
    assert torch.equal(x[..., 1], (p1.argmax(-1) != p0.argmax(-1)).float()) and x[..., 4].eq(0).all()
    assert torch.allclose(x[..., 2], kl.log1p()) and torch.allclose(x[..., 3], (h1 - h0).norm(dim=-1) / h1.norm(dim=-1))
    old = {"state.weight": torch.randn(1, 8), "state.bias": torch.randn(1), "dist.weight": torch.randn(1, 3)}
    gate = ExitGate(8, "state")
    gate.load_record(old)
    ent = -(p1 * p1.log()).sum(-1) / torch.log(torch.tensor(7.0))
    want = torch.sigmoid(model.normed(h1) @ old["state.weight"][0] + old["state.bias"]
                         + torch.stack([p1.amax(-1), ent, kl.log1p()], -1) @ old["dist.weight"][0])
    assert torch.allclose(gate.score(model)(h1, p1, (p0, h0)), want, atol=1e-6)


def test_a_gate_for_another_model_missing_or_foreign_is_one_line(token_runs, qa_ckpts, tmp_path):
    """A gate beside another model's checkpoint (same shape, other weights), no gate, a user's file named ckpt.exit_gate.pt
    (never replaced), a model with no checkpoint (bench.py sample's random weights): one line each."""
    run0, run1 = token_runs / "run0", tmp_path / "run1"
    shutil.copytree(token_runs / "run1", run1)
    one_line(run(["exits.py", f"--ckpt={run1}", "--exit_rule=gate"]), "not found", "ckpt.exit_gate.pt", "exits.py gate")
    if not (run0 / "ckpt.exit_gate.pt").exists():
        exits("gate", f"--ckpt={run0}", "--gate_tokens=1000", "--gate_iters=10")
    shutil.copy(run0 / "ckpt.exit_gate.pt", run1 / "ckpt.exit_gate.pt")
    for script in (["exits.py"], ["sample.py", "--max_new_tokens=2", "--num_samples=1"]):
        one_line(run([*script, f"--ckpt={run1}", "--exit_rule=gate"]), "is the exit gate of another model", "CRC-32")
    (run1 / "ckpt.exit_gate.pt").write_text("mine")
    one_line(run(["exits.py", f"--ckpt={run1}", "--exit_rule=gate"]), "not a readable exit gate")
    one_line(run(["exits.py", "gate", f"--ckpt={run1}"]), "exit_gate=", "is replaced; left untouched")
    assert (run1 / "ckpt.exit_gate.pt").read_text() == "mine"
    one_line(run(["bench.py", "sample", "config/pretrain_tiny.py", "--vocab_size=64", "--exit_rule=gate", "--new_tokens=2",
                  "--prompt=2"]),
             "no checkpoint")
    qa = tmp_path / "qa"  # a question-answer run calibrates on its val split
    shutil.copytree(qa_ckpts["disco"], qa)
    assert "calibrated on val_id" in exits("gate", f"--ckpt={qa}", "--gate_tokens=300", "--gate_iters=20")
    assert "| gate " in exits(f"--ckpt={qa}", "--exit_rule=gate", "--splits=test_id")


def test_two_checkpoint_files_never_share_a_gate_file(tmp_path):
    """Round 7 dropped the extension: ckpt.bak's gate was ckpt.pt's, a.pt and a.pth shared a.exit_gate.pt (issue 72
    item 2). Every pair of these names, each an existing file, maps to two gate files."""
    from discoloop.from_checkpoint import gate_path
    names = ["ckpt.pt", "ckpt.bak", "ckpt", "a.pt", "a.pth", "a", "a.pt.pt", "a.gate", "a.exit_gate", "a.exit.pt",
             "ckpt.exit_gate.pt", "ckpt_2.pt", "x.gate.pt", "x"]
    for n in names:
        (tmp_path / n).write_bytes(b"")
    gates = {n: gate_path(str(tmp_path / n)) for n in names}
    assert len(set(gates.values())) == len(names), gates
    assert gates["ckpt.pt"] == str(tmp_path / "ckpt.exit_gate.pt")  # round 7's name for a .pt file: its gates open
    assert gates["ckpt.bak"] == str(tmp_path / "ckpt.bak.gate.pt")
