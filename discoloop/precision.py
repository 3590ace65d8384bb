"""
dtype="auto": the precision a script computes in (train.py, bench.py, eval_harness.py, probe.py, sample.py).

bf16 on a GPU that has it (fp16 otherwise); on a CPU, fp32 unless bf16 autocast is measured to be clearly
faster. CPUs differ wildly: bf16 was 2x faster than fp32 on one AMD EPYC, 2.5x slower on a Xeon with the same
avx512_bf16 flag, and 100x slower on a CPU without AVX-512. So a CPU with a bf16 flag times a step in each
precision (train.py: the model's own; the other scripts: one tiny MLP), fp32 first and bf16 only once if it is
already slower; a CPU without one is fp32 without timing. A timing close to the threshold would flip between
two starts of one command, so the decision is kept per machine and shape in dtype_cache_path() and reused.
"""
import contextlib
import functools
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

from discoloop.common import atomic_write

CPU_DTYPES = ("float32", "bfloat16")  # what pick_cpu_dtype gives, so all a cache entry may say


def cpu_has_bf16_flag():
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def time_mlp(dtype, reps):
    """Best-of-reps seconds of a tiny MLP forward + backward under CPU autocast to `dtype`
    (about 0.1 GFLOP: milliseconds in fp32, about a second where bf16 is 100x slower)."""
    x = torch.randn(256, 128)
    w1, w2 = torch.randn(512, 128, requires_grad=True), torch.randn(128, 512, requires_grad=True)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            y = F.linear(F.gelu(F.linear(F.rms_norm(x, (128,)), w1)), w2)
        y.float().square().mean().backward()
        best = min(best, time.perf_counter() - t)
    return best


def model_step_timer(model, x, y):
    """A timer(dtype, reps) for pick_cpu_dtype: best-of-reps seconds of one forward + backward of `model` on
    (x, y) under CPU autocast to dtype, after one untimed call (a first call packs weights and builds kernels:
    timing it made a cold bf16 lose to a warm fp32). The RNG state and gradients are put back, so the run is
    the same whatever is timed; `timer.seconds` keeps every figure for config.json."""
    seconds = {}

    def step(dtype):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            _, loss = model(x, y, sparse_targets=bool((y == -1).any()))
        loss.backward()

    def timer(dtype, reps):
        rng = torch.get_rng_state()
        try:
            step(dtype)
            best = float("inf")
            for _ in range(reps):
                t = time.perf_counter()
                step(dtype)
                best = min(best, time.perf_counter() - t)
        finally:
            torch.set_rng_state(rng)
            model.zero_grad(set_to_none=True)
        name = str(dtype).removeprefix("torch.")
        seconds[name] = min(seconds.get(name, best), best)
        return best

    timer.seconds = seconds
    return timer


def pick_cpu_dtype(has_flag, timer=time_mlp):
    """'bfloat16' only where it is measured to be >= 1.25x faster than fp32, else 'float32'."""
    if not has_flag:
        return "float32"
    fp32 = timer(torch.float32, 5)
    if timer(torch.bfloat16, 1) >= fp32:  # one slow try settles it (no 5 slow repeats)
        return "float32"
    return "bfloat16" if timer(torch.bfloat16, 4) * 1.25 < fp32 else "float32"


def dtype_cache_path():
    """Where the CPU decisions are kept: $DISCOLOOP_DTYPE_CACHE, else ~/.cache/discoloop/cpu_dtype.json.
    Delete the file (or pass --dtype=float32 / bfloat16) to decide again."""
    return os.environ.get("DISCOLOOP_DTYPE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "discoloop",
                                                                    "cpu_dtype.json")


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown cpu")
    except OSError:
        return "unknown cpu"


