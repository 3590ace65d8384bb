"""
Benchmarks (nanoGPT has one): forward+backward step time, MFU and memory for every recurrence,
exact vs top-k Phi, eager vs compiled. Figures are printed as ratios measured in one run; nothing
here is asserted by tests.

    python bench.py                          # CPU-sized pretraining-like shape
    python bench.py --n_embd=1024 --n_layer=24 --n_head=16 --block_size=8192 --vocab_size=129280 --batch_size=1   # GPU
    python bench.py --compile=True           # also time torch.compile
    python bench.py --variants=loop,disco    # only these (all are built at once: at 440M on CPU, RAM decides)
    python bench.py plan config/pretrain.py --world_size=8   # per-rank memory plan + throughput at a stated MFU
    python bench.py phi config/pretrain.py    # every top-k Phi kernel (kernels.PHI_KERNELS) against its decode matmul

Memory: bytes that autograd keeps for backward (counted with saved_tensors_hooks, the same on
every device), and on CUDA the allocator's peak during a step above the resident weights. The Phi
table isolates Phi: exact keeps (B, T, V) probabilities, top-k keeps (B, T, k).
"""
import copy
import functools
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import train_config
from kernels import PHI_KERNELS, TopkPhi
from memory import format_plan, plan
from common import DTYPES, ERRORS, SYSTEM_CHECKS, ConfigError, autocast, die, setup, table
from configurator import INT_GE0, INT_GE1, OUTPUT, configure
from model import GPT, RECURRENCES, GPTConfig
from precision import resolve_dtype

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


def one_step(model, x, y, ctx):
    with ctx:
        _, loss = model(x, y)
    loss.backward()
    model.zero_grad(set_to_none=True)


def round_robin(fns, iters, warmup, device):
    """{name: median seconds}, one call of each in turn, so that load and clocks hit every one alike."""
    times = {name: [] for name in fns}
    for i in range(warmup + iters):
        for name, fn in fns.items():
            t = timed(fn, 1, device)
            if i >= warmup:
                times[name].append(t)
    return {name: statistics.median(t) for name, t in times.items()}


def step_times(models, x, y, ctx, iters, warmup, device):
    """Median step time per model, timed round-robin, so that the ratios between models stay meaningful."""
    return round_robin({label: functools.partial(one_step, m, x, y, ctx) for label, m in models.items()},
                       iters, warmup, device)


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
        return step_times(models, x, y, ctx, c["iters"], c["warmup"], device), {}
    times, peaks = {}, {}
    for label, m in list(models.items()):
        torch.cuda.reset_peak_memory_stats()
        resident = torch.cuda.memory_allocated()  # every variant's weights: not this step's cost
        try:
            times.update(step_times({label: m}, x, y, ctx, c["iters"], c["warmup"], device))
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


def training_config(argv, name, doc, extra, checks, need_file=True, need_vocab=True):
    """The preamble of every subcommand that reads a training config: train.py's keys and checks
    (train_config.py) plus the subcommand's own `extra` keys and `checks`; a one-line exit 2 on bad input."""
    try:
        if need_file and not any(a.endswith(".py") for a in argv if not a.startswith("--")) and not {"-h", "--help"} & set(argv):
            raise ConfigError(f"bench.py {name} needs a training config file, e.g. bench.py {name} config/pretrain.py")
        c = configure({**train_config.defaults(), **extra}, argv, doc,
                      [__file__, train_config.__file__, sys.modules[GPTConfig.__module__].__file__],
                      {**train_config.CHECKS, **checks})
        train_config.check(c)  # the relations of the training keys, and the model keys' one validator (GPTConfig)
        if need_vocab and not c["vocab_size"]:
            raise ConfigError("vocab_size=0 (the dataset's) is unknown without the data: set --vocab_size")
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
    p = plan(c, c["world_size"])
    print(format_plan(p, c, c["world_size"]))
    with torch.device("meta"):
        model = GPT(GPTConfig.from_dict(c))
    T = c["block_size"]
    f_model = model.flops_per_token(T)
    f_hw = model.flops_per_token(T, recompute=c["activation_checkpointing"] == "block")
    tok_s = ASSUMED_MFU * H100_BF16_PEAK / f_model  # per GPU
    gpus = c["world_size"]
    print(f"\nFLOPs per token: {f_model / 1e9:.2f} G (model), {f_hw / 1e9:.2f} G with recompute")
    print(f"at {ASSUMED_MFU:.0%} MFU on H100 ({H100_BF16_PEAK / 1e12:.0f} TFLOP/s bf16): {tok_s:,.0f} tokens/s per GPU, "
          f"{tok_s * gpus:,.0f} on {gpus}; {TOKENS / 1e9:.0f}B tokens = {TOKENS / tok_s / 3600:,.0f} GPU-hours "
          f"({TOKENS / tok_s / gpus / 3600:.1f} h on {gpus} GPUs)")
    return p


