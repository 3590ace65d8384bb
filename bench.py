"""
Benchmarks (nanoGPT has one): forward+backward step time, MFU and memory for every recurrence,
exact vs top-k Phi, eager vs compiled. Figures are printed as ratios measured in one run; nothing
here is asserted by tests.

    python bench.py                          # CPU-sized pretraining-like shape
    python bench.py --n_embd=1024 --n_layer=24 --n_head=16 --block_size=8192 --vocab_size=129280 --batch_size=1   # GPU
    python bench.py --compile=True           # also time torch.compile
    python bench.py --variants=loop,disco    # only these (all are built at once: at 440M on CPU, RAM decides)
    python bench.py plan config/pretrain.py --world_size=8   # per-rank memory plan + throughput at a stated MFU
    python bench.py step config/pretrain.py --compile=True --json=step.jsonl   # the 440M step, a row as it comes
    python lab/phi.py config/pretrain.py      # top-k Phi kernels (the core's and the lab's candidates) on a device

Memory: bytes that autograd keeps for backward (counted with saved_tensors_hooks, the same on
every device), and on CUDA the allocator's peak during a step above the resident weights. The Phi
table isolates Phi: exact keeps (B, T, V) probabilities, top-k keeps (B, T, k).
"""
import copy
import json
import os
import signal
import statistics
import sys
import time

import torch

from discoloop import train_config
from kernels import topk_phi
from discoloop.memory import AUTO_ORDER, GB, GPUS, auto_note, device_bytes, format_plan, pick_checkpointing, plan
from discoloop.common import DTYPES, ERRORS, SYSTEM_CHECKS, ConfigError, autocast, die, setup, table
from discoloop.bench_log import RowLog, cached_plan
from configurator import INT_GE0, INT_GE1, OUTPUT, check_inert, configure
from model import GPT, RECURRENCES, GPTConfig
from discoloop.precision import resolve_dtype

# the benchmarked shape: a CPU-sized, pretraining-like model (Ouro's sandwich norm, top-128 Phi); every other
# model key (and any of these, on the command line) is GPTConfig's
SHAPE = dict(n_layer=4, n_head=4, n_embd=256, block_size=512, vocab_size=32768, n_loop=4, phi_topk=128,
             sandwich_norm=True)
DEFAULTS = dict(
    **{**GPTConfig.defaults(), **SHAPE},
    batch_size=2,        # sequences per step B
    device="auto",       # 'auto' | 'cpu' | 'cuda' (common.py's rule)
    dtype="auto",        # 'auto' | 'float32' | 'bfloat16' (auto: fp32 on a CPU where bf16 is slower)
    compile=False,       # also time torch.compile'd models
    iters=5,             # timed steps per variant
    warmup=2,            # untimed steps per variant first
    threads=0,           # CPU threads (0 = torch default)
    json="",             # also write the results to this JSON file
    variants="none,loop,disco,disco_exact,ponder",  # comma list of variants to time (loop is the reference)
)
CHECKS = {**SYSTEM_CHECKS, "batch_size": INT_GE1, "iters": INT_GE1, "warmup": INT_GE0, "json": OUTPUT}
# name -> (recurrence, top-k Phi?): every recurrence, those that decode Phi with top-k and also exact ('_exact')
VARIANTS = {r: (r, spec.phi) for r, spec in RECURRENCES.items()} | \
    {f"{r}_exact": (r, False) for r, spec in RECURRENCES.items() if spec.phi}


