"""bench.py runs end to end at a toy shape and reports every variant (figures are not asserted)."""
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, run
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


PHI_TOY = ["lab/phi.py", "config/pretrain_tiny.py", "--vocab_size=300", "--n_embd=32", "--rows=40",
           "--batch_size=2", "--phi_chunk=7", "--phi_topk=8", "--iters=1", "--warmup=0", "--threads=1"]


def jsonl(path):
    return [json.loads(line) for line in open(path)]


def test_lab_phi_times_every_kernel(tmp_path):
    """lab/phi.py at a toy shape on the CPU: a row for the floor and for every kernel, the core's and the lab's
    candidates (compiled only with compile=True: inductor builds for seconds; fused under Triton's interpreter), under
    bf16 autocast (the dense backward's low-precision matmuls); rows not a multiple of the 14-row chunk; each row a
    JSON line."""
    from lab.phi import CANDIDATES
    out = tmp_path / "phi.jsonl"
    triton = importlib.util.find_spec("triton") is not None
    r = run(PHI_TOY + ["--dtype=bfloat16", f"--json={out}"], env={"TRITON_INTERPRET": "1"} if triton else None)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = jsonl(out)
    meta, rows = lines[0]["run"], {x["row"]: x for x in lines[1:]}
    eager = ["bag"] + [n for n in CANDIDATES if n not in ("bag", "compiled") and (triton or n != "fused")]  # bag first
    assert list(rows) == ["matmul fwd (floor)", "matmul fwd+bwd (3 matmuls)"] + eager
    assert not [x for x in rows.values() if "failed" in x]
    assert meta["shape"] == {"rows": 40, "n_embd": 32, "vocab_size": 300, "k": 8, "tau": 1.0, "chunk_rows": 14}
    assert all(f"\n| {n} | " in r.stdout for n in rows)
    assert rows["bag"]["diff"] == [0.0, 0.0, 0.0] and rows["matmul fwd (floor)"]["vs_floor"] == 1
    assert all(all(d < float("inf") for d in rows[n]["diff"]) for n in eager)


@pytest.mark.parametrize("args,needle", [
    (["--phi_topk=0"], "phi_topk=0 is invalid"), (["--kernels=dense"], "kernels='dense' is invalid"),
    (["--kernels=bag,dense2"], "kernels='bag,dense2'"), (["--rows=-1"], "rows=-1 is invalid"),
    (["--iters=0"], "iters=0"), (["--device=tpu"], "device='tpu'"),
])
def test_lab_phi_bad_values_one_line(args, needle):
    one_line(run(PHI_TOY + args), needle)


def test_lab_phi_needs_a_config():
    one_line(run(["lab/phi.py", "--vocab_size=300"]), "lab/phi.py needs a training config file")


def test_lab_sdpa_reports_the_default_and_each_backend(tmp_path):
    out = tmp_path / "sdpa.jsonl"
    r = run(["lab/sdpa.py", "config/pretrain_tiny.py", "--n_embd=32", "--n_head=2", "--block_size=16",
             "--batch_size=1", "--iters=1", "--warmup=0", "--threads=1", f"--json={out}"])
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {x["row"]: x for x in jsonl(out)[1:]}
    assert set(rows) == {"default", "flash", "cudnn", "efficient", "math"} and rows["default"]["backend"] == "cpu"
    assert rows["math"]["ms"] > 0  # a backend this device has is timed; one it lacks is a 'failed' line
    one_line(run(["lab/sdpa.py", "config/pretrain_tiny.py", "--n_embd=30", "--n_head=4"]), "n_embd=30")


STEP_TOY = ["bench.py", "step", "config/pretrain_tiny.py", "--vocab_size=64", "--n_embd=32", "--n_head=2",
            "--n_layer=1", "--block_size=16", "--batch_size=2", "--phi_topk=8", "--threads=1", "--dtype=float32"]


