"""
The lab for top-k Phi kernels: candidates that are not core code until a device's measurement promotes them
(kernels.PHI_KERNELS holds the default "bag" and the variants already promoted; nothing in training imports this
file). Each candidate computes TopkPhi's Phi, dx and dW (float64: tests/test_phi.py); which is fastest is a device's
answer, so this script times them all at a training config's shape:

    python lab/phi.py config/pretrain.py --compile=True --json=phi.json     # the 440M shape: bag, compiled, candidates

Candidates: unsorted or two-stage top-k (no sort of the winners; many short selections instead of one over V), a
dense-matmul (tensor cores) gradient, and their combinations with the core's CSR gradient (promoted: RESULTS.md). Promote one
by moving it into kernels.py and its name into PHI_KERNELS, in one change. "fused" (phi_triton.py: a Triton decode that
never writes the logits) is timed where it runs: on CUDA, or on the CPU under TRITON_INTERPRET=1 (slow). An H200 at the
440M shape (65,536 rows, V 129,280, bf16, top-128) measured it at 7.27x the matmul floor against auto's 5.71x: a
candidate, not core code (a checkpoint that names it reads as auto, compat.RETIRED).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench import PHASE, round_robin, stop_on_signals, timed, training_config  # noqa: E402
from discoloop.common import ConfigError, autocast, die, setup  # noqa: E402
from discoloop.bench_log import RowLog  # noqa: E402
from configurator import INT_GE0, INT_GE1  # noqa: E402
from kernels import PHI_KERNELS, TopkPhi, csr_grads, sorted_topk, upcast  # noqa: E402
from discoloop.precision import resolve_dtype  # noqa: E402


def unsorted_topk(logits, k):
    """The k largest logits in no particular order: the softmax and the sums over them do not need it, and the
    GPU then skips sorting the winners."""
    return logits.topk(k, dim=-1, sorted=False)


TWOSTAGE_BLOCK = 4096  # vocabulary entries per block of the two-stage top-k


def twostage_topk(logits, k, block=TWOSTAGE_BLOCK):
    """Exact top-k in two rounds: the top-k within each block of `block` vocabulary entries (a last, shorter block
    takes the rest), then the top-k of those winners. Each of the global top-k is in its own block's top-k, so the
    union holds them all; many short selections replace one over V, which a GPU runs as a multi-pass radix select."""
    V = logits.size(-1)
    nb = V // block
    if nb < 2 or k >= block:  # nothing to prune
        return unsorted_topk(logits, k)
    vals, idx = logits[..., :nb * block].unflatten(-1, (nb, block)).topk(k, dim=-1, sorted=False)
    idx = idx + torch.arange(0, nb * block, block, device=logits.device)[:, None]
    vals, idx = [vals.flatten(-2)], [idx.flatten(-2)]
    if V > nb * block:
        tv, ti = logits[..., nb * block:].topk(min(k, V - nb * block), dim=-1, sorted=False)
        vals.append(tv), idx.append(ti + nb * block)
    vals, j = torch.cat(vals, -1).topk(k, dim=-1, sorted=False)
    return vals, torch.cat(idx, -1).gather(-1, j)


def dense_grads(x, W, idx, p, dlogit, g, chunk, mm_dtype, need):
    """dx = G @ W and dW = G^T x + P^T g, with G and P the (rows, V) matrices holding dlogit and p at idx (zeros
    elsewhere), `chunk` positions at a time: dense matmuls in the decode's dtype (tensor cores under autocast)
    instead of gathers and scatter-adds, at the memory of one (2 B chunk, V) buffer. dW accumulates in fp32+."""
    (V, d), k = W.shape, idx.size(-1)
    Wm = W.to(mm_dtype)
    gx = torch.empty_like(x) if need[0] else None
    gW = torch.zeros(W.shape, dtype=upcast(W).dtype, device=W.device) if need[1] else None
    for s in range(0, x.size(1), chunk):
        i = idx[:, s:s + chunk].reshape(-1, k)
        rows = i.size(0)
        GP = torch.zeros(2 * rows, V, dtype=mm_dtype, device=W.device)  # [G; P]
        GP[:rows].scatter_(1, i, dlogit[:, s:s + chunk].reshape(-1, k).to(mm_dtype))
        GP[rows:].scatter_(1, i, p[:, s:s + chunk].reshape(-1, k).to(mm_dtype))
        if gx is not None:
            gx[:, s:s + chunk] = (GP[:rows] @ Wm).view_as(gx[:, s:s + chunk])
        if gW is not None:
            xg = torch.cat([x[:, s:s + chunk].reshape(-1, d), g[:, s:s + chunk].reshape(-1, d)]).to(mm_dtype)
            gW += GP.t() @ xg
    return gx, (gW.to(W.dtype) if gW is not None else None)


def phi_variant(select=None, grads=None):
    """A candidate kernel(x, W, k, tau, chunk): TopkPhi with this top-k selection and this gradient."""
    def phi(x, W, k, tau, chunk):
        return TopkPhi.apply(x, W, k, tau, chunk, select, grads)
    return phi


def fused_phi(x, W, k, tau, chunk):
    """auto's Phi with phi_triton.py's decode (Triton, no (rows, V) logits)."""
    from lab import phi_triton  # here, not at the top: importing it needs CUDA or TRITON_INTERPRET=1 (Triton)
    return TopkPhi.apply(x, W, k, tau, chunk, None, csr_grads if x.is_cuda else None, phi_triton.decode_topk)


SELECT = {"": sorted_topk, "unsorted": unsorted_topk, "twostage": twostage_topk}
GRADS = {"": None, "csr": csr_grads, "dense": dense_grads}
# name -> kernel: the core's (PHI_KERNELS) first, then every candidate combination of a selection and a gradient
CANDIDATES = {**PHI_KERNELS, **{"+".join(filter(None, (s, g))): phi_variant(SELECT[s], GRADS[g])
                                for s in SELECT for g in GRADS if (s or g) and "+".join(filter(None, (s, g))) not in PHI_KERNELS},
              "fused": fused_phi}


# ---------------------------------------------------------------------------------------------------------------
# the measurement: each kernel timed and written the moment it is measured (a device check killed by its own time
# limit keeps every row it finished)

def main(argv):
    """python lab/phi.py CONFIG [--rows=N] [--kernels=bag,dense] [--iters=5] [--warmup=2] [--json=FILE]: every Phi
    kernel (kernels.PHI_KERNELS and the lab's candidates), forward + backward, at a training config's shape
    (batch_size x block_size rows, n_embd, vocab_size, phi_topk, phi_tau, phi_chunk positions of every sequence at a
    time, dtype), against the decode matmul alone (the floor: F.linear(x, W) chunk by chunk, forward only), with each
    kernel's largest difference from "bag" (the default) in the run's dtype: rounding, and ties at the k-th logit
    broken differently (bf16 logits tie often; "fused" selects on the fp32 sums, before their rounding to bf16).
    "compiled" is timed where compile=True or kernels names it, "fused" on CUDA or under TRITON_INTERPRET=1 (Triton's
    interpreter) or where kernels names it. Each row is printed and written to the JSON as soon as it is measured."""
    c, names, device = phi_config(argv)
    stop_on_signals()
    dtype = resolve_dtype(c["dtype"], device)
    ctx, (x, W, g, chunk), k, tau = autocast(device, dtype), phi_inputs(c, device), c["phi_topk"], c["phi_tau"]
    cuda = device.startswith("cuda")
    shape = {"rows": x.size(1), "n_embd": W.size(1), "vocab_size": W.size(0), "k": k, "tau": tau, "chunk_rows": chunk}
    print(f"device {device}, dtype {dtype}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"shape: rows={x.size(1)} d={W.size(1)} V={W.size(0)} k={k} tau={tau} chunk={chunk} rows\n")
    log = RowLog(["kernel", "ms", "vs floor", "vs bag", "max |diff| Phi", "max |diff| dx", "max |diff| dW"]
                 + (["CUDA peak (MB)"] if cuda else []), c["json"],
                 {"device": device, "device_name": torch.cuda.get_device_name() if cuda else "cpu",
                  "torch": torch.__version__, "dtype": dtype, "shape": shape})
    floors = {"matmul fwd (floor)": matmul_step(x, W, chunk, ctx, False),
              "matmul fwd+bwd (3 matmuls)": matmul_step(x, W, chunk, ctx, True)}
    floor_s = round_robin(floors, c["iters"], c["warmup"], device)
    for name, t in floor_s.items():
        write_row(log, name, t, floor_s["matmul fwd (floor)"], None, {}, cuda)
    ref, bag_s = None, None
    for name in names:  # bag first (phi_config)
        PHASE[0] = f"kernel {name}"
        step, d, ref = phi_check(name, x, W, g, k, tau, chunk, ctx, cuda, ref, log)
        if step is None:
            continue
        timed(step, c["warmup"], device) if c["warmup"] else None
        t = timed(step, c["iters"], device)
        bag_s = bag_s or t
        write_row(log, name, t, floor_s["matmul fwd (floor)"], bag_s, d, cuda)
    return log.records


def write_row(log, name, t, floor, bag, d, cuda):
    fmt = lambda v, f: "-" if v is None else format(v, f)
    rec = {"ms": t * 1e3, "vs_floor": t / floor, "vs_bag": t / bag if bag else None, "diff": d.get("diff"),
           "peak_MB": d.get("peak_MB")}
    log.add(name, [name, f"{t * 1e3:.2f}", f"{t / floor:.2f}x", fmt(rec["vs_bag"], ".3f") + ("x" if bag else "")]
            + [fmt(v, ".2e") for v in (rec["diff"] or [None] * 3)] + ([fmt(rec["peak_MB"], ".0f")] if cuda else []), rec)


def phi_config(argv):
    """The lab's keys, checked before any work: (config, kernel names, device); one line and exit 2 if bad."""
    extra = {"rows": 0,       # rows (positions) Phi is timed on; 0 = batch_size x block_size
             "kernels": "",   # comma list of kernels to time, including bag ('' = all; compiled only with compile=True)
             "iters": 5,      # timed calls per kernel
             "warmup": 2,     # untimed calls per kernel first
             "json": ""}      # also write the results to this JSON file, a row at a time
    c = training_config(argv, "lab/phi.py", main.__doc__, extra, {"rows": INT_GE0, "iters": INT_GE1, "warmup": INT_GE0},
                        files=[__file__])
    try:
        if not c["phi_topk"]:
            raise ConfigError(f"phi_topk=0 is invalid: lab/phi.py times top-k Phi, allowed 1..vocab_size={c['vocab_size']}")
        device = setup(c["device"], c["threads"])
        fused = device.startswith("cuda") or os.environ.get("TRITON_INTERPRET") == "1"  # where Triton runs it
        names = c["kernels"].split(",") if c["kernels"] else [n for n in CANDIDATES if (c["compile"] or n != "compiled")
                                                               and (fused or n != "fused")]
        if not set(names) <= set(CANDIDATES) or "bag" not in names:
            raise ConfigError(f"kernels={c['kernels']!r} is invalid: allowed a comma list of {tuple(CANDIDATES)} "
                              "including bag (the reference), or '' for all")
        return c, ["bag"] + [n for n in dict.fromkeys(names) if n != "bag"], device
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


def phi_check(name, x, W, g, k, tau, chunk, ctx, cuda, ref, log):
    """A kernel's first call (it compiles, if it does), untimed: (its step, {largest absolute differences of (Phi,
    dx, dW) from bag's, and on CUDA its peak above what was allocated before it}, bag's outputs); a kernel that fails
    (out of memory, an op this device lacks, "fused" named on a CPU) is recorded as failed and gives step None."""
    step = phi_step(CANDIDATES[name], x, W, g, k, tau, chunk, ctx)
    x.grad = W.grad = None  # the previous kernel's gradients are not this one's peak
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else 0
    try:
        out = step()
    except (RuntimeError, NotImplementedError, ValueError) as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        log.fail(name, why)
        return None, None, ref
    if name == "bag":
        ref = [t.clone() for t in out]
    return step, {"diff": [(a.float() - b.float()).abs().max().item() for a, b in zip(out, ref)],
                  "peak_MB": (torch.cuda.max_memory_allocated() - before) / 2**20 if cuda else None}, ref


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


if __name__ == "__main__":
    main(sys.argv[1:])
