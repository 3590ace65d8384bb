"""
The lab for attention: which scaled_dot_product_attention backend the model's call gets at a config's attention
shape, and the forward + backward time of every backend this device has (at T = 8,192 attention is about half of
the 440M step's counted FLOPs). A row is printed and appended to the JSON lines as soon as it is measured.

    python lab/sdpa.py config/pretrain.py --json=sdpa.jsonl
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from bench import stop_on_signals, timed, training_config  # noqa: E402
from discoloop.common import DTYPES, ConfigError, die, setup  # noqa: E402
from discoloop.bench_log import RowLog  # noqa: E402
from configurator import INT_GE0, INT_GE1, OUTPUT  # noqa: E402
from discoloop.precision import resolve_dtype  # noqa: E402

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
# substrings of the kernel names each backend launches (torch.profiler), to tell which one the default call picked;
# cuDNN first: its kernels' names contain "flash" too (the H200's first read said flash at cuDNN's time)
KERNEL_NAMES = {"cudnn": ("cudnn",), "efficient": ("fmha_cutlass", "efficient_attention", "mem_efficient"),
                "flash": ("flash",), "math": ("bmm", "softmax")}


def main(argv):
    """python lab/sdpa.py CONFIG [--iters=5] [--warmup=1] [--json=FILE] [--math_max_T=2048]: causal attention at the
    config's micro-batch x n_head x block_size x head dim, in its dtype (forward + backward, median ms, TFLOP/s
    counted as the model counts it: the full T x T, no causal halving), first the default call (the model's), then
    each backend forced alone; the default's backend is read from the kernels it launches (CUDA). math runs only up to
    math_max_T (it materializes the T x T scores)."""
    extra = {"iters": 5, "warmup": 1,  # timed / untimed calls per backend
             "json": "",               # append a JSON line per backend to this file, as it is measured
             "math_max_T": 2048}       # the math backend only at T up to this (its (B, H, T, T) scores)
    c = training_config(argv, "lab/sdpa.py", main.__doc__, extra,
                        {"iters": INT_GE1, "warmup": INT_GE0, "json": OUTPUT, "math_max_T": INT_GE0},
                        need_vocab=False, files=[__file__])
    try:
        device = setup(c["device"], c["threads"])
        if c["n_embd"] % c["n_head"]:
            raise ConfigError(f"n_embd={c['n_embd']} is not a multiple of n_head={c['n_head']}")
    except (ConfigError, ValueError) as e:
        die(e)
    stop_on_signals()
    dtype = resolve_dtype(c["dtype"], device)
    B, H, T, hd = c["batch_size"], c["n_head"], c["block_size"], c["n_embd"] // c["n_head"]
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, hd, device=device, dtype=DTYPES[dtype], requires_grad=True) for _ in range(3))
    g = torch.randn(B, H, T, hd, device=device, dtype=DTYPES[dtype])
    flops = 3 * 4 * B * H * T * T * hd  # forward 2 matmuls of 2 B H T T hd; backward twice that
    log = RowLog(["call", "backend", "ms fwd+bwd", "TFLOP/s", "vs default"], c["json"],
                 {"device": device, "dtype": dtype, "shape": [B, H, T, hd], "torch": torch.__version__})

    def step():
        q.grad = k.grad = v.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)

    ref = None
    for name in ["default"] + list(BACKENDS):
        if name == "math" and T > c["math_max_T"]:
            log.fail(name, f"skipped: T={T} > math_max_T={c['math_max_T']}")
            continue
        try:
            with sdpa_kernel([BACKENDS[name]]) if name != "default" else torch.enable_grad():
                picked = picked_backend(step, device) if name == "default" else name
                timed(step, c["warmup"], device) if c["warmup"] else None
                t = timed(step, c["iters"], device)
        except RuntimeError as e:  # this device or dtype lacks the backend
            log.fail(name, (str(e).strip().splitlines() or ["RuntimeError"])[0][:200])
            continue
        ref = ref or t
        log.add(name, [name, picked, f"{t * 1e3:.2f}", f"{flops / t / 1e12:.3g}", f"{t / ref:.3f}x"],
                {"backend": picked, "ms": t * 1e3, "tflops": flops / t / 1e12, "vs_default": t / ref})
    return log.records


def picked_backend(step, device):
    """The backend the default call runs, from the names of the kernels one call launches ('cpu' off CUDA)."""
    if not device.startswith("cuda"):
        step()
        return "cpu"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    names = " ".join(e.name.lower() for e in prof.events())
    return next((b for b, keys in KERNEL_NAMES.items() if any(s in names for s in keys)), "unknown: " + names[:200])


if __name__ == "__main__":
    main(sys.argv[1:])
