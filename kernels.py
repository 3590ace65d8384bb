"""
The two kernels behind model.py, each an autograd Function that keeps what a 440M, 8,192-token step
cannot afford to keep (model.py reads as the paper; this file is how it fits in memory):

  TopkPhi            top-k Phi (Appendix B) whose backward touches only the k selected logits
  PHI_KERNELS        it and the variants a measurement promoted (a compiled region); candidates: lab/phi.py
  LinearCrossEntropy the head + cross-entropy, chunked, with no (B, T, V) logits (Liger-Kernel's idea)

TopkPhi calls private aten embedding_bag kernels directly, so torch.compile traces it without graph breaks.
"""
import functools
import warnings

import torch
import torch.nn.functional as F


def upcast(x):
    """At least float32 (bf16/fp16 -> fp32), never lower (fp64 stays fp64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class TopkPhi(torch.autograd.Function):
    """Phi_k(x) = sum_j p[n, j] W[idx[n, j]], p = softmax(top-k logits / tau) (Appendix B), with a backward that never
    touches the V - k unselected logits. Forward decodes `chunk` positions at a time without autograd (the
    (B, chunk, V) logits are transient) and keeps only idx and p, (B, T, k). Backward, with g = dL/dPhi:
    dp = <g, W[idx]>, dlogit = p * (dp - <p, dp>) / tau on the k selected logits (top-k passes no gradient to the
    rest), dx = sum_j dlogit W[idx], and the embedding gradient dW[idx[n, j]] += dlogit[n, j] x[n] + p[n, j] g[n] --
    all embedding_bag kernels, O(N k d) instead of the dense O(N V d) logits backward. Both terms of dW go into ONE
    (V, d) buffer per call, however many chunks: allocating and adding V x d gradients is what a small step pays most
    for (bench.py). Hooks, None = the above: `select(logits, k)` (the top-k), `decode(xs, W, k)` (logits and top-k in
    one: lab/phi_triton.py), `grads(x, W, idx, p, dlogit, g, chunk, mm_dtype, need)` (dx, dW); lab/phi.py tries others."""

    @staticmethod
    def forward(ctx, x, W, k, tau, chunk, select=None, grads=None, decode=None):
        idx, p = [], []
        for xs in x.split(chunk, dim=1):  # top-k commutes with the positive 1/tau scale
            vals, i = decode(xs, W, k) if decode else (select or sorted_topk)(F.linear(xs, W), k)
            idx.append(i)
            p.append(F.softmax(upcast(vals) / tau, dim=-1))
        idx, p = torch.cat(idx, dim=1), torch.cat(p, dim=1)
        e = F.embedding_bag(idx.flatten(0, 1), W, per_sample_weights=p.flatten(0, 1).to(W.dtype), mode="sum")
        ctx.save_for_backward(x, W, idx, p)
        ctx.tau, ctx.chunk, ctx.grads, ctx.mm_dtype = tau, chunk, grads, vals.dtype  # vals: the decode's (autocast) dtype
        return e.view(*x.shape[:2], -1)

    @staticmethod
    def backward(ctx, g):
        x, W, idx, p = ctx.saved_tensors
        k, d = idx.size(-1), W.size(1)
        g = g.to(W.dtype)
        # embedding_bag's own backward kernel, called directly (no autograd.grad: torch.compile traces it)
        flat, offsets, offset2bag = bag_layout(idx.reshape(-1, k))
        dp = torch.ops.aten._embedding_bag_per_sample_weights_backward(g.reshape(-1, d), W, flat, offsets, offset2bag, 0)
        dp = dp.view_as(p).to(p.dtype)  # dp = <g, W[idx]>
        dlogit = p * (dp - (p * dp).sum(-1, keepdim=True)) / ctx.tau
        need = ctx.needs_input_grad[:2]
        if ctx.grads:
            gx, gW = ctx.grads(x, W, idx, p, dlogit, g, ctx.chunk, ctx.mm_dtype, need)
        else:
            gx = bag_dx(x, W, idx, dlogit) if need[0] else None
            gW = bag_dW(x, W, idx, p, dlogit, g) if need[1] else None
        return gx, gW, None, None, None, None, None, None


def bag_dx(x, W, idx, dlogit):
    """dx = sum_j dlogit[n, j] W[idx[n, j]]: a gather (embedding_bag), no scatter."""
    k = idx.size(-1)
    e = F.embedding_bag(idx.reshape(-1, k), W, per_sample_weights=dlogit.reshape(-1, k).to(W.dtype), mode="sum")
    return e.view(x.shape).to(x.dtype)


def bag_dW(x, W, idx, p, dlogit, g):
    """dW[idx[n, j]] += dlogit[n, j] x[n] + p[n, j] g[n]: both terms as 2N bags into one (V, d) buffer
    (embedding_bag's dense backward: a scatter-add)."""
    k, d = idx.size(-1), W.size(1)
    idx, p, dlogit = idx.reshape(-1, k), p.reshape(-1, k), dlogit.reshape(-1, k)
    flat2, _, offset2bag2 = bag_layout(torch.cat([idx, idx]))
    n2 = 2 * idx.size(0)
    return torch.ops.aten._embedding_bag_dense_backward(
        torch.cat([x.reshape(-1, d).to(W.dtype), g.reshape(-1, d)]), flat2, offset2bag2,
        torch.full((n2,), k, dtype=torch.long, device=idx.device), torch.zeros(n2, dtype=torch.long, device=idx.device),
        W.size(0), False, 0, torch.cat([dlogit, p]).flatten().to(W.dtype))


def sorted_topk(logits, k):
    """torch.topk: the k largest logits, in descending order (the default selection)."""
    return logits.topk(k, dim=-1)


@functools.cache
def compiled_bag(backend="inductor"):
    # built on first use: torch.compile imports dynamo (about 1.5 s), which `import kernels` must not pay
    return torch.compile(TopkPhi.apply, backend=backend)


def compiled_phi(x, W, k, tau, chunk):
    """The default kernel as its own torch.compile region: the top-k and the embedding_bag kernels stay ATen's, the
    softmax and the elementwise backward fuse. It compiles once per shape (seconds on a CPU)."""
    return compiled_bag()(x, W, k, tau, chunk)


def csr_grads(x, W, idx, p, dlogit, g, chunk, mm_dtype, need):
    """dx as bag (a gather); dW = S_dlogit @ x + S_p @ g with S the (V, N) sparse matrices of the selections in CSR
    form: the flat indices sorted once, each vocabulary row reduces its own segment (no atomics, no (V, d) bags)."""
    (V, d), k = W.shape, idx.size(-1)
    flat = idx.reshape(-1)
    order = flat.argsort(stable=True)  # stable: the rows within a segment stay ascending (CSR's column order)
    crow = F.pad(torch.bincount(flat, minlength=V).cumsum(0), (1, 0))

    def spmm(vals, dense):
        S = torch.sparse_csr_tensor(crow, order // k, vals.reshape(-1)[order].to(W.dtype), (V, flat.numel() // k),
                                    check_invariants=False)
        return S @ dense.reshape(-1, d).to(W.dtype)
    with warnings.catch_warnings():  # "sparse CSR support is in beta": once per process, not the user's concern
        warnings.simplefilter("ignore", UserWarning)
        gW = spmm(dlogit, x) + spmm(p, g) if need[1] else None
    return (bag_dx(x, W, idx, dlogit) if need[0] else None), gW


# name -> kernel(x, W, k, tau, chunk), each equal to TopkPhi in float64 (tests/test_phi.py): the default and the
# variants a measurement promoted. "csr": 0.78x bag's time and a quarter
# of its peak on an H200 at 440M (RESULTS.md), 1.06x on a CPU: "auto" is csr on CUDA, bag elsewhere. Lab: lab/phi.py.
PHI_KERNELS = {
    "auto": lambda x, W, k, tau, chunk: TopkPhi.apply(x, W, k, tau, chunk, None, csr_grads if x.is_cuda else None),
    "bag": TopkPhi.apply,
    "csr": lambda x, W, k, tau, chunk: TopkPhi.apply(x, W, k, tau, chunk, None, csr_grads),
    "compiled": compiled_phi,
}


def topk_phi(x, W, k, tau, chunk, kernel="auto"):
    """TopkPhi.apply(x, W, k, tau, chunk) with the named kernel of PHI_KERNELS."""
    if kernel not in PHI_KERNELS:
        raise ValueError(f"kernel={kernel!r} is invalid: allowed one of {tuple(PHI_KERNELS)}")
    return PHI_KERNELS[kernel](x, W, k, tau, chunk)


def bag_layout(idx):
    """(M, k) indices as embedding_bag's flat form: indices, bag offsets, bag of each index."""
    M, k = idx.shape
    return idx.flatten(), torch.arange(M, device=idx.device) * k, torch.arange(M * k, device=idx.device) // k


class LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of the head logits x @ W^T (x: (N, d) normed states, targets: (N,), -1 = no
    target), `chunk` rows at a time, so no more than (chunk, V) logits ever exist. As in Liger-Kernel's
    fused linear cross-entropy, the gradients are made in forward, chunk by chunk (softmax minus the
    smoothed one-hot), and backward only scales them: nothing of size N x V is kept and the head
    matmul is not run again. Kept for backward: dx (N, d) and one fp32 (V, d) dW."""

    @staticmethod
    def forward(ctx, x, W, targets, chunk, smoothing, need_grad):
        valid = targets != -1
        acc = upcast(x).dtype  # fp32, or fp64 for an fp64 model
        n = valid.sum().clamp(min=1).to(acc)  # a tensor: no host sync, compile-friendly
        total = torch.zeros((), device=x.device, dtype=acc)
        gx = torch.empty_like(x) if need_grad else None
        gW = torch.zeros(W.shape, device=W.device, dtype=upcast(W).dtype) if need_grad else None
        for s in range(0, x.size(0), chunk):
            xs, ts, vs = x[s:s + chunk], targets[s:s + chunk].clamp(min=0), valid[s:s + chunk]
            logits = upcast(F.linear(xs, W))  # (c, V) in fp32 (the matmul in the autocast dtype)
            lse = logits.logsumexp(-1)
            nll = lse - logits.gather(1, ts[:, None]).squeeze(1)
            if smoothing:  # PyTorch's label smoothing: (1 - e) * nll + e * mean_v(-log p_v)
                nll = (1 - smoothing) * nll + smoothing * (lse - logits.mean(-1))
            total = total + (nll * vs).sum()
            if need_grad:
                g = logits.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
                g.scatter_add_(1, ts[:, None], torch.full_like(ts[:, None], smoothing - 1, dtype=g.dtype))
                if smoothing:
                    g.sub_(smoothing / W.size(0))
                g.mul_((vs / n)[:, None])  # (c, V): d mean-loss / d logits, 0 on rows without a target
                if not torch.is_autocast_enabled(x.device.type):
                    g = g.to(W.dtype)  # under autocast the matmuls below cast (to bf16) themselves
                gx[s:s + chunk] = (g @ W).to(x.dtype)  # (c, d)
                gW.add_(g.t() @ xs)                     # (V, d)
        if need_grad:
            ctx.save_for_backward(gx, gW)
            ctx.w_dtype = W.dtype
        return total / n

    @staticmethod
    def backward(ctx, grad):
        gx, gW = ctx.saved_tensors
        return gx * grad.to(gx.dtype), (gW * grad).to(ctx.w_dtype), None, None, None, None


def linear_cross_entropy(x, W, targets, chunk=0, smoothing=0.0):
    """F.cross_entropy(x @ W.T, targets, ignore_index=-1, label_smoothing=smoothing), chunked."""
    x, targets = x.reshape(-1, x.size(-1)), targets.reshape(-1)
    need = torch.is_grad_enabled() and (x.requires_grad or W.requires_grad)
    return LinearCrossEntropy.apply(x, W, targets, chunk or x.size(0), float(smoothing), need)
