"""Issue 73's measurement: each trained run's export in vLLM against model.py, in one process, every row printed and
appended to --json the moment it is measured (a run cut short keeps what it finished).

    python .ci/serve_measure.py RUN [RUN ...] [--prompts=20] [--new=64] [--concurrent=32] [--threads=2] [--json=FILE]
        [--graphs=off|on|both] [--device=cpu|cuda] [--config_args="--n_layer=2 ..."] [--memory=0.1]

RUN is a run folder or checkpoint, or a training config file (config/pretrain.py): that model with random weights
(speed and memory are the weights' size, not their values; prompts are random tokens), --config_args its overrides.
--graphs: vLLM with CUDA graphs off (eager), on, or both (a GPU's; the CPU runs 'off'). --memory: the share of the
device's memory (a CPU's: host memory) vLLM may take for the weights and its key/value pages (135M: 0.2).

Per run: the export (export_hf.py, into a temporary folder); the engine's start (its own row); exactness: --prompts
prompts x --new greedy tokens from vLLM against GPT.generate (what sample.py --temperature=0 runs), with every
log-probability's largest difference (float32; prompts from the run's own validation data); tokens/s of --new tokens
per prompt: vLLM one prompt at a time and --concurrent at once, model.py's cached generate one prompt at a time and the
--concurrent as one batch, and the pipelined decoder (one prompt at a time); the key/value bytes per token the
engine allocates against the (loop, layer) arithmetic (vllm_model.slots). Needs the serving extra.
"""
import os
import sys
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process (its memory is read)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from run_args import refuse, runs_and_options  # noqa: E402

HEADER = ["run", "what", "value", "detail"]


def prompts_of(run, ckpt, n, length, seed=0):
    """n prompts of the run's own validation data: token windows of `length` at spread offsets, or the questions of a
    question-answer split (each up to its answer's position)."""
    from discoloop.from_checkpoint import load
    model, data = load(run, tokens_ok=True)
    if hasattr(data, "windows"):  # token shards
        size = int(data.sizes[0])
        starts = torch.linspace(0, size - length - 2, n).long().tolist()
        return [data.windows([0], [s], length)[0][0].tolist() for s in starts]
    split = next((s for s in ("test_id", "val_id") if s in data.splits), next(iter(data.splits)))
    X, Y = data.splits[split]  # questions: tokens up to the first target
    g = torch.Generator().manual_seed(seed)
    rows = torch.randperm(len(X), generator=g)[:n].tolist()
    return [X[i][:int((Y[i] != -1).nonzero()[0]) + 1].tolist() for i in rows]


def kv_bytes_per_token(llm):
    """What the engine allocated for its key/value pages, per token of context (in-process engine)."""
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    cfg = runner.kv_cache_config
    size = sum(t.size for t in cfg.kv_cache_tensors)
    block = cfg.kv_cache_groups[0].kv_cache_spec.block_size
    return size / (cfg.num_blocks * block)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def opened(run, opts, folder):
    """(name, model, prompts, the export written into folder) of a run, or of a config file's random model."""
    from discoloop.checkpoint import load_checkpoint
    from discoloop.from_checkpoint import model_from_checkpoint
    from export_hf import export, write_model
    if not run.endswith(".py"):
        ckpt = load_checkpoint(run)
        export(run, folder)
        return os.path.basename(run.rstrip("/")), model_from_checkpoint(ckpt).eval(), prompts_of(run, ckpt, opts["prompts"], 16)
    from safetensors.torch import save_file
    from configurator import configure
    from discoloop import train_config
    from model import GPT, GPTConfig
    c = configure(train_config.defaults(), [run, *opts["config_args"].split()], __doc__, [train_config.__file__],
                  train_config.CHECKS)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_dict(c)).eval()
    os.makedirs(folder)
    write_model(model, folder, {}, save_file)
    g = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    return os.path.basename(run) + " (random)", model, [torch.randint(0, V, (16,), generator=g).tolist()
                                                        for _ in range(opts["prompts"])]


def measure(run, opts, log):
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "export")
        name, model, ps = opened(run, opts, folder)
        model = model.to(opts["device"])
        T, C = model.config.block_size, opts["concurrent"]
        n = min(opts["new"], T - 16)  # a question-answer window (block_size 8) is too short to time decoding
        g = torch.Generator().manual_seed(1)
        batch = [torch.randint(0, min(model.config.vocab_size, 256), (16,), generator=g).tolist() for _ in range(C)]
        for eager in {"off": [True], "on": [False], "both": [True, False]}[opts["graphs"]]:
            engine_rows(name + ("" if eager else ", CUDA graphs"), model, folder, ps, opts, log, eager, batch, n)
        if n >= 16:
            model_rows(name, model, batch, n, log)