def read_cache(path, key):
    """(every decision kept in the file or None when the file is not this cache, this key's decision or None). The
    file is input like any other: an entry that pick_cpu_dtype cannot give (float16, a typo) is a one-line warning
    and timed again, never used (a warning, not a refusal: timing again is what deleting a cache would do). A path
    that is not this cache (not a regular file, not JSON, someone else's JSON: keys not '<cpu> | torch ...') is
    never read past that and never written: a one-line warning, and the decision is timed at every start."""
    if not os.path.lexists(path):
        return {}, None
    known = None
    if os.path.isfile(path) and not os.path.islink(path):  # a pipe would block, a device or a link is not ours
        with contextlib.suppress(OSError, ValueError):
            with open(path) as f:
                text = f.read()
            known = json.loads(text) if text.strip() else {}  # an empty file (mktemp's) is a new cache
    if not isinstance(known, dict) or not all(" | torch " in k for k in known):
        print(f"warning: DISCOLOOP_DTYPE_CACHE='{path}' is not a CPU precision cache: left as it is, the precision "
              "timed now and not kept (point DISCOLOOP_DTYPE_CACHE at a new file)", file=sys.stderr)
        return None, None
    if key in known and known[key] not in CPU_DTYPES:
        print(f"warning: '{path}' keeps dtype {known[key]!r} for this CPU and shape; allowed {CPU_DTYPES}: timed again",
              file=sys.stderr)
        return known, None
    return known, known.get(key)


def cached_cpu_dtype(what, decide):
    """('float32' | 'bfloat16', where it came from): decided once per machine, torch, thread count and `what`
    (the model and batch shape) by decide(), kept in dtype_cache_path(), and reused."""
    key = f"{cpu_name()} | torch {torch.__version__} | threads {torch.get_num_threads()} | {what}"
    path = dtype_cache_path()
    known, kept = read_cache(path, key)
    if kept is not None:
        return kept, f"decided earlier on this machine (kept in {path})"
    choice = decide()
    if known is None:  # not this cache: never written
        return choice, "timed now (not kept)"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, json.dumps({**known, key: choice}, indent=1))
    except OSError:  # an unwritable home: decide at every start instead
        return choice, "timed now (not kept: the cache cannot be written)"
    return choice, f"timed now (kept in {path})"


def model_cpu_dtype(model, x, y, model_args):
    """train.py on a CPU with dtype='auto': (dtype, where it came from, seconds timed) for THIS model's training
    step on its first micro-batch (x, y), kept per model keys and batch shape."""
    timer = model_step_timer(model, x, y)
    shape = f"{json.dumps(model_args, sort_keys=True)} batch {tuple(x.shape)}"
    picked, source = cached_cpu_dtype(shape, lambda: pick_cpu_dtype(cpu_has_bf16_flag(), timer))
    return picked, source, timer.seconds


@functools.lru_cache(maxsize=None)
def auto_cpu_dtype():
    return cached_cpu_dtype("a 128x512 MLP", lambda: pick_cpu_dtype(cpu_has_bf16_flag()))[0]


def decide_dtype(asked, device, kept=None, make_model=None, batch=None, model_args=None):
    """train.py's one decision of its precision: (dtype, why, {dtype: seconds timed}). asked: the dtype key; kept: a
    resumed checkpoint's (a resume keeps it: bit-identical); a GPU: the device's rule; a CPU with 'auto': THIS
    model's training step timed (make_model(), on batch() = (x, y); model_cpu_dtype), or make_model None: a DDP
    rank other than 0, whose answer rank 0's replaces."""
    if asked != "auto":
        return asked, "given", {}
    if kept:
        return kept, "the checkpoint's", {}
    if not device.startswith("cpu"):
        return resolve_dtype("auto", device), "the device's", {}
    if make_model is None:
        return "float32", "", {}
    x, y = batch()
    return model_cpu_dtype(make_model(), x, y, model_args)


def resolve_dtype(dtype, device):
    """'auto' -> a concrete dtype name for this device (see the module docstring)."""
    if dtype != "auto":
        return dtype
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if device.startswith("cpu"):
        return auto_cpu_dtype()
    return "float32"
