"""Nothing silent and no raw traceback, on every script: each category of the reliability pass, through the one
validator of its key (train_config.CHECKS and each script's CHECKS, GPTConfig) or the script's own input checks. A bad value is one
line naming it and what is allowed, exit 2, before any work, and nothing on disk changes."""
import json
import os

import pytest

from discoloop.common import ConfigError
from configurator import configure
from discoloop.curriculum import parse_join_rule
from conftest import run, tiny_train_args
from model import GPTConfig
from test_cli import one_line


from discoloop.train_config import CHECKS, check as train_check, defaults as train_defaults  # noqa: E402


@pytest.mark.parametrize("args,needle", [
    (["--stop_metric=acc/train_id"], "a training or test split must not choose"),
    (["--stop_metric=acc/test_ood"], "stop_metric='acc/test_ood'"),
    (["--stop_metric=garbage"], "stop_metric='garbage'"),
    (["--min_lr=0.01", "--learning_rate=0.001"], "allowed min_lr <= learning_rate"),
    (["--lr_decay_iters=-5"], "lr_decay_iters=-5"),
    (["--batch_size=0"], "batch_size=0 is invalid: allowed an integer >= 1"),
    (["--dtype=bogus"], "dtype='bogus'"),
    (["--split_join={'train_id': 'acc/val_id>=2'}"], "can never hold"),
    (["--split_join={'train_id': 'loss/val_id<=-1'}"], "can never hold"),
    (["--split_join={'train_id': -3}"], "split_join="),
    (["--json=/dev/null/x.json"], "json="),  # an output path that cannot be made is refused before the work
])
def test_training_keys_have_one_validator(args, needle):
    defaults = {**train_defaults(), "json": ""}
    with pytest.raises(ConfigError, match=None) as e:
        train_check(configure(defaults, args, checks=CHECKS))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_model_keys_are_gptconfig_s():
    for kw, needle in [({"recurrence": "disco", "n_loop": 1}, "n_loop=1"), ({"recurrence": "ponder", "n_loop": 1}, "n_loop=1"),
                       ({"n_head": 3, "n_embd": 32}, "n_head=3"), ({"disco_alpha": float("nan")}, "disco_alpha"),
                       ({"phi_topk": 10**6}, "phi_topk")]:
        with pytest.raises(ValueError, match=needle):
            GPTConfig(**kw)
    GPTConfig(recurrence="loop", n_loop=1)  # one pass of a plain loop is fine


def test_join_rules_that_hold_parse():
    assert parse_join_rule("acc/val_id>=0.9") == ("acc/val_id", ">=", 0.9)
    assert parse_join_rule("loss/val_id<=0.5") == ("loss/val_id", "<=", 0.5)


def test_train_refuses_before_work(tiny_data, tmp_path):
    out = tmp_path / "run"
    one_line(run(tiny_train_args(tiny_data, str(out), "--recurrence=disco", "--n_loop=1")), "n_loop=1")
    one_line(run(tiny_train_args(tiny_data, str(out), "--batch_size=100000")), "batch_size=100000",
             "training examples")
    one_line(run(tiny_train_args(tiny_data, str(out), "--max_iters=1", "--wandb_log=True"),
                 env={"WANDB_MODE": "", "WANDB_API_KEY": "", "HOME": str(tmp_path)}), "wandb")
    assert not os.path.exists(out / "ckpt.pt")