def matmul_peak(device, dtype, n=2048, reps=10):
    """Achieved FLOP/s of a large square matmul: the 'peak' MFU is measured against."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n ** 3 * reps / (time.perf_counter() - t)


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def saved_bytes(fn, params=()):
    """Run fn() and count the bytes of tensors autograd saves for backward (parameters excluded)."""
    total, skip = [0], {p.data_ptr() for p in params}

    def pack(t):
        if t.data_ptr() not in skip:
            total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, total[0]


def config_file(argv):
    return next((a for a in argv if a.endswith(".py") and not a.startswith("--")), None)


def round_robin(fns, iters, warmup, device):
    """{name: median seconds}, one call of each in turn, so that load and clocks hit every one alike."""
    times = {name: [] for name in fns}
    for i in range(warmup + iters):
        for name, fn in fns.items():
            t = timed(fn, 1, device)
            if i >= warmup:
                times[name].append(t)
    return {name: statistics.median(t) for name, t in times.items()}


def main_config(argv):
    """bench.py's keys, checked (the model keys by GPTConfig, for every variant) before any work: (config, variant
    names, device); a bad value is one line and exit 2."""
    try:
        c = configure(DEFAULTS, argv, __doc__, [__file__, sys.modules[GPTConfig.__module__].__file__], CHECKS)
        names = c["variants"].split(",")
        bad = [v for v in names if v not in VARIANTS]
        if bad or "loop" not in names:  # the vanilla loop is the reference row
            raise ConfigError(f"variants={c['variants']!r} is invalid: a comma list of {list(VARIANTS)} including loop")
        for rec, k in {variant_model(c, v) for v in names}:
            GPTConfig.from_dict({**c, "recurrence": rec, "phi_topk": k})  # the model keys' one validator, before any work
        return c, names, setup(c["device"], c["threads"])
    except (ConfigError, ValueError) as e:
        die(e)


def variant_model(c, name):
    """(recurrence, phi_topk) of a variant: top-k Phi where the variant decodes Phi with it, else exact (0)."""
    rec, topk = VARIANTS[name]
    return rec, c["phi_topk"] if topk else 0


def build_variants(c, names, device):
    """({label: model to time}, {label: the same model}); a compiled variant is a copy with its blocks compiled."""
    models, raw = {}, {}
    for rec, k in [variant_model(c, v) for v in names]:
        model = GPT(GPTConfig.from_dict({**c, "recurrence": rec, "phi_topk": k})).to(device)
        name = f"{rec}" + (f" top-{k}" if k else (" exact" if RECURRENCES[rec].phi else ""))
        for compiled in ([False, True] if c["compile"] else [False]):
            label = name + (" compiled" if compiled else "")
            m = copy.deepcopy(model).compile_blocks() if compiled else model  # a copy: compiled in place
            models[label] = raw[label] = m
    return models, raw


def time_variants(models, x, y, ctx, c, device):
    """({label: median step seconds}, {label: CUDA allocator peak above the weights}); on a GPU each model is timed
    alone, so that its peak is its own, and one that runs out of memory is left out (removed from models)."""
    if not device.startswith("cuda"):
        return round_robin({label: training_step(m, x, y, ctx) for label, m in models.items()}, c["iters"], c["warmup"],
                           device), {}
    times, peaks = {}, {}
    for label, m in list(models.items()):
        torch.cuda.reset_peak_memory_stats()
        resident = torch.cuda.memory_allocated()  # every variant's weights: not this step's cost
        try:
            times.update(round_robin({label: training_step(m, x, y, ctx)}, c["iters"], c["warmup"], device))
        except torch.OutOfMemoryError:  # e.g. exact Phi at T = 8192, V = 129,280
            print(f"{label}: out of memory, left out")
            del models[label]
            torch.cuda.empty_cache()
            continue
        peaks[label] = torch.cuda.max_memory_allocated() - resident
    return times, peaks


def step_results(models, raw, times, peaks, x, y, ctx, peak):
    """{label: step seconds, tokens/s, MFU, MB saved for backward, FLOPs (and the CUDA peak)}, printed as a table
    against the vanilla loop."""
    (B, T), results = x.shape, {}
    for label, m in models.items():
        dt = times[label]
        with ctx:
            _, sb = saved_bytes(lambda: m(x, y), raw[label].parameters())
        flops = raw[label].flops_per_token(T) * B * T
        results[label] = {"step_s": dt, "tok_per_s": B * T / dt, "mfu": flops / dt / peak, "saved_MB": sb / 2**20,
                          "flops": flops}
        if label in peaks:
            results[label]["cuda_peak_MB"] = peaks[label] / 2**20
    if "loop" not in results:  # the reference row ran out of memory (time_variants left it out)
        die("the reference variant 'loop' ran out of memory: lower batch_size or block_size")
    base, cuda = results["loop"], bool(peaks)
    print(table(["model", "step (ms)", "time vs loop", "FLOPs vs loop", "tokens/s", "MFU", "saved for backward (MB)"]
                + (["CUDA step peak above weights (MB)"] if cuda else []),
                [[label, f"{r['step_s'] * 1e3:.1f}", f"{r['step_s'] / base['step_s']:.3f}x",
                  f"{r['flops'] / base['flops']:.3f}x", f"{r['tok_per_s']:.0f}", f"{r['mfu']:.3f}", f"{r['saved_MB']:.1f}"]
                 + ([f"{r['cuda_peak_MB']:.0f}"] if cuda else []) for label, r in results.items()]))
    return results


def phi_lengths(T):
    """The sequence lengths of the Phi table: T/4, T/2 and T, each at least 1 (a block_size under 4 gave a
    zero-length state, which Phi cannot reshape)."""
    return sorted({max(1, T // 4), max(1, T // 2), T})


def phi_memory(c, device, ctx):
    """Phi alone: memory kept for backward as T grows, exact vs top-k (grows with T*V vs T*k), printed as a table."""
    print("\nPhi only (one decode-then-encode of a (1, T, d) state):")
    T, rows = c["block_size"], {}
    for t in phi_lengths(T):
        out = {}
        for k in (0, c["phi_topk"]):
            cfg = GPTConfig(block_size=T, vocab_size=c["vocab_size"], n_layer=1, n_head=c["n_head"],
                            n_embd=c["n_embd"], recurrence="disco", n_loop=2, phi_topk=k, phi_chunk=c["phi_chunk"])
            model = GPT(cfg).to(device)
            h = torch.randn(1, t, c["n_embd"], device=device, requires_grad=True)
            with ctx:
                _, out[k] = saved_bytes(lambda: model.phi(h), model.parameters())
        rows[t] = {"exact_MB": out[0] / 2**20, "topk_MB": out[c["phi_topk"]] / 2**20}
    print(table(["T", "exact Phi saved (MB)", "top-k Phi saved (MB)", "exact / top-k"],
                [[t, f"{r['exact_MB']:.2f}", f"{r['topk_MB']:.2f}", f"{r['exact_MB'] / r['topk_MB']:.1f}x"]
                 for t, r in rows.items()]))
    return rows


def main(argv):
    c, names, device = main_config(argv)
    dtype = resolve_dtype(c["dtype"], device)  # precision.py: fp32 on a CPU where bf16 is slower
    ctx = autocast(device, dtype)
    peak = matmul_peak(device, DTYPES[dtype], n=min(2048, 4 * c["n_embd"]))  # the benchmarked width sets its size
    B, T = c["batch_size"], c["block_size"]
    print(f"device {device}, dtype {dtype}, threads {torch.get_num_threads()}, matmul peak {peak / 1e12:.3f} TFLOP/s")
    print(f"shape: d={c['n_embd']} layers={c['n_layer']} K={c['n_loop']} T={T} V={c['vocab_size']} B={B}\n")
    torch.manual_seed(0)
    x = torch.randint(0, c["vocab_size"], (B, T), device=device)
    y = torch.randint(0, c["vocab_size"], (B, T), device=device)
    models, raw = build_variants(c, names, device)
    times, peaks = time_variants(models, x, y, ctx, c, device)
    results = step_results(models, raw, times, peaks, x, y, ctx, peak)
    phi_rows = phi_memory(c, device, ctx)
    if c["json"]:
        with open(c["json"], "w") as f:
            json.dump({"config": c, "peak_flops": peak, "steps": results, "phi": phi_rows}, f, indent=1)


H100_BF16_PEAK = 989e12  # dense bf16 tensor-core FLOP/s of an H100 SXM
# Assumed model-FLOPs utilization: torchtitan (docs/performance.md) reports 33-39% for Llama 3.1 8B on
# 8 H100s with FSDP, without Float8. A 440M model with K = 4 loops is smaller per kernel; we take 35%.
ASSUMED_MFU = 0.35
TOKENS = 20e9


def training_config(argv, name, doc, extra, checks, need_file=True, need_vocab=True, files=(), unused={}):
    """The preamble of every subcommand that reads a training config: train.py's keys and checks
    (train_config.py) plus the subcommand's own `extra` keys and `checks`; a one-line exit 2 on bad input. `unused`:
    {training key: when its value is what the subcommand does anyway}: any other value would be ignored (train.py's
    inert rule: refused when typed, noted when a file sets it)."""
    try:
        if need_file and not any(a.endswith(".py") for a in argv if not a.startswith("--")) and not {"-h", "--help"} & set(argv):
            cmd = name if name.endswith(".py") else f"bench.py {name}"
            raise ConfigError(f"{cmd} needs a training config file, e.g. {cmd} config/pretrain.py")
        stated = {}  # where each key was set: train_config.check refuses a typed inert key, notes a file's
        c = configure({**train_config.defaults(), **extra}, argv, doc,
                      [*files, __file__, train_config.__file__, sys.modules[GPTConfig.__module__].__file__],
                      {**train_config.CHECKS, **checks}, stated)
        train_config.check(c, stated)  # train.py's one validator: the training keys' relations, GPTConfig's, inert keys
        check_inert(c, train_config.defaults(), {k: (ok, f"a script that reads it: {where}")
                                                 for k, (ok, where) in unused.items()}, stated)
        if need_vocab and not c["vocab_size"]:
            raise ConfigError("vocab_size=0 (the dataset's) is unknown without the data: set --vocab_size")
        if c.get("json"):  # every such --json is a bench_log.RowLog: before any work, a pipe or a user's file is one line
            RowLog.check(c["json"])
        return c
    except (ConfigError, ValueError) as e:
        die(e)


def plan_main(argv):
    """bench.py plan CONFIG [--key=value ...] [--world_size=N]: the memory plan and the throughput
    arithmetic of a training config, for the GPU run we cannot make here."""
    c = training_config(argv, "plan", plan_main.__doc__, {"world_size": 8},  # GPUs (ranks) the run is planned for
                        {"world_size": INT_GE1}, need_vocab=False)
    if c["gradient_accumulation_steps"] % c["world_size"]:
        die(f"world_size={c['world_size']} must be >= 1 and divide gradient_accumulation_steps="
            f"{c['gradient_accumulation_steps']}")
    if not c["vocab_size"]:
        die("vocab_size=0 (the dataset's) cannot be planned without the data: set --vocab_size")
    ac = c["activation_checkpointing"]
    plans = {a: plan({**c, "activation_checkpointing": a}, c["world_size"]) for a in (AUTO_ORDER if ac == "auto" else [ac])}
    if ac == "auto":  # every policy planned, what 'auto' picks on each GPU, and the plan of the smallest GPU's pick
        totals = {a: p.total for a, p in plans.items()}
        print("\n".join(auto_note(pick_checkpointing(totals.get, cap), totals, cap, name) for name, cap in GPUS.items()))
        c = {**c, "activation_checkpointing": pick_checkpointing(totals.get, min(GPUS.values()))}
    p = plans[c["activation_checkpointing"]]
    print(format_plan(p, c, c["world_size"]))
    with torch.device("meta"):
        model = GPT(GPTConfig.from_dict(c))
    T = c["block_size"]
    f_model = model.flops_per_token(T)
    f_hw = model.flops_per_token(T, recompute=c["activation_checkpointing"])
    tok_s = ASSUMED_MFU * H100_BF16_PEAK / f_model  # per GPU
    gpus = c["world_size"]
    print(f"\nFLOPs per token: {f_model / 1e9:.2f} G (model), {f_hw / 1e9:.2f} G with recompute")
    print(f"at {ASSUMED_MFU:.0%} MFU on H100 ({H100_BF16_PEAK / 1e12:.0f} TFLOP/s bf16): {tok_s:,.0f} tokens/s per GPU, "
          f"{tok_s * gpus:,.0f} on {gpus}; {TOKENS / 1e9:.0f}B tokens = {TOKENS / tok_s / 3600:,.0f} GPU-hours "
          f"({TOKENS / tok_s / gpus / 3600:.1f} h on {gpus} GPUs)")
    return p


def step_checks(c):
    """bench.py step's refusals, before any work: (the variants, the device)."""
    if c["json"] and c["plan_cache"] and os.path.realpath(c["json"]) == os.path.realpath(c["plan_cache"]):
        die(f"json={c['json']!r} and plan_cache={c['plan_cache']!r} are one file: allowed two paths (a row log and a "
            "cache of plans are different files)")
    try:
        names = c["variants"].split(",")
        if not set(names) <= set(RECURRENCES) or len(set(names)) < len(names):
            raise ConfigError(f"variants={c['variants']!r} is invalid: allowed a comma list of {tuple(RECURRENCES)}, "
                              "each once")
        for r in names:
            GPTConfig.from_dict({**c, "recurrence": r})  # the model keys' one validator, before any work
        device = setup(c["device"], c["threads"])
    except (ConfigError, ValueError) as e:
        die(e)
    return names, device