def breaks_main(argv):
    """bench.py breaks CONFIG [--key=value ...]: torch.compile graph breaks of one Block's training forward, the
    region train.py compiles (torch._dynamo.explain runs on CPU; the count does not depend on T, so T is small)."""
    import torch._dynamo
    c = training_config(argv, "breaks", breaks_main.__doc__, {"T": 64},  # sequence length traced (breaks do not depend on it)
                        {"T": INT_GE1}, need_file=False, need_vocab=False)
    try:
        cfg = GPTConfig.from_dict({**c, "block_size": c["T"]})
    except ValueError as e:
        die(e)
    model = GPT(cfg)
    x = torch.randn(1, c["T"], cfg.n_embd, requires_grad=True)
    rope = (model.rope_cos, model.rope_sin) if cfg.pos_emb == "rope" else None
    ex = torch._dynamo.explain(model.transformer.h[0])(x, rope)
    print(f"{cfg.recurrence} top-k={cfg.phi_topk} activation_checkpointing={cfg.activation_checkpointing!r}: "
          f"{ex.graph_count} graph(s), {ex.graph_break_count} break(s)")
    for b in ex.break_reasons:
        where = b.user_stack[-1] if b.user_stack else None
        print(f"  break: {b.reason.splitlines()[0][:200]}" + (f" ({where.filename}:{where.lineno})" if where else ""))
    return ex.graph_break_count


# bench.py compile's toy width (a comment on the line itself would be --help's meaning of these keys)
TOY = dict(n_embd=64, n_head=4, block_size=64, vocab_size=2048, batch_size=2)


def compile_main(argv):
    """bench.py compile CONFIG [--modes=eager,blocks,whole] [--steps=3]: seconds to the first training step (compile
    included, Inductor's caches off) and the later step time, eager against each Block compiled on its own (train.py's
    compile=True) and against the whole unrolled model, at the config's depth, K and options and a toy width (TOY, but
    for the keys the command line gives), in one process; unique compiled graphs show whether anything recompiles across layers or loops."""
    from torch import _dynamo  # here, not at the top: about 1.5 s that `bench.py plan` need not pay
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config
    extra = {"modes": "eager,blocks,whole",  # comma list of eager | blocks (per block) | whole (torch.compile(model))
             "steps": 3}                     # later steps timed (median), after the first
    c = training_config(argv, "compile", compile_main.__doc__, extra, {"steps": INT_GE1}, need_vocab=False)
    given = {a[2:].split("=")[0] for a in argv if a.startswith("--")}  # the command line's keys beat the toy width
    c.update({k: v for k, v in TOY.items() if k not in given})
    c["phi_topk"] = min(c["phi_topk"], c["vocab_size"])
    modes = c["modes"].split(",")
    try:
        if not set(modes) <= {"eager", "blocks", "whole"} or len(set(modes)) < len(modes):
            raise ConfigError(f"modes={c['modes']!r} is invalid: a comma list of eager, blocks, whole, each once "
                              "(the first is the reference)")
        cfg = GPTConfig.from_dict(c)
        device = setup(c["device"], c["threads"])
    except (ConfigError, ValueError) as e:
        die(e)
    inductor_config.force_disable_caches = True  # seconds to the first step as a new machine sees them
    x = torch.randint(0, cfg.vocab_size, (c["batch_size"], c["block_size"]), device=device)
    rows = []
    for mode in modes:
        _dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = GPT(cfg).to(device)
        m = model.compile_blocks() if mode == "blocks" else torch.compile(model) if mode == "whole" else model

        def step():
            m(x, x)[1].backward()

        first = timed(step, 1, device)
        later = timed(step, c["steps"], device)
        rows.append([mode, round(first, 1), round(later * 1000, 1), counters["stats"]["unique_graphs"]])
    ref = rows[0][2]
    print(f"{cfg.recurrence} n_layer={cfg.n_layer} K={cfg.n_loop} activation_checkpointing={cfg.activation_checkpointing!r}, "
          f"d={cfg.n_embd} T={cfg.block_size} V={cfg.vocab_size} B={c['batch_size']}, device {device}, torch {torch.__version__}")
    print(table(["mode", "first step s", "later step ms", "compiled graphs", f"step vs {rows[0][0]}"],
                [row + [f"{row[2] / ref:.3f}x"] for row in rows]))
    return rows