def engine_rows(name, model, folder, ps, opts, log, eager, batch, n):
    """One engine (eager, or capturing CUDA graphs) on the export: start, exactness, KV bytes, tokens/s."""
    from vllm import SamplingParams
    from discoloop import engine
    from discoloop.vllm_model import slots
    cfg, V = model.config, model.config.vocab_size
    llm, took = timed(lambda: engine.start(folder, skip_tokenizer_init=True, max_logprobs=min(V, 300),
                                           max_num_seqs=max(opts["concurrent"], 1), enforce_eager=eager,
                                           kv_memory=float(opts["memory"])))
    log.add(f"{name} start", [name, "engine start s", f"{took:.1f}", f"vLLM in this process, float32, "
                              f"{'eager' if eager else 'CUDA graphs'}"], {"engine_start_s": took})
    new = min(opts["new"], cfg.block_size - max(map(len, ps)))
    sp = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True, logprobs=min(V, 300),
                        prompt_logprobs=min(V, 300), detokenize=False)
    got = engine.agreement(model, ps, llm.generate([{"prompt_token_ids": p} for p in ps], sp, use_tqdm=False))
    log.add(f"{name} exact", [name, "greedy identical (float32)", f"{got['identical']}/{len(ps)}",
                              f"{new} new tokens each, ties {got['ties']}, max |d log p| {got['max_dlogp']:.2e}"],
            got | {"prompts": len(ps), "new": new})
    arith = len(slots(cfg, cfg.n_loop)) * 2 * (cfg.n_kv_head or cfg.n_head) * (cfg.n_embd // cfg.n_head) * 4
    kv = kv_bytes_per_token(llm)
    log.add(f"{name} kv", [name, "KV bytes/token", f"{kv:,.0f}", f"arithmetic {arith:,} = "
                           f"{len(slots(cfg, cfg.n_loop))} (loop, layer) slots x 2 x kv heads x head size x 4 B"],
            {"kv_bytes": kv, "arithmetic": arith})
    if n >= 16:
        one = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, detokenize=False)
        _, s = timed(lambda: [llm.generate([{"prompt_token_ids": p}], one, use_tqdm=False) for p in batch[:ONES]])
        rate(log, name, "vLLM, batch 1", s, ONES * n, f"{ONES} prompts one after another")
        _, s = timed(lambda: llm.generate([{"prompt_token_ids": p} for p in batch], one, use_tqdm=False))
        rate(log, name, f"vLLM, {len(batch)} concurrent", s, len(batch) * n, "one generate call: continuous batching")
    engine.stop(llm)


ONES = 4  # one prompt at a time: four prompts, the rate is per token


def rate(log, name, what, seconds, tokens, detail):
    log.add(f"{name} {what}", [name, f"tokens/s: {what}", f"{tokens / seconds:.1f}", detail],
            {"tokens_per_s": tokens / seconds, "seconds": seconds, "tokens": tokens})


@torch.no_grad()
def model_rows(name, model, batch, n, log):
    """model.py's cached generate, one prompt at a time and all as one batch, and the pipelined decoder."""
    from discoloop import speculative
    dev = next(model.parameters()).device
    _, s = timed(lambda: [model.generate(torch.tensor([p], device=dev), n, temperature=0) for p in batch[:ONES]])
    rate(log, name, "generate, batch 1", s, ONES * n, f"model.py cached, {ONES} prompts one after another")
    _, s = timed(lambda: model.generate(torch.tensor(batch, device=dev), n, temperature=0))
    rate(log, name, f"generate, {len(batch)} as one batch", s, len(batch) * n, "model.py cached, equal prompt lengths")
    if model.config.recurrence != "none":
        spec = speculative.spec_option(0, 4, model, propose=1)
        _, s = timed(lambda: [speculative.generate(model, torch.tensor([p], device=dev), n, spec, temperature=0)
                              for p in batch[:ONES]])
        rate(log, name, "pipelined, batch 1", s, ONES * n, f"speculative_propose=1, {ONES} prompts")


def main():
    runs, opts = runs_and_options(__doc__, __file__, {"prompts": 20, "new": 64, "concurrent": 32, "threads": 2,
                                                      "json": "", "graphs": "off", "device": "cpu", "config_args": "",
                                                      "memory": "0.1"})
    if opts["graphs"] not in ("off", "on", "both") or opts["device"] not in ("cpu", "cuda"):
        refuse(__file__, f"--graphs={opts['graphs']!r} / --device={opts['device']!r} is invalid: allowed off, on, both "
                         "/ cpu, cuda")
    if not opts["memory"].replace(".", "", 1).isdecimal() or not 0 < float(opts["memory"]) <= 1:
        refuse(__file__, f"--memory={opts['memory']!r} is invalid: allowed a share in (0, 1]")
    if opts["graphs"] != "off" and opts["device"] != "cuda":
        refuse(__file__, f"--graphs={opts['graphs']!r} needs --device=cuda (CUDA graphs): allowed 'off' on the CPU")
    from discoloop.bench_log import RowLog
    from discoloop.common import ERRORS, check_writable
    from discoloop import engine
    missing = engine.vllm_missing()
    if missing:
        refuse(__file__, missing)
    torch.set_num_threads(opts["threads"])
    try:
        out = RowLog.check(opts["json"])
        if out:
            check_writable(out, "pass --json=FILE somewhere writable")
    except ERRORS as e:
        refuse(__file__, e)
    log = RowLog(HEADER, out, {"script": "serve_measure.py", **opts, "torch": torch.__version__})
    for run in runs:
        try:
            measure(run, opts, log)
        except ERRORS as e:
            log.fail(run, str(e))


if __name__ == "__main__":
    main()