def step_main(argv):
    """bench.py step CONFIG [--variants=loop,disco] [--steps=10] [--json=FILE] [--plan_cache=FILE]: training steps of
    a config's real model on this device (random tokens, fused AdamW/Muon, the config's dtype, compile and
    compile_mode), for each recurrence in variants, in one process. Each variant's memory plan (`bench.py plan`'s
    figure at the same micro-batch: device-independent arithmetic, about 15 CPU-s at 440M) is made first, before
    anything is timed, or read from plan_cache; --steps=0 makes the plans only. Then per variant, printed and written
    to the JSON lines the moment it is measured: seconds to the first step (with compile=True: per block, as
    train.py, cold unless this process or TORCHINDUCTOR_CACHE_DIR compiled it before), compiled graphs and
    recompiles, median step time, tokens/s, MFU (model FLOPs, attention over the full T as nanoGPT counts it,
    recompute not counted, against --peak_flops, default an H100's dense bf16 989 TFLOP/s), CUDA peak allocated and
    reserved against the plan, top-k Phi's share of the step (its forward + backward timed alone, x K-1) and each
    step time over the first variant's. A SIGTERM (a time limit) ends the run with "out of time" and exit 124, never
    a reported compile failure."""
    extra = {"variants": "loop,disco",  # comma list of recurrences to measure (the first is the reference)
             "steps": 10,               # timed steps per variant (after the first and `warmup`); 0 = the plans only
             "warmup": 2,               # untimed steps after the first
             "json": "",                # append one JSON line per variant to this file, as it is measured
             "plan_cache": ""}          # a JSON file of memory plans, read and extended ('' = none)
    c = training_config(argv, "step", step_main.__doc__, extra, {"steps": INT_GE0, "warmup": INT_GE0,
                                                                 "json": OUTPUT, "plan_cache": OUTPUT},
                        unused={k: (lambda c, k=k: not c[k], "train.py (bench.py step times the eager full-depth step: "
                                    "no CUDA graph, every loop)") for k in ("cuda_graph", "loop_sample")})
    names, device = step_checks(c)
    stop_on_signals()
    dtype = resolve_dtype(c["dtype"], device)
    try:
        PHASE[0] = "the memory plans"
        policy = {r: checkpointing(c, r, device, DTYPES[dtype]) for r in names}
        plans = {r: cached_plan({**c, "activation_checkpointing": policy[r]}, r, DTYPES[dtype]) for r in names}  # before timing
    except ConfigError as e:
        die(e)
    print(f"device {device} ({torch.cuda.get_device_name() if device.startswith('cuda') else 'cpu'}), dtype {dtype}, "
          f"compile {c['compile']} (mode {c['compile_mode']}), micro-batch {c['batch_size']} x {c['block_size']}, "
          f"torch {torch.__version__}; plans (GB): " + ", ".join(f"{r} {g:.2f} ({policy[r]})" for r, g in plans.items()), flush=True)
    if not c["steps"]:  # the plans are the rows
        log = RowLog(["recurrence", "plan GB"], c["json"], {"config": config_file(argv), "dtype": dtype, "plans_only": True})
        for r, gb in plans.items():
            log.add(r, [RECURRENCES[r].label, f"{gb:.3f}"], {"plan_GB": gb, "activation_checkpointing": policy[r]})
        return plans
    peak_flops = c["peak_flops"] or H100_BF16_PEAK
    log = RowLog(["recurrence", "first step s", "graphs", "recompiles", "step ms", "tokens/s",
                  f"MFU vs {peak_flops / 1e12:.0f} TF", "peak alloc GB",
                  "peak reserved GB", "plan GB", "peak / plan", "top-k Phi share", "step vs first"], c["json"],
                 {"config": config_file(argv), "peak_flops": peak_flops, "device": device, "dtype": dtype,
                  "torch": torch.__version__, "activation_checkpointing": policy})
    ref = None
    for r in names:
        row = measure_step({**c, "activation_checkpointing": policy[r]}, r, device, dtype, plans[r])
        ref = ref or row["step_ms"]
        log.add(r, [RECURRENCES[r].label] + [row[k] for k in STEP_COLUMNS] + [f"{row['step_ms'] / ref:.3f}x"], row)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return log.records


