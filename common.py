"""
Device and precision, one rule for every script (train.py, bench.py, eval_harness.py, probe.py).

device="auto": CUDA if present, else MPS, else CPU.
dtype="auto":  bf16 on a GPU that has it (fp16 otherwise); on a CPU, fp32 unless bf16 autocast is
measured to be clearly faster. CPUs differ wildly: bf16 was 2x faster than fp32 on one AMD EPYC,
2.5x slower on a Xeon with the same avx512_bf16 flag, and 100x slower on a CPU without AVX-512.
So a CPU with a bf16 flag times one tiny MLP forward + backward in each precision (fp32 first, and
bf16 only once if it is already slower); a CPU without one is fp32 without timing.
"""
import contextlib
import functools
import os
import signal
import threading
import time

import torch
import torch.nn.functional as F

from datafolder import DataError  # noqa: F401  (re-exported: every script imports it from here)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def table(header, rows):
    """A markdown table (every script prints its results this way); floats get 4 significant digits (0.9985 must not print as 0.999)."""
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def setup(device, threads=0):
    """Thread count, then the resolved device (ValueError with one line for a bad one)."""
    if threads:
        torch.set_num_threads(threads)
    return resolve_device(device)


def resolve_device(device):
    """'auto' -> cuda, mps or cpu; anything else is checked (ValueError with one line)."""
    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if torch.backends.mps.is_available() else "cpu"
    if not (device in ("cpu", "cuda", "mps") or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ValueError(f"device={device!r} is invalid: allowed 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available here: use device='cpu'")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device='mps' but MPS is not available here: use device='cpu'")
    return device


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
    """A timer(dtype, reps) for pick_cpu_dtype: best-of-reps seconds of one forward + backward of the configured
    `model` on (x, y) under CPU autocast to dtype, after one untimed call (a first call packs weights and builds
    kernels: timing it made a cold bf16 lose to a warm fp32). The RNG state and gradients are put back, so
    the run is the same whatever is timed; `timer.seconds` keeps every figure for config.json."""
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


@functools.lru_cache(maxsize=None)
def auto_cpu_dtype():
    return pick_cpu_dtype(cpu_has_bf16_flag())


def resolve_dtype(dtype, device):
    """'auto' -> a concrete dtype name for this device (see the module docstring)."""
    if dtype != "auto":
        return dtype
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if device.startswith("cpu"):
        return auto_cpu_dtype()
    return "float32"


def autocast(device, dtype):
    """Autocast context for a resolved dtype name; a no-op for float32."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=DTYPES[dtype])


# Under DDP a signal reaches the ranks at different moments: they agree on stopping, early stopping and joins
# through a small CPU (gloo) process group, so no rank leaves while another waits in a collective.
def rank0_decides(value, group):
    """Rank 0's integer, on every rank (group None: no DDP, the value itself)."""
    t = torch.tensor([int(value)])
    if group is not None:
        torch.distributed.broadcast(t, src=0, group=group)
    return t.item()


def any_rank(flag, group):
    """True on every rank when it is true on any: a signal that reached one rank stops them all together."""
    t = torch.tensor([int(flag)])
    if group is not None:
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=group)
    return bool(t.item())


def stop_on_signals():
    """An Event that SIGTERM / Ctrl-C set (finish the step or abandon an evaluation, save, exit 0); a second
    signal exits at once, leaving the last checkpoint on disk intact."""
    stop = threading.Event()

    def request_stop(signum, frame):
        if stop.is_set():
            os.write(2, f"error: second {signal.Signals(signum).name}: exiting at once without saving; the last "
                        f"checkpoint on disk is intact\n".encode())
            os._exit(130)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return stop
