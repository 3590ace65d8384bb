"""bench.py runs end to end at a toy shape and reports every variant (figures are not asserted)."""
import json

import pytest

from conftest import run
from test_cli import one_line


def test_bench_reports_every_variant(tmp_path):
    out = tmp_path / "bench.json"
    r = run(["bench.py", "--n_layer=1", "--n_embd=32", "--n_head=2", "--block_size=16", "--vocab_size=64",
             "--batch_size=1", "--n_loop=2", "--phi_topk=8", "--iters=2", "--warmup=1", "--threads=1",
             f"--json={out}"])
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert set(res["steps"]) == {"none", "loop", "disco top-8", "disco exact", "ponder top-8"}
    assert all(v["step_s"] > 0 and v["saved_MB"] > 0 for v in res["steps"].values())
    assert "| loop | " in r.stdout and "1.000x | 1.000x" in r.stdout   # loop is the reference row
    # Phi memory: exact keeps (T, V) probabilities, top-k only (T, k)
    assert all(p["exact_MB"] > p["topk_MB"] for p in res["phi"].values())


def test_bench_bad_flag_one_line():
    r = run(["bench.py", "--n_loop=abc"])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    r = run(["bench.py", "--variants=loop,disko"])
    assert r.returncode == 2 and "variants='loop,disko'" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_bench_sample_reports_the_cache_speedup():
    r = run(["bench.py", "sample", "config/pretrain_tiny.py", "--vocab_size=64", "--n_embd=32", "--n_head=2",
             "--n_layer=1", "--new_tokens=8", "--prompt=4", "--threads=1"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "| with the (loop, layer) cache |" in r.stdout and "| without (whole prefix every token) |" in r.stdout
    assert "block_size raised" not in r.stdout
    r = run(["bench.py", "sample", "config/pretrain_tiny.py", "--vocab_size=64", "--n_embd=32", "--n_head=2",
             "--n_layer=1", "--new_tokens=8", "--prompt=4", "--threads=1", "--block_size=10"])
    assert r.returncode == 0 and "block_size raised from the config's 10 to 12" in r.stdout, r.stderr[-2000:]
    r = run(["bench.py", "sample"])
    assert r.returncode == 2 and "needs a training config file" in r.stderr


def test_bench_step_measures_every_variant():
    """bench.py step (the GPU measurement of issue 33) runs at a toy shape on the CPU: a row per recurrence."""
    r = run(["bench.py", "step", "config/pretrain_tiny.py", "--vocab_size=64", "--n_embd=32", "--n_head=2", "--n_layer=1",
             "--block_size=16", "--batch_size=2", "--phi_topk=8", "--variants=loop,disco,ponder", "--steps=1",
             "--threads=1", "--dtype=float32", "--compile=False"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert all(f"| {name} |" in r.stdout for name in ("vanilla loop", "DiscoLoop", "PonderLM"))


def test_bench_block_size_under_four():
    """The Phi table's lengths T/4 and T/2 are at least 1: block_size=3 used to end in a reshape traceback."""
    r = run(["bench.py", "--n_layer=1", "--n_embd=32", "--n_head=2", "--block_size=3", "--vocab_size=64",
             "--batch_size=1", "--n_loop=2", "--phi_topk=8", "--iters=1", "--warmup=0", "--threads=1",
             "--variants=loop,disco"])
    assert r.returncode == 0, r.stderr[-2000:]
    phi = r.stdout.split("Phi only", 1)[1]
    assert "\n| 1 | " in phi and "\n| 3 | " in phi
    from bench import phi_lengths
    assert phi_lengths(1) == [1] and phi_lengths(3) == [1, 3] and phi_lengths(512) == [128, 256, 512]


@pytest.mark.parametrize("args,needle", [
    (["--prompt=0"], "prompt=0 is invalid: allowed an integer >= 1"), (["--prompt=-1"], "prompt=-1"),
    (["--new_tokens=-5"], "new_tokens=-5 is invalid"), (["--new_tokens=0"], "new_tokens=0"),
    (["--prompt=abc"], "prompt='abc'"),
])
def test_bench_sample_sizes_one_line(args, needle):
    """No traceback for an empty prompt, no negative throughput for a negative token count."""
    one_line(run(["bench.py", "sample", "config/pretrain_tiny.py", "--vocab_size=64", "--n_embd=32", "--n_head=2",
                  "--n_layer=1", "--threads=1"] + args), needle)


def test_bench_step_names_the_bad_variant():
    one_line(run(["bench.py", "step", "config/pretrain_tiny.py", "--vocab_size=64", "--variants=loop,bogus"]),
             "variants='loop,bogus' is invalid")