def checkpointing(c, r, device, dtype):
    """Variant r's activation_checkpointing, 'auto' resolved by this device's memory (memory.pick_checkpointing)."""
    return c["activation_checkpointing"] if c["activation_checkpointing"] != "auto" else pick_checkpointing(
        lambda a: GB * cached_plan({**c, "activation_checkpointing": a}, r, dtype), device_bytes(device))


STEP_COLUMNS = ("first_s", "graphs", "recompiles", "step_ms", "tok_per_s", "mfu", "peak_alloc_GB", "peak_reserved_GB",
                "plan_GB", "peak_over_plan", "phi_share")
PHASE = ["starting"]  # what this process is doing, for the "out of time" line


def out_of_time(signum, frame):
    """SIGTERM (the device check's `timeout`) or Ctrl-C: say what was cut, exit 124 (130 for Ctrl-C). A compile cut
    here is out of time; the compiler's workers die with it, which is no compile failure."""
    what = "out of time: SIGTERM" if signum == signal.SIGTERM else "interrupted: SIGINT"
    os.write(2, f"{what} during {PHASE[0]}; every row measured before it is kept\n".encode())
    os._exit(124 if signum == signal.SIGTERM else 130)


def stop_on_signals():
    """bench.py step and the lab scripts end on SIGTERM / Ctrl-C with one line (out_of_time), never a traceback."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, out_of_time)


def training_step(m, x, y, ctx, opts=(), params=None):
    """One training step of model m as a function (the one step bench.py times): forward under ctx, backward, then
    with optimizers: clip the gradients of `params` and step, else drop the gradients."""
    def step():
        with ctx:
            loss = m(x, y)[1]
        loss.backward()
        if opts:
            torch.nn.utils.clip_grad_norm_(params, 1.0)
        for o in opts:
            o.step()
        for o in opts or [m]:
            o.zero_grad(set_to_none=True)
    return step


def timed(fn, n, device):
    """Median seconds of n calls of fn (the GPU synchronized around each)."""
    out = []
    for _ in range(n):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def measure_step(c, r, device, dtype, planned):
    """One recurrence's row of `bench.py step`; its model and optimizer state are freed on return, before the next
    is built."""
    cfg = GPTConfig.from_dict({**c, "recurrence": r})
    ctx, cuda = autocast(device, dtype), device.startswith("cuda")
    counters = guard_failures = None
    if c["compile"]:  # each row compiles its blocks afresh (its first step is what a new run pays)
        from torch import _dynamo  # only where it compiles: about 1.5 s that an eager row need not pay
        from torch._dynamo.utils import counters, guard_failures
        _dynamo.reset()
        counters.clear()
        guard_failures.clear()
    B, T = c["batch_size"], c["block_size"]
    PHASE[0] = f"building {r}"
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    opts = model.configure_optimizers(c["optimizer"], c["learning_rate"], c["weight_decay"], (c["beta1"], c["beta2"]),
                                      c["adam_eps"], c["muon_momentum"], fused=cuda)
    m = model.compile_blocks(mode=c["compile_mode"]) if c["compile"] else model  # train.py's compile: per block
    x = torch.randint(0, cfg.vocab_size, (B, T), device=device)
    y = torch.randint(0, cfg.vocab_size, (B, T), device=device)
    step = training_step(m, x, y, ctx, opts, list(model.parameters()))
    PHASE[0] = f"the first step of {r}" + (" (compiling)" if c["compile"] else "")
    first = timed(step, 1, device)  # compiles (per block), allocates optimizer state
    PHASE[0] = f"the steps of {r}"
    timed(step, c["warmup"], device) if c["warmup"] else None
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    dt = timed(step, c["steps"], device)
    peak = torch.cuda.max_memory_allocated() / 1e9 if cuda else float("nan")
    reserved = torch.cuda.max_memory_reserved() / 1e9 if cuda else float("nan")
    PHASE[0] = f"top-k Phi of {r} timed alone"
    share = topk_phi_seconds(model, B, T, ctx, device, c["steps"]) / dt
    mfu = model.flops_per_token(T) * B * T / dt / (c["peak_flops"] or H100_BF16_PEAK)  # step's basis
    return {"first_s": round(first, 1), "graphs": counters["stats"]["unique_graphs"] if counters is not None else 0,
            "recompiles": sum(len(v) for v in guard_failures.values()) if guard_failures is not None else 0,
            "step_ms": round(dt * 1000, 1), "tok_per_s": round(B * T / dt), "mfu": round(mfu, 4),
            "peak_alloc_GB": round(peak, 2), "peak_reserved_GB": round(reserved, 2), "plan_GB": round(planned, 3),
            "peak_over_plan": round(peak / planned, 3), "phi_share": round(share, 3)}


def topk_phi_seconds(model, B, T, ctx, device, steps):
    """Seconds of top-k Phi alone at a step's shape, forward + backward, x K-1 (its share of a step); nan for a
    model that decodes no top-k Phi."""
    cfg = model.config
    if not (model.rec.phi and cfg.phi_topk):
        return float("nan")
    h = torch.randn(B, T, cfg.n_embd, device=device, requires_grad=True)
    W = model.transformer.wte.weight

    def phi():
        with ctx:
            e = topk_phi(h, W, cfg.phi_topk, cfg.phi_tau, cfg.phi_chunk or T, cfg.phi_kernel)  # the kernel the step runs
        e.float().sum().backward()
    timed(phi, 2, device)
    return (cfg.n_loop - 1) * timed(phi, steps, device)


# train.py's keys that decoding never reads (the model keys that only shape training among them): bench.py sample
# refuses them typed, as train.py refuses an inert key
SAMPLE_IGNORES = ((set(train_config.defaults()) - set(GPTConfig.defaults()) - {"device", "threads", "dtype", "compile",
                                                                              "compile_mode", "seed"})
                  | {"loop_loss", "loop_loss_weights", "label_smoothing", "dropout", "loss_chunk",
                     "activation_checkpointing", "pos_shift", "scaled_init"})


def refuse_typed(argv, ckpt):
    """bench.py sample's keys that would do nothing, typed: a training key (--loop_sample, --learning_rate were taken
    without a word), or with --ckpt a model key (--n_loop=2 with --ckpt ran K=4 and said nothing)."""
    given = {x[2:].split("=")[0] for x in argv if x.startswith("--")}
    typed = sorted(given & SAMPLE_IGNORES)
    if typed:
        what = "is a training key" if len(typed) == 1 else "are training keys"
        raise ConfigError(f"{', '.join('--' + k for k in typed)} {what}: bench.py sample times decoding and reads "
                          "none: drop it")
    typed = sorted(given & set(GPTConfig.defaults())) if ckpt else []
    if typed:
        raise ConfigError(f"{', '.join('--' + k for k in typed)} {'has' if len(typed) == 1 else 'have'} no "
                          "effect with --ckpt: the checkpoint's shape, loops and weights are measured")


def sample_main(argv):
    """bench.py sample CONFIG [--new_tokens=256] [--prompt=16] [--ckpt=RUN] [--exit_rule=prob --exit_threshold=0.9]
    [--speculative_draft_loops=1 --speculative_len=4] [--speculative_propose=1]: new tokens per second of greedy
    GPT.generate with and without the key/value cache per (loop, layer), at a training config's shape (random weights)
    or a checkpoint's (--ckpt: its shape and weights), in one run; with exit_rule also adaptive depth (model.Exit):
    tokens/s, loops per token, blocks saved, tokens equal to the all-loop sample; with speculative_draft_loops and/or
    speculative_propose exact self-speculative decoding (speculative.py; each a row): the same, the share of proposals
    accepted and new tokens per full-depth verification (pipelined: per call)."""
    from discoloop.checkpoint import load_checkpoint  # here: only sample reads a run
    from discoloop.from_checkpoint import EXIT_CHECKS, EXIT_KEYS, exit_option, model_from_checkpoint  # (the same)
    from discoloop.speculative import SPEC_CHECKS, SPEC_KEYS, generate, spec_option  # (the same)
    extra = {"new_tokens": 256,  # tokens to generate, after the prompt
             "prompt": 16,       # prompt length (random tokens)
             "ckpt": "",         # a run folder or checkpoint: its shape and weights instead of random ones
             "samples": 1,       # prompts (rows of one batch = 1: a batch only exits where every row has)
             **EXIT_KEYS, **SPEC_KEYS}
    c = training_config(argv, "sample", sample_main.__doc__, extra, {"new_tokens": INT_GE1, "prompt": INT_GE1,
                        "samples": INT_GE1, **EXIT_CHECKS, **SPEC_CHECKS},
                        unused={k: (ok, "train.py (bench.py sample times fp32 eager decoding)") for k, ok in
                                (("dtype", lambda c: c["dtype"] == "float32"), ("compile", lambda c: not c["compile"]))},
                        need_vocab=not any(a.startswith("--ckpt=") and len(a) > 7 for a in argv),  # a run has its own
                        files=[sys.modules[m].__file__ for m in ("discoloop.from_checkpoint", "discoloop.speculative")])  # their keys' comments
    try:
        refuse_typed(argv, c["ckpt"])
        device = setup(c["device"], c["threads"])
        if c["ckpt"]:
            model = model_from_checkpoint(load_checkpoint(c["ckpt"]))
        else:
            model = GPT(GPTConfig.from_dict({**c, "block_size": max(c["block_size"], c["prompt"] + c["new_tokens"])}))
        exits = exit_option(c["exit_rule"], c["exit_threshold"], c["exit_min_loops"], model, ckpt=c["ckpt"] or None)
        spec = spec_option(c["speculative_draft_loops"], c["speculative_len"], model)  # a row of its own: exits apart
        pipe = spec_option(0, 4, model, propose=c["speculative_propose"], recheck=c["speculative_recheck"])  # beside
        if c["prompt"] + c["new_tokens"] > model.config.block_size:
            raise ConfigError(f"prompt + new_tokens = {c['prompt'] + c['new_tokens']} exceeds the checkpoint's "
                              f"block_size={model.config.block_size}")
    except (*ERRORS, ValueError) as e:
        die(e)
    model, cfg = model.to(device).eval(), model.config
    torch.manual_seed(0)
    prompts = torch.randint(0, cfg.vocab_size, (c["samples"], 1, c["prompt"]), device=device)
    runs = [("with the (loop, layer) cache", True, None), ("without (whole prefix every token)", False, None)]
    runs += [(f"cache + exits ({exits.rule} {exits.threshold:g}, min {exits.min_loops})", True, exits)] if exits else []
    runs += [(f"speculative (draft {spec.draft_loops} loops, {spec.draft_len} tokens)", True, spec)] if spec else []
    runs += [(pipe.name(), True, pipe)] if pipe else []
    seconds, out = {}, {}
    model.generate(prompts[0], 2, temperature=0)  # warm-up: the first call pays one-time costs
    for name, uc, ex in runs:
        t = time.perf_counter()
        out[name] = [generate(model, x, c["new_tokens"], ex, temperature=0) if ex and ex in (spec, pipe) else
                     model.generate(x, c["new_tokens"], temperature=0, use_cache=uc, exits=ex) for x in prompts]
        seconds[name] = time.perf_counter() - t
    print(f"{model.rec.label}, K={cfg.n_loop}, {cfg.n_layer} layers, d={cfg.n_embd}, V={cfg.vocab_size}"
          f"{' (' + c['ckpt'] + ')' if c['ckpt'] else ', random weights'}: {c['samples']} x {c['new_tokens']} new "
          f"tokens after a {c['prompt']}-token prompt, greedy, fp32, threads {torch.get_num_threads()}")
    if not c["ckpt"] and cfg.block_size > c["block_size"]:  # random weights: a longer context costs only positions
        print(f"block_size raised from the config's {c['block_size']} to {cfg.block_size} = prompt + new_tokens")
    print(sample_table(runs, out, seconds, c["samples"] * c["new_tokens"], c["prompt"], cfg.n_loop, (spec, pipe)))


def sample_table(runs, out, seconds, n, prompt, K, spec):
    """`bench.py sample`'s table: a row per run of n new tokens, beside the first run's (the cached all-loop one);
    the speculative runs' (spec: both decoders) loops per token count every position they ran, rejected ones too."""
    base, rows = runs[0][0], []
    for name, uc, ex in runs:
        sp = ex if ex is not None and ex in spec else None
        new = [t.flatten() for t in ex.loops if t.size(1) == 1] if ex and not sp else []  # the new tokens' passes
        loops = sp.loops_per_token(K) if sp else torch.cat(new).float().mean().item() if new else K
        same = sum(int((a == b).sum()) - prompt for a, b in zip(out[name], out[base])) / n
        rows.append([name, round(seconds[name], 3), round(n / seconds[name], 1), round(seconds[base] / seconds[name], 2),
                     round(loops, 3), f"{1 - loops / K:.1%}", f"{same:.1%}", *(sp.cells() if sp else ["-", "-"])])
    return table(["generate", "seconds", "new tokens/s", "vs cache", "loops/token", "looped blocks saved",
                  "tokens = cached all-loop", "proposals accepted", "tokens/verification (or call)"], rows)


# subcommand -> its main(argv); no subcommand: the default CPU-shape comparison (main)
SUBCOMMANDS = {"plan": plan_main, "step": step_main, "sample": sample_main}

if __name__ == "__main__":
    if sys.argv[1:2] and sys.argv[1] in SUBCOMMANDS:
        SUBCOMMANDS[sys.argv[1]](sys.argv[2:])
    else:
        main(sys.argv[1:])