def test_bench_step_keeps_the_rows_it_finished_when_killed(tmp_path):
    """Issue 54: a step stopped by its time limit keeps every variant it measured. Each variant times 150 steps
    (seconds at this shape); SIGTERM as soon as the first row is in the JSON lines, so during the second variant:
    the first row is whole in the file and in stdout, and the exit says out of time (124), naming what was cut."""
    out = tmp_path / "step.jsonl"
    p = subprocess.Popen([sys.executable, *STEP_TOY, "--variants=loop,disco", "--steps=150",
                          "--warmup=0", f"--json={out}"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    t_end = time.time() + 120
    while not (out.exists() and "loop" in [x.get("row") for x in jsonl(out)]):
        assert p.poll() is None and time.time() < t_end, p.communicate()
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 124 and "out of time: SIGTERM during" in stderr, stderr
    rows = {x["row"]: x for x in jsonl(out)[1:]}
    assert list(rows) == ["loop"] and rows["loop"]["step_ms"] > 0
    assert "| vanilla loop |" in stdout and "| DiscoLoop |" not in stdout


def test_bench_step_plans_once_and_bad_values(tmp_path):
    cache = tmp_path / "plans.json"
    r = run(STEP_TOY + ["--variants=loop,disco", "--steps=0", f"--plan_cache={cache}"])
    assert r.returncode == 0 and "plans (GB): loop" in r.stdout, r.stderr[-2000:]
    plans = json.loads(cache.read_text())
    assert plans.pop("discoloop_mark") == "plan cache" and len(plans) == 2 and all(v > 0 for v in plans.values())
    r = run(STEP_TOY + ["--variants=disco,loop", "--steps=0", f"--plan_cache={cache}"])  # read, not made again
    assert r.returncode == 0 and json.loads(cache.read_text()) == {"discoloop_mark": "plan cache", **plans}
    one_line(run(STEP_TOY + ["--variants=loop,loop"]), "variants='loop,loop' is invalid")
    one_line(run(STEP_TOY + ["--steps=-1"]), "steps=-1 is invalid")


def test_bench_compile_per_block_against_eager_and_whole():
    """lab/compile.py: a row per mode, the per-block row with ONE compiled graph for every layer and loop."""
    r = run(["lab/compile.py", "config/pretrain_tiny.py", "--n_layer=3", "--n_loop=2", "--modes=eager,blocks",
             "--steps=1", "--threads=1"], fresh=True)  # a new interpreter: Inductor's workers, not the zygote's fork
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in r.stdout.splitlines() if line.startswith("| ")}
    assert rows["blocks"][2].strip() == "1" and rows["eager"][2].strip() == "0", r.stdout
    one_line(run(["lab/compile.py", "config/pretrain_tiny.py", "--modes=eager,jit"]), "modes='eager,jit'")


def test_gpu_device_check_dry_runs_on_cpu(tiny_data, tmp_path):
    """.ci/gpu.sh, the one device call, runs every step on the CPU (DRY=1: the real configs and commands at toy sizes,
    compile included, the fused Phi in Triton's interpreter, job_ab against this very tree). Every step is given all
    the time it needs: the test asserts that each ran its real code path (its exit and its rows), never how fast, so a
    slow or busy machine cannot fail a correct tree; the timeout only keeps a hang from stalling the suite."""
    from conftest import TINY_DATA_ARGS
    out = tmp_path / "gpu"
    env = dict(os.environ, OUT=str(out), DRY="1", OMP_NUM_THREADS="1", JOB_AB_OLD=REPO,
               SYMBOLIC_ARGS=f"--data_dir={tiny_data} --data_args={json.dumps(TINY_DATA_ARGS).replace(' ', '')}")
    r = subprocess.run(["bash", ".ci/gpu.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=2400)
    summary = (out / "summary.txt").read_text()
    steps = [line for line in summary.splitlines() if ": exit " in line]
    from discoloop.engine import vllm_missing
    served = not vllm_missing()  # step 12 runs where the serving extra is installed, else says it is skipped
    assert r.returncode == 0 and len(steps) == 11 + served and all(": exit 0 " in s for s in steps), summary
    assert ("12 vLLM: skipped, not installed" in summary) != served, summary
    assert summary.count("acc/test_id>=0.99 and acc/test_ood>=0.95") == 2 and "every step ok: yes" in summary, summary
    assert sorted(os.listdir(out)) == sorted(["summary.txt", "device.txt", "test_cuda.log", "step.log", "step.jsonl",
                                              "phi.log", "phi.jsonl", "symbolic.log"]), os.listdir(out)
    rows = [json.loads(line) for line in open(out / "step.jsonl")]
    timed = [x for x in rows if "step_ms" in x]
    assert not served or {"tokens_per_s", "kv_bytes", "identical"} <= {k for x in rows for k in x}, rows
    assert [x["row"] for x in timed] == ["loop", "disco", "loop", "disco", "ponder", "loop", "disco"], rows
    assert {x["row"] for x in rows if "backend" in x} >= {"default", "math"}
    assert all(x["graphs"] >= 1 and x["recompiles"] == 0 for x in timed[:5]), timed  # every compiled step
    phi = (out / "phi.log").read_text()
    assert "| bag |" in phi and "| fused |" in phi and "torch" in (out / "device.txt").read_text()
    step_log = (out / "step.log").read_text()  # the batch-1 decoding row (issue 67), exact
    assert "| pipelined (propose at loop 1) |" in step_log and "| with the (loop, layer) cache |" in step_log
    sym = (out / "symbolic.log").read_text()
    assert "--cuda_graph=True" in sym and all(f"| {v} |" in sym for v in ("old", "new", "graph")), sym[-3000:]
    for bad, needle in ((dict(OUT=str(out)), "is not empty"), (dict(DRY="true"), "DRY=true"),
                        (dict(DEADLINE="abc"), "DEADLINE=abc"), (dict(OUT=str(out / "phi.log" / "x")), "cannot be made")):
        r = subprocess.run(["bash", ".ci/gpu.sh"], cwd=REPO, env={**env, "OUT": str(tmp_path / "new"), **bad},
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and r.stderr.startswith("error:") and needle in r.stderr, (bad, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "new").exists()


def test_bench_sample_with_exits():
    """exit_rule adds a row: threshold 0 exits every new token after loop 1 (K=2: half the looped blocks saved); a bad
    threshold, or exits on the non-looped model, is one line."""
    args = ["bench.py", "sample", "config/pretrain_tiny.py", "--vocab_size=64", "--n_embd=32", "--n_head=2",
            "--n_layer=1", "--new_tokens=8", "--prompt=4", "--threads=1", "--n_loop=2"]
    r = run(args + ["--exit_rule=prob", "--exit_threshold=0"])
    assert r.returncode == 0, r.stderr[-2000:]
    row = next(line for line in r.stdout.splitlines() if line.startswith("| cache + exits (prob 0, min 1) |"))
    assert "| 1 | 50.0% |" in row, row
    one_line(run(args + ["--exit_rule=prob", "--exit_threshold=2"]), "threshold=2.0")
    one_line(run(args + ["--exit_rule=maybe"]), "exit_rule='maybe'")
    r = run(args + ["--exit_rule=prob", "--recurrence=none"])  # notes first: the config's Phi keys are inert with none
    errors = [x for x in r.stderr.splitlines() if not x.startswith("note:")]
    assert r.returncode == 2 and len(errors) == 1 and "recurrence='none'" in errors[0], r.stderr


def test_bench_sample_refuses_training_keys():
    """--loop_sample and --learning_rate were taken without a word by a subcommand that times decoding."""
    one_line(run(["bench.py", "sample", "config/pretrain_small.py", "--vocab_size=257", "--loop_sample=0.5",
                  "--learning_rate=0.1", "--new_tokens=2"]), "--learning_rate, --loop_sample are training keys")
