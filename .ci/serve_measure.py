"""Issue 73's measurement: each trained run's export in vLLM against model.py, in one process, every row printed and
appended to --json the moment it is measured (a run cut short keeps what it finished).

    python .ci/serve_measure.py RUN [RUN ...] [--prompts=20] [--new=64] [--concurrent=32] [--threads=2] [--json=FILE]

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


def measure(run, opts, log):
    from vllm import SamplingParams
    from discoloop import engine, speculative
    from discoloop.checkpoint import load_checkpoint
    from discoloop.from_checkpoint import model_from_checkpoint
    from discoloop.vllm_model import slots
    from export_hf import export
    name = os.path.basename(run.rstrip("/"))
    ckpt = load_checkpoint(run)
    model = model_from_checkpoint(ckpt).eval()
    cfg, V, T = model.config, model.config.vocab_size, model.config.block_size
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "export")
        export(run, folder)
        llm, took = timed(lambda: engine.start(folder, skip_tokenizer_init=True, max_logprobs=min(V, 300),
                                               max_num_seqs=max(opts["concurrent"], 1)))
        log.add(f"{name} start", [name, "engine start s", f"{took:.1f}", "vLLM in this process, float32, eager"],
                {"engine_start_s": took})
        ps = prompts_of(run, ckpt, opts["prompts"], 16)
        new = min(opts["new"], T - max(map(len, ps)))
        sp = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True, logprobs=min(V, 300),
                            prompt_logprobs=min(V, 300), detokenize=False)
        got = engine.agreement(model, ps, llm.generate([{"prompt_token_ids": p} for p in ps], sp, use_tqdm=False))
        log.add(f"{name} exact", [name, "greedy identical (float32)", f"{got['identical']}/{len(ps)}",
                                  f"{new} new tokens each, ties {got['ties']}, max |d log p| {got['max_dlogp']:.2e}"],
                got | {"prompts": len(ps), "new": new})
        K = slots(cfg, cfg.n_loop)
        arith = len(K) * 2 * (cfg.n_kv_head or cfg.n_head) * (cfg.n_embd // cfg.n_head) * 4
        kv = kv_bytes_per_token(llm)
        log.add(f"{name} kv", [name, "KV bytes/token", f"{kv:,.0f}", f"arithmetic {arith:,} = {len(K)} (loop, layer) "
                               "slots x 2 x kv heads x head size x 4 B"], {"kv_bytes": kv, "arithmetic": arith})
        if T < 16 + 16:
            engine.stop(llm)
            return  # a question-answer window: too short to time decoding
        n, C = min(opts["new"], T - 16), opts["concurrent"]
        g = torch.Generator().manual_seed(1)
        batch = [torch.randint(0, min(V, 256), (16,), generator=g).tolist() for _ in range(C)]
        one = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, detokenize=False)

        def rate(what, seconds, tokens, detail):
            log.add(f"{name} {what}", [name, f"tokens/s: {what}", f"{tokens / seconds:.1f}", detail],
                    {"tokens_per_s": tokens / seconds, "seconds": seconds, "tokens": tokens})
        ones = 4  # one prompt at a time: four prompts, the rate is per token
        _, s = timed(lambda: [llm.generate([{"prompt_token_ids": p}], one, use_tqdm=False) for p in batch[:ones]])
        rate("vLLM, batch 1", s, ones * n, f"{ones} prompts one after another")
        _, s = timed(lambda: llm.generate([{"prompt_token_ids": p} for p in batch], one, use_tqdm=False))
        rate(f"vLLM, {C} concurrent", s, C * n, "one generate call, the engine's continuous batching")
        engine.stop(llm)
        with torch.no_grad():
            _, s = timed(lambda: [model.generate(torch.tensor([p]), n, temperature=0) for p in batch[:ones]])
            rate("generate, batch 1", s, ones * n, f"model.py cached, {ones} prompts one after another")
            _, s = timed(lambda: model.generate(torch.tensor(batch), n, temperature=0))
            rate(f"generate, {C} as one batch", s, C * n, "model.py cached, equal prompt lengths")
            if cfg.recurrence != "none":
                spec = speculative.spec_option(0, 4, model, propose=1)
                _, s = timed(lambda: [speculative.generate(model, torch.tensor([p]), n, spec, temperature=0)
                                      for p in batch[:ones]])
                rate("pipelined, batch 1", s, ones * n, f"speculative_propose=1, {ones} prompts")


def main():
    runs, opts = runs_and_options(__doc__, __file__, {"prompts": 20, "new": 64, "concurrent": 32, "threads": 2,
                                                      "json": ""})
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