def step_main(argv):
    """bench.py step CONFIG [--variants=loop,disco] [--steps=10]: training steps of a config's real model on this
    device (random tokens, fused AdamW/Muon, the config's dtype and compile), for each recurrence in variants, in one
    process: seconds to the first step (compile=True: per block, as train.py), peak memory
    (torch.cuda.max_memory_allocated) against `bench.py plan`'s figure at the same micro-batch, median step time, tokens/s, MFU against --peak_flops (default: an H100's dense bf16 989 TFLOP/s), each step
    time over the first variant's, and top-k Phi's share of the step (its forward + backward timed alone, x K-1)."""
    extra = {"variants": "loop,disco",  # comma list of recurrences to measure (the first is the reference)
             "steps": 10}               # timed steps per variant (after 3 untimed)
    c = training_config(argv, "step", step_main.__doc__, extra, {"steps": INT_GE1})
    try:
        names = c["variants"].split(",")
        if not set(names) <= set(RECURRENCES):
            raise ConfigError(f"variants={c['variants']!r} is invalid: allowed a comma list of {tuple(RECURRENCES)}")
        for r in names:
            GPTConfig.from_dict({**c, "recurrence": r})  # the model keys' one validator, before any work
        device = setup(c["device"], c["threads"])
    except (ConfigError, ValueError) as e:
        die(e)
    dtype = resolve_dtype(c["dtype"], device)
    rows = []
    for r in names:
        rows.append(measure_step(c, r, device, dtype))
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    ref = rows[0][2]
    print(f"device {device}, dtype {dtype}, compile {c['compile']}, micro-batch {c['batch_size']} x {c['block_size']}, "
          f"torch {torch.__version__}")
    print(table(["recurrence", "first step s", "step ms", "tokens/s", "MFU", "peak GB", "plan GB", "top-k Phi share",
                 "step vs first"], [row + [f"{row[2] / ref:.3f}x"] for row in rows]))


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


