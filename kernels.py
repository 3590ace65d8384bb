"""
The two kernels behind model.py, each an autograd Function that keeps what a 440M, 8,192-token step
cannot afford to keep (model.py reads as the paper; this file is how it fits in memory):

  TopkPhi            top-k Phi (Appendix B) whose backward touches only the k selected logits
  LinearCrossEntropy the head + cross-entropy, chunked, with no (B, T, V) logits (Liger-Kernel's idea)

Both use private aten embedding_bag kernels directly, so torch.compile traces them without graph breaks.
"""
import torch
import torch.nn.functional as F


def upcast(x):
    """At least float32 (bf16/fp16 -> fp32), never lower (fp64 stays fp64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class TopkPhi(torch.autograd.Function):
    """Phi_k(x) = sum_j p[n, j] W[idx[n, j]], p = softmax(top-k logits / tau) (Appendix B), with a
    backward that never touches the V - k unselected logits. Forward decodes `chunk` positions at a
    time without autograd (the (B, chunk, V) logits are transient) and keeps only idx and p, (B, T, k).
    Backward, with g = dL/dPhi: dp = <g, W[idx]>, dlogit = p * (dp - <p, dp>) / tau on the k selected
    logits (top-k passes no gradient to the rest), dx = sum_j dlogit W[idx], and the embedding gradient
    dW[idx[n, j]] += dlogit[n, j] x[n] + p[n, j] g[n] -- all embedding_bag kernels, O(N k d) instead of the
    dense O(N V d) logits backward. Both terms of dW go into ONE (V, d) buffer per call, however many
    chunks: allocating and adding V x d gradients is what a small step pays most for (bench.py)."""

    @staticmethod
    def forward(ctx, x, W, k, tau, chunk):
        idx, p = [], []
        for xs in x.split(chunk, dim=1):
            vals, i = F.linear(xs, W).topk(k, dim=-1)  # top-k commutes with the positive 1/tau scale
            idx.append(i)
            p.append(F.softmax(upcast(vals) / tau, dim=-1))
        idx, p = torch.cat(idx, dim=1), torch.cat(p, dim=1)
        e = F.embedding_bag(idx.flatten(0, 1), W, per_sample_weights=p.flatten(0, 1).to(W.dtype), mode="sum")
        ctx.save_for_backward(x, W, idx, p)
        ctx.tau = tau
        return e.view(*x.shape[:2], -1)

    @staticmethod
    def backward(ctx, g):
        x, W, idx, p = ctx.saved_tensors
        k, d = idx.size(-1), W.size(1)
        idx, p = idx.reshape(-1, k), p.reshape(-1, k)
        g, xf = g.reshape(-1, d).to(W.dtype), x.reshape(-1, d).to(W.dtype)
        # embedding_bag's own backward kernels, called directly (no autograd.grad: torch.compile traces them)
        flat, offsets, offset2bag = bag_layout(idx)
        dp = torch.ops.aten._embedding_bag_per_sample_weights_backward(g, W, flat, offsets, offset2bag, 0)
        dp = dp.view_as(p).to(p.dtype)  # dp = <g, W[idx]>
        dlogit = p * (dp - (p * dp).sum(-1, keepdim=True)) / ctx.tau
        gx = gW = None
        if ctx.needs_input_grad[0]:
            gx = F.embedding_bag(idx, W, per_sample_weights=dlogit.to(W.dtype), mode="sum").view(x.shape).to(x.dtype)
        if ctx.needs_input_grad[1]:  # both terms of dW as 2N bags into one (V, d) buffer
            flat2, _, offset2bag2 = bag_layout(torch.cat([idx, idx]))
            n2 = 2 * idx.size(0)
            gW = torch.ops.aten._embedding_bag_dense_backward(
                torch.cat([xf, g]), flat2, offset2bag2, torch.full((n2,), k, dtype=torch.long, device=idx.device),
                torch.zeros(n2, dtype=torch.long, device=idx.device), W.size(0), False, 0,
                torch.cat([dlogit, p]).flatten().to(W.dtype))
        return gx, gW, None, None, None


def bag_layout(idx):
    """(M, k) indices as embedding_bag's flat form: indices, bag offsets, bag of each index."""
    M, k = idx.shape
    offsets = torch.arange(M, device=idx.device) * k
    offset2bag = torch.arange(M * k, device=idx.device) // k
    return idx.flatten(), offsets, offset2bag


class LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of the head logits x @ W^T (x: (N, d) normed states, targets: (N,), -1 = no
    target), `chunk` rows at a time, so no more than (chunk, V) logits ever exist. As in Liger-Kernel's
    fused linear cross-entropy, the gradients are made in forward, chunk by chunk (softmax minus the
    smoothed one-hot), and backward only scales them: nothing of size N x V is kept and the head
    matmul is not run again. Kept for backward: dx (N, d) and one fp32 (V, d) dW."""

    @staticmethod
    def forward(ctx, x, W, targets, chunk, smoothing, need_grad):
        V = W.size(0)
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
                    g.sub_(smoothing / V)
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