def test_train_reads_past_damaged_metrics_rows(tiny_data, tmp_path):
    out = str(tmp_path / "run")
    assert run(tiny_train_args(tiny_data, out, "--max_iters=5", "--eval_interval=5")).returncode == 0
    with open(os.path.join(out, "metrics.jsonl"), "ab") as f:
        f.write(os.urandom(200) + b"\n[1, 2]\n{\"iter\": \"x\"}\n")
    os.makedirs(os.path.join(out, "x.tmp-1"))  # a user's folder named like a temp file: not ours to delete
    r = run(tiny_train_args(tiny_data, out, "--max_iters=10", "--eval_interval=5", "--init_from=resume"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "is a torn line or not a metrics row" in r.stderr
    with open(os.path.join(out, "metrics.jsonl")) as f:
        assert [json.loads(line)["iter"] for line in f] == [0, 5, 10]
    assert os.path.isdir(os.path.join(out, "x.tmp-1"))


@pytest.fixture(scope="module")
def probe_ckpt(tiny_data, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("probe") / "run")
    assert run(tiny_train_args(tiny_data, out, "--max_iters=5", "--eval_interval=5")).returncode == 0
    return out


def test_probe_one_line(probe_ckpt, tmp_path):
    one_line(run(["probe.py", "acc", f"--ckpt={probe_ckpt}", "--n_loop=0"]), "allowed loop counts >= 1")
    one_line(run(["probe.py", "acc", f"--ckpt={probe_ckpt}", "--dtype=bogus"]), "dtype='bogus'")
    one_line(run(["probe.py", "plot", probe_ckpt, "--stop_metric=acc/test_ood"]), "stop_metric='acc/test_ood'")
    png = tmp_path / "new" / "folder" / "sweep.png"  # made before the sweep, not after it
    r = run(["probe.py", "sweep", f"--ckpt={probe_ckpt}", f"--png={png}", "--alphas=0,1", f"--json={tmp_path / 's.json'}"])
    assert r.returncode == 0 and png.exists(), r.stderr[-2000:]


@pytest.mark.parametrize("args,needle", [
    (["--iters=0"], "iters=0"), (["--n_head=3"], "n_head=3"), (["--batch_size=0"], "batch_size=0"),
    (["--phi_topk=99999"], "phi_topk=99999"), (["plan"], "needs a training config file"),
])
def test_bench_one_line(args, needle):
    one_line(run(["bench.py"] + args), needle)


def test_pretrain_prepare_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": broken\n')
    base = ["data/pretrain/prepare.py", "--encoding=bytes", "--num_proc=1", "--max_tokens=3000", "--val_tokens=500"]
    one_line(run(base + [f"--out_dir={tmp_path / 'a'}", f"--data_files={bad}", "--weights=1"]), "could not be read")
    one_line(run(base + [f"--out_dir={tmp_path / 'b'}", "--data_files=synthetic:web,synthetic:math", "--weights=a,b"]),
             "weights='a,b'")
    one_line(run(base + ["--num_proc=0"]), "num_proc=0")
    one_line(run(base + ["--shard_tokens=0"]), "shard_tokens=0")  # it used to write empty files forever
    one_line(run(base + [f"--out_dir={tmp_path / 'c'}", "--data_files=hf:nobody/nothing:x", "--weights=1"],
                 env={"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}), "could not be read", "--data_files")


def test_pretrain_prepare_damaged_state_one_line(tmp_path):
    out = tmp_path / "tok"
    base = ["data/pretrain/prepare.py", "--encoding=bytes", "--num_proc=1", "--val_tokens=500", "--shard_tokens=1000",
            "--data_files=synthetic:web", "--weights=1", f"--out_dir={out}"]
    assert run(base + ["--max_tokens=3000"]).returncode == 0
    with open(out / "state.json") as f:
        state = json.load(f)
    os.remove(out / "meta.json")  # as if interrupted after the shards: state.json is what resumes
    if state.get("pending"):
        os.remove(out / state["pending"])
        one_line(run(base + ["--max_tokens=6000"]), "lost its pending file")
    (out / "state.json").write_text("")
    shards = sorted(os.listdir(out))
    one_line(run(base + ["--max_tokens=6000"]), "state.json", "damaged")
    assert sorted(os.listdir(out)) == shards


def test_local_task_one_line(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("too short")
    afile = tmp_path / "afile"
    afile.write_text("")
    one_line(run(["data/pretrain/local_task.py", "--n=-1"]), "n=-1")
    one_line(run(["data/pretrain/local_task.py", f"--text_file={text}", f"--out_dir={afile}"]), "is a file")
    one_line(run(["data/pretrain/local_task.py", f"--text_file={text}", f"--out_dir={tmp_path / 'o'}"]), "gives no example")
    assert not (tmp_path / "o").exists()
    text.write_text(" ".join(["word"] * 400))
    theirs = tmp_path / "theirs"  # someone's task folder: refused, untouched; its own folder is made again
    theirs.mkdir()
    (theirs / "local_lambada.yaml").write_text("mine")
    one_line(run(["data/pretrain/local_task.py", f"--text_file={text}", f"--out_dir={theirs}"]), "not data/pretrain/local_task.py's")
    assert os.listdir(theirs) == ["local_lambada.yaml"] and (theirs / "local_lambada.yaml").read_text() == "mine"
    for _ in range(2):
        assert run(["data/pretrain/local_task.py", f"--text_file={text}", f"--out_dir={tmp_path / 'mine'}"]).returncode == 0


def test_sample_refuses_before_work(tmp_path):
    """No sample asked for (it printed nothing and exited 0), negative or non-finite sizes, and a prompt file that is
    not UTF-8 (a codec error that did not name the file): one line, checked before the checkpoint is read (here it
    does not even exist)."""
    bad = tmp_path / "prompt.txt"
    bad.write_bytes(b"\xff\xfeROMEO")
    ckpt = f"--ckpt={tmp_path / 'none.pt'}"
    for args, needle in [(["--num_samples=0"], "num_samples=0 is invalid: allowed an integer >= 1"),
                         (["--num_samples=-2"], "num_samples=-2"), (["--top_k=-1"], "top_k=-1"),
                         (["--n_loop=-1"], "n_loop=-1"), (["--temperature=-0.5"], "temperature=-0.5"),
                         (["--max_new_tokens=0"], "max_new_tokens=0"),
                         ([f"--start=FILE:{bad}"], f"start='FILE:{bad}': the file is not UTF-8 text (byte b'\\xff'"),
                         ([f"--start=FILE:{tmp_path}"], "cannot be read (Is a directory)")]:
        one_line(run(["sample.py", ckpt, *args]), needle)


def test_sample_names_the_prompt_it_cannot_encode(probe_ckpt):
    one_line(run(["sample.py", f"--ckpt={probe_ckpt}", "--num_samples=1", "--max_new_tokens=1"]),
             "start='\\n' gives no token")


@pytest.fixture(scope="module")
def token_ckpt(tmp_path_factory):
    from test_export import toy_checkpoint
    path = str(tmp_path_factory.mktemp("tok") / "ckpt.pt")
    toy_checkpoint(path, recurrence="none")  # K = 3 untied copies, byte tokenizer
    return path


def test_eval_harness_refuses_before_work(probe_ckpt, token_ckpt, tmp_path):
    """Each one line before the checkpoint is evaluated: a question-answer checkpoint through the harness CLI (its
    setup lines used to come first), a bad --model_args value, --include_path naming a file (it said 'unknown task'),
    a negative n_loop, a loop count past the untied copies."""
    afile = tmp_path / "tasks.yaml"
    afile.write_text("task: x\n")
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    for args, needle in [
            (["lm_eval", "--model", "discoloop", "--model_args", f"ckpt={probe_ckpt}", "--tasks", "piqa"], "token shards"),
            (["lm_eval", "--model", "discoloop", "--model_args", f"ckpt={token_ckpt},n_loop=x", "--tasks", "piqa"],
             "--model_args n_loop='x' is invalid"),
            (["lm_eval", "--model=discoloop", "--tasks", "piqa"], "needs --model_args ckpt=PATH"),
            ([f"--ckpt={token_ckpt}", f"--include_path={afile}"], f"include_path='{afile}' is invalid"),
            ([f"--ckpt={token_ckpt}", "--n_loop=-1"], "n_loop=-1"), ([f"--ckpt={token_ckpt}", "--tasks="], "tasks=''"),
            ([f"--ckpt={token_ckpt}", "--n_loop=4", "--tasks=piqa"], "n_loop=4 is invalid: allowed 0 (the trained K=3) or 1..3")]:
        one_line(run(["eval_harness.py", *args], env=env), needle)


def test_nl_prepare_refuses_before_fetching_ranks(tmp_path):
    """format, names and n_relations are checked before GPT-2's ranks are fetched (they were refused after it)."""
    env = {"TIKTOKEN_CACHE_DIR": str(tmp_path / "empty_cache"), "HTTPS_PROXY": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9", "DISCOLOOP_TOKENIZERS": str(tmp_path / "no_ranks"),
           "PIP_INDEX_URL": "http://127.0.0.1:9/simple"}  # a fetch would fail, naming --tiktoken_file
    for arg, needle in [("--format=bogus", "format='bogus'"), ("--names=x", "names='x'"),
                        ("--n_relations=51", "n_relations=51 is invalid: allowed 1..50")]:
        r = run(["data/nl/prepare.py", f"--out_dir={tmp_path / 'nl'}", arg], env=env)
        one_line(r, needle)
        assert "fetching" not in r.stdout


def test_symbolic_help_gives_each_key_its_own_meaning():
    r = run(["data/symbolic/prepare.py", "--help"])
    assert "--seed=0" in r.stdout and "seed of both graphs" in r.stdout.split("--seed=0", 1)[1].splitlines()[0]