def measure_step(c, r, device, dtype):
    """One recurrence's row of `bench.py step`; its model and optimizer state are freed on return, before the next
    is built."""
    cfg = GPTConfig.from_dict({**c, "recurrence": r})
    ctx, cuda = autocast(device, dtype), device.startswith("cuda")
    if c["compile"]:  # each row compiles its blocks afresh (its first step is what a new run pays)
        from torch import _dynamo  # only where it compiles: about 1.5 s that an eager row need not pay
        _dynamo.reset()
    B, T = c["batch_size"], c["block_size"]
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    opts = model.configure_optimizers(c["optimizer"], c["learning_rate"], c["weight_decay"], (c["beta1"], c["beta2"]),
                                      c["adam_eps"], c["muon_momentum"], fused=cuda)
    m = model.compile_blocks() if c["compile"] else model  # train.py's compile: per block
    x = torch.randint(0, cfg.vocab_size, (B, T), device=device)
    y = torch.randint(0, cfg.vocab_size, (B, T), device=device)

    def step():
        with ctx:
            loss = m(x, y)[1]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)

    first = timed(step, 1, device)  # compiles (per block), allocates optimizer state
    timed(step, 2, device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    dt = timed(step, c["steps"], device)
    peak = torch.cuda.max_memory_allocated() / 1e9 if cuda else float("nan")
    planned = plan({**c, "recurrence": r, "gradient_accumulation_steps": 1}, 1, DTYPES[dtype]).total / 1e9
    share = topk_phi_seconds(model, B, T, ctx, device, c["steps"]) / dt
    mfu = model.flops_per_token(T, recompute=False) * B * T / dt / (c["peak_flops"] or H100_BF16_PEAK)
    return [RECURRENCES[r].label, round(first, 1), round(dt * 1000, 1), round(B * T / dt), round(mfu, 4),
            round(peak, 2), round(planned, 2), round(share, 3)]


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
            e = TopkPhi.apply(h, W, cfg.phi_topk, cfg.phi_tau, cfg.phi_chunk or T)
        e.float().sum().backward()
    timed(phi, 2, device)
    return (cfg.n_loop - 1) * timed(phi, steps, device)


def sample_main(argv):
    """bench.py sample CONFIG [--new_tokens=256] [--prompt=16] [--ckpt=RUN] [--exit_rule=prob --exit_threshold=0.9]:
    new tokens per second of greedy GPT.generate with and without the key/value cache per (loop, layer), at a training
    config's shape (random weights) or a checkpoint's (--ckpt: its shape and weights), in one run; with exit_rule also
    with adaptive depth (model.Exit): tokens/s, loops per token, blocks saved, tokens equal to the all-loop sample."""
    from checkpoint import EXIT_KEYS, exit_option, load_checkpoint, model_from_checkpoint  # here: only sample reads a run
    extra = {"new_tokens": 256,  # tokens to generate, after the prompt
             "prompt": 16,       # prompt length (random tokens)
             "ckpt": "",         # a run folder or checkpoint: its shape and weights instead of random ones
             "samples": 1,       # prompts (rows of one batch = 1: a batch only exits where every row has)
             **EXIT_KEYS}
    c = training_config(argv, "sample", sample_main.__doc__, extra, {"new_tokens": INT_GE1, "prompt": INT_GE1,
                        "samples": INT_GE1, "exit_min_loops": INT_GE1,
                        "exit_rule": (lambda v: v in ("", "prob", "kl"), "'' (off), 'prob' or 'kl'")})
    try:
        device = setup(c["device"], c["threads"])
        if c["ckpt"]:
            model = model_from_checkpoint(load_checkpoint(c["ckpt"]))
        else:
            model = GPT(GPTConfig.from_dict({**c, "block_size": max(c["block_size"], c["prompt"] + c["new_tokens"])}))
        exits = exit_option(c["exit_rule"], c["exit_threshold"], c["exit_min_loops"], model)
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
    seconds, out = {}, {}
    model.generate(prompts[0], 2, temperature=0)  # warm-up: the first call pays one-time costs
    for name, uc, ex in runs:
        t = time.perf_counter()
        out[name] = [model.generate(x, c["new_tokens"], temperature=0, use_cache=uc, exits=ex) for x in prompts]
        seconds[name] = time.perf_counter() - t
    print(f"{model.rec.label}, K={cfg.n_loop}, {cfg.n_layer} layers, d={cfg.n_embd}, V={cfg.vocab_size}"
          f"{' (' + c['ckpt'] + ')' if c['ckpt'] else ', random weights'}: {c['samples']} x {c['new_tokens']} new "
          f"tokens after a {c['prompt']}-token prompt, greedy, fp32, threads {torch.get_num_threads()}")
    if not c["ckpt"] and cfg.block_size > c["block_size"]:  # random weights: a longer context costs only positions
        print(f"block_size raised from the config's {c['block_size']} to {cfg.block_size} = prompt + new_tokens")
    base, n = runs[0][0], c["samples"] * c["new_tokens"]
    rows = []
    for name, uc, ex in runs:
        new = [t.flatten() for t in ex.loops if t.size(1) == 1] if ex else []  # the new tokens' passes, not the prompt's
        loops = torch.cat(new).float().mean().item() if new else cfg.n_loop
        same = sum(int((a == b).sum()) - c["prompt"] for a, b in zip(out[name], out[base])) / n
        rows.append([name, round(seconds[name], 3), round(n / seconds[name], 1), round(seconds[base] / seconds[name], 2),
                     round(loops, 3), f"{1 - loops / cfg.n_loop:.1%}", f"{same:.1%}"])
    print(table(["generate", "seconds", "new tokens/s", "vs cache", "loops/token", "looped blocks saved",
                 "tokens = cached all-loop"], rows))


def phi_main(argv):
    """bench.py phi CONFIG [--rows=N] [--kernels=bag,dense] [--iters=5] [--warmup=2] [--json=FILE]: every top-k Phi
    kernel of kernels.PHI_KERNELS, forward + backward, at a training config's shape (batch_size x block_size rows,
    n_embd, vocab_size, phi_topk, phi_tau, phi_chunk positions of every sequence at a time, dtype) in one process,
    timed round robin against the decode matmul alone (the floor: F.linear(x, W) chunk by chunk, forward only), with
    each kernel's largest difference from "bag" (today's kernel) in the run's dtype: rounding, and ties at the k-th
    logit broken differently (bf16 logits tie often). "compiled" is timed where compile=True or kernels names it."""
    c, names, device = phi_config(argv)
    dtype = resolve_dtype(c["dtype"], device)
    ctx, (x, W, g, chunk), k, tau = autocast(device, dtype), phi_inputs(c, device), c["phi_topk"], c["phi_tau"]
    print(f"device {device}, dtype {dtype}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"shape: rows={x.size(1)} d={W.size(1)} V={W.size(0)} k={k} tau={tau} chunk={chunk} rows\n")
    steps, diffs, failed = phi_checks(names, x, W, g, k, tau, chunk, ctx, device)
    floors = {"matmul fwd (floor)": matmul_step(x, W, chunk, ctx, False),
              "matmul fwd+bwd (3 matmuls)": matmul_step(x, W, chunk, ctx, True)}
    times = round_robin({**floors, **steps}, c["iters"], c["warmup"], device)
    rows = phi_rows(times, diffs, "bag" in steps)
    if c["json"]:
        shape = {"rows": x.size(1), "n_embd": W.size(1), "vocab_size": W.size(0), "k": k, "tau": tau, "chunk_rows": chunk}
        with open(c["json"], "w") as f:
            json.dump({"device": device, "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
                       "torch": torch.__version__, "dtype": dtype, "shape": shape, "kernels": rows, "failed": failed},
                      f, indent=1)
    return rows


def phi_config(argv):
    """bench.py phi's keys, checked before any work: (config, kernel names, device); one line and exit 2 if bad."""
    extra = {"rows": 0,       # rows (positions) Phi is timed on; 0 = batch_size x block_size
             "kernels": "",   # comma list of kernels.PHI_KERNELS to time, including bag ('' = all; compiled only with compile=True)
             "iters": 5,      # timed calls per kernel, round robin
             "warmup": 2,     # untimed calls per kernel first
             "json": ""}      # also write the results to this JSON file
    c = training_config(argv, "phi", phi_main.__doc__, extra, {"rows": INT_GE0, "iters": INT_GE1, "warmup": INT_GE0})
    try:
        if not c["phi_topk"]:
            raise ConfigError(f"phi_topk=0 is invalid: bench.py phi times top-k Phi, allowed 1..vocab_size={c['vocab_size']}")
        names = c["kernels"].split(",") if c["kernels"] else [n for n in PHI_KERNELS if c["compile"] or n != "compiled"]
        if not set(names) <= set(PHI_KERNELS) or "bag" not in names:
            raise ConfigError(f"kernels={c['kernels']!r} is invalid: allowed a comma list of {tuple(PHI_KERNELS)} "
                              "including bag (the reference), or '' for all")
        return c, ["bag"] + [n for n in dict.fromkeys(names) if n != "bag"], setup(c["device"], c["threads"])
    except (ConfigError, ValueError) as e:
        die(e)


def phi_inputs(c, device):
    """(x, W, g, chunk): normed states x (1, rows, d) and the upstream gradient g, unit scale; W (V, d) at the
    embedding's init scale; chunk = the model's rows per Phi chunk, batch_size x phi_chunk (one (1, rows) sequence
    chunked by rows does the model's (B, chunk) chunk's work)."""
    rows = c["rows"] or c["batch_size"] * c["block_size"]
    torch.manual_seed(0)
    x = torch.randn(1, rows, c["n_embd"], device=device, requires_grad=True)
    W = (0.02 * torch.randn(c["vocab_size"], c["n_embd"], device=device)).requires_grad_()
    g = torch.randn(1, rows, c["n_embd"], device=device)
    return x, W, g, (c["batch_size"] * c["phi_chunk"]) or rows


def phi_step(kernel, x, W, g, k, tau, chunk, ctx):
    """One forward (under the run's autocast) + backward of a Phi kernel; returns (Phi, dx, dW)."""
    def step():
        x.grad = W.grad = None
        with ctx:
            e = kernel(x, W, k, tau, chunk)
        e.backward(g.to(e.dtype))
        return e.detach(), x.grad, W.grad
    return step


def phi_checks(names, x, W, g, k, tau, chunk, ctx, device):
    """Each kernel's first call (it compiles, if it does), untimed: ({name: its step}, {name: largest absolute
    differences of (Phi, dx, dW) from bag's and, on CUDA, its peak above what was allocated before it},
    {name: why it failed}); a kernel that fails (out of memory, an op this device lacks) is left out."""
    steps, diffs, failed, ref, cuda = {}, {}, {}, None, device.startswith("cuda")
    for name in names:  # bag first (phi_config)
        step = phi_step(PHI_KERNELS[name], x, W, g, k, tau, chunk, ctx)
        x.grad = W.grad = None  # the previous kernel's gradients are not this one's peak
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if cuda else 0
        try:
            out = step()
        except (RuntimeError, NotImplementedError) as e:
            failed[name] = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            print(f"{name}: failed, left out: {failed[name]}")
            continue
        if name == "bag":
            ref = [t.clone() for t in out]
        steps[name] = step
        diffs[name] = {"diff": [(a.float() - b.float()).abs().max().item() for a, b in zip(out, ref)] if ref else None,
                       "peak_MB": (torch.cuda.max_memory_allocated() - before) / 2**20 if cuda else None}
    return steps, diffs, failed


def matmul_step(x, W, chunk, ctx, backward):
    """Phi's decode matmul alone, chunk by chunk: logits = x W^T (the floor); with backward, also a dense logits
    gradient's two matmuls, dx = G W and dW = G^T x (the logits stand in for G)."""
    def step():
        with torch.no_grad(), ctx:
            for xs in x[0].split(chunk):
                logits = F.linear(xs, W)
                if backward:
                    logits @ W, logits.t() @ xs  # dx and dW of a dense logits gradient: timed, not kept
    return step


def phi_rows(times, diffs, has_bag):
    """The table of bench.py phi, printed: ms, ratio to the floor and to bag, differences from bag (and the CUDA
    peak); returned as {name: {...}} for the JSON."""
    floor, rows = times["matmul fwd (floor)"], {}
    for name, t in times.items():
        d = diffs.get(name, {})
        rows[name] = {"ms": t * 1e3, "vs_floor": t / floor, "vs_bag": t / times["bag"] if has_bag else None,
                      "diff": d.get("diff"), "peak_MB": d.get("peak_MB")}
    cuda = any(r["peak_MB"] is not None for r in rows.values())
    fmt = lambda v, f: "-" if v is None else format(v, f)
    print(table(["kernel", "ms", "vs floor", "vs bag", "max |diff| Phi", "max |diff| dx", "max |diff| dW"]
                + (["CUDA peak (MB)"] if cuda else []),
                [[name, f"{r['ms']:.2f}", f"{r['vs_floor']:.2f}x", fmt(r["vs_bag"], ".3f") + ("x" if r["vs_bag"] else "")]
                 + [fmt(v, ".2e") for v in (r["diff"] or [None] * 3)] + ([fmt(r["peak_MB"], ".0f")] if cuda else [])
                 for name, r in rows.items()]))
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["plan"]:
        plan_main(sys.argv[2:])
    elif sys.argv[1:2] == ["breaks"]:
        breaks_main(sys.argv[2:])
    elif sys.argv[1:2] == ["step"]:
        step_main(sys.argv[2:])
    elif sys.argv[1:2] == ["sample"]:
        sample_main(sys.argv[2:])
    elif sys.argv[1:2] == ["compile"]:
        compile_main(sys.argv[2:])
    elif sys.argv[1:2] == ["phi"]:
        phi_main(sys.argv[2:])
    else:
        main(sys.argv[1:])
