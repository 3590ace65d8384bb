"""
The fused decode of top-k Phi (lab/phi.py's "fused" candidate; only lab/phi.py imports this file, and only when that
kernel runs; an H200 timed it behind auto, so it lives in the lab): the top-k of logits = x @ W^T without ever writing the (rows, V) logits. It runs on CUDA, or on the CPU
under Triton's interpreter (TRITON_INTERPRET=1, tests/test_phi_fused.py); elsewhere importing it is a ValueError,
raised before Triton is imported.

A Triton kernel computes the matmul tile by tile (BM rows x BV vocabulary columns, fp32 accumulation over d) and keeps,
of each bin of BIN columns in a tile, its KEEP largest logits and their columns: V * KEEP / BIN candidates a row. Then,
in torch, an exact top-k over the candidates, and a per-row check: a column that is not a candidate is at most its bin's
KEEP-th kept value, so where every bin's KEEP-th kept value is strictly below the row's k-th selected value, nothing
outside the candidates can enter the top-k and the row is exact (ties at that value aside, as in torch.topk). A row
that fails the check (a bin held KEEP or more of its top-k) is decoded again exactly: F.linear and torch.topk (on the
same numbers: x and W rounded to the decode's dtype, products summed in fp32).

BIN and KEEP, by arithmetic: a given bin of BIN columns holds KEEP of a row's top-k with probability about
C(k, KEEP) (BIN / V)^KEEP, so a row is recomputed with probability about C(k, KEEP) (BIN / V)^(KEEP - 1) (V / BIN
bins). BIN = 128, KEEP = 8 at V = 129,280, k = 128: 1.3e-9 (one row in 11,000 Phi calls of 65,536 rows) and 8,080
candidates a row (V / 16): the exact top-k runs over 16x fewer values, and 0.5 B a vocabulary column is written where
the logits take 2-4 B. KEEP = 6 would save 25% of the candidates and recompute 5e-6 of the rows (0.34 rows a call);
KEEP = 7, 9e-8. The bins are strided: tile t holds the columns t, t + NT, t + 2 NT, ... (NT tiles), so neighbouring
token ids (digits, number tokens: often top-k together) fall in different bins and the arithmetic holds for them too.
"""
import functools
import os

import torch
import torch.nn.functional as F

NEEDS = "phi_kernel='fused' needs CUDA, or Triton's interpreter on the CPU (TRITON_INTERPRET=1)"
if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):  # before Triton is imported
    raise ValueError(NEEDS)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

BIN, KEEP = 128, 8          # columns a bin, candidates kept a bin (the docstring's arithmetic)
TILES = (64, 128, 64)       # BM rows x BV columns a program, BK of d a step (BV a multiple of BIN); not yet tuned


def decode_topm(x_ptr, w_ptr, val_ptr, idx_ptr, M, V, NT, sxm, sxd, swv, swd, D: tl.constexpr, CDT: tl.constexpr,
                ACC: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr,
                BK: tl.constexpr, BIN: tl.constexpr, KEEP: tl.constexpr):
    """Program (i, t): rows i*BM.. x the columns t + j*NT (j < BV) of the logits, in registers; writes the KEEP largest
    of each of its BV // BIN bins (value, column), descending, to val/idx[row, (t * BV // BIN + bin) * KEEP + r]."""
    NB: tl.constexpr = BV // BIN
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    t = tl.program_id(1)
    cols = t + tl.arange(0, BV) * NT
    xp = x_ptr + rows[:, None].to(tl.int64) * sxm  # 64-bit offsets: rows x d or V x d may pass 2^31
    wp = w_ptr + cols[:, None].to(tl.int64) * swv
    acc = tl.zeros((BM, BV), dtype=ACC)
    for d0 in range(0, D, BK):
        ks = d0 + tl.arange(0, BK)
        a = tl.load(xp + ks[None, :] * sxd, mask=(rows[:, None] < M) & (ks[None, :] < D), other=0.0)
        b = tl.load(wp + ks[None, :] * swd, mask=(cols[:, None] < V) & (ks[None, :] < D), other=0.0)
        a, b = a.to(CDT), b.to(CDT)  # cast in registers to the decode's dtype (autocast's bf16): W is never copied
        if UPCAST:  # Triton 3.6's interpreter multiplies bf16 as raw uint16 bits: there, exact fp32 products instead
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=PREC, out_dtype=ACC)
    acc = tl.reshape(tl.where(cols[None, :] < V, acc, float("-inf")), (BM, NB, BIN))
    bins = tl.arange(0, NB)[None, :]
    out = rows[:, None].to(tl.int64) * (NT * NB * KEEP) + (t * NB + bins) * KEEP  # (BM, NB)
    j = tl.arange(0, BIN)[None, None, :]
    for r in tl.static_range(KEEP):  # KEEP rounds of (max, argmax) and mask the winner
        v, at = tl.max(acc, axis=2, return_indices=True)
        tl.store(val_ptr + out + r, v, mask=rows[:, None] < M)
        tl.store(idx_ptr + out + r, t + (bins * BIN + at) * NT, mask=rows[:, None] < M)
        acc = tl.where(j == at[:, :, None], float("-inf"), acc)


@functools.cache
def kernel(interpret):
    """decode_topm as a Triton kernel: triton.jit reads TRITON_INTERPRET when it wraps, so one wrapper per mode (a
    test that sets it gets the interpreter's, whatever was wrapped before)."""
    return triton.jit(decode_topm)


def candidates(x, W, dtype, bin=BIN, keep=KEEP, tiles=TILES):
    """(values, columns), each (rows, NT * BV // bin * keep): every bin's `keep` largest logits of x (rows, d) @ W^T,
    made in `dtype` with fp32 (fp64 for fp64) accumulation."""
    (M, D), V = x.shape, W.size(0)
    BM, BV, BK = tiles
    if BV % bin:
        raise ValueError(f"tiles={tiles} is invalid: BV={BV} must be a multiple of bin={bin}")
    NT = triton.cdiv(V, BV)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    vals = torch.empty(M, NT * BV // bin * keep, dtype=acc, device=x.device)
    cols = torch.empty(vals.shape, dtype=torch.int32, device=x.device)
    tl_dtype = {torch.float64: tl.float64, torch.float32: tl.float32, torch.bfloat16: tl.bfloat16,
                torch.float16: tl.float16}
    # fp32 products as F.linear's (TF32 only where torch allows it); the setting acts on fp32 operands only
    prec = "ieee" if dtype == torch.float64 or (dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32) \
        else "tf32"
    interpret = bool(triton.knobs.runtime.interpret)
    if interpret:  # the interpreter's fp32 -> bf16 cast truncates; torch's rounds to nearest even, as a GPU's does
        x, W = x.to(dtype), W.to(dtype)
    kernel(interpret)[(triton.cdiv(M, BM), NT)](
        x, W, vals, cols, M, V, NT, x.stride(0), x.stride(1), W.stride(0), W.stride(1), D, tl_dtype[dtype],
        tl_dtype[acc], prec, interpret and dtype == torch.bfloat16, BM, BV, BK, bin, keep)
    return vals, cols


def exact_rows(vals, top, keep=KEEP):
    """Rows whose top-k over the candidates is the top-k over V: every bin's smallest kept value (its keep-th) is
    strictly below the row's k-th selected value `top[:, -1]` (a column left out of a bin is at most that value)."""
    return (vals.view(vals.size(0), -1, keep)[..., -1] < top[:, -1:]).all(-1)


def decode_topk(xs, W, k, bin=BIN, keep=KEEP, tiles=TILES):
    """TopkPhi's decode hook: (vals, idx) = torch.topk(xs @ W^T, k) without the (rows, V) logits; the logits are the
    kernel's (x and W rounded to the decode's dtype, autocast's or theirs; products summed in fp32), vals in that dtype
    and idx (..., k) int64, both sorted descending as torch.topk's."""
    if not (xs.is_cuda or triton.knobs.runtime.interpret):
        raise ValueError(f"{NEEDS}: x is on {xs.device}")
    dev = xs.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else torch.promote_types(xs.dtype, W.dtype)
    x = xs.reshape(-1, xs.size(-1))
    if triton.cdiv(W.size(0), tiles[1]) * tiles[1] // bin * keep < k:  # fewer candidates than k: all rows exactly
        top, idx = exact_topk(x, W, k, dtype)
    else:
        cand, cols = candidates(x, W, dtype, bin, keep, tiles)
        top, j = cand.topk(k)
        idx = cols.gather(1, j).long()
        bad = ~exact_rows(cand, top, keep)
        if bad.any():  # a host sync, once per chunk: the exact decode of the rows a bin could hide a top-k value in
            rows = bad.nonzero().squeeze(1)
            top[rows], idx[rows] = exact_topk(x[rows], W, k, dtype)
    return top.to(dtype).view(*xs.shape[:-1], k), idx.view(*xs.shape[:-1], k)


def exact_topk(x, W, k, dtype):
    """torch.topk of the logits as the kernel makes them (x and W rounded to dtype, products summed in fp32 or fp64,
    no rounding of the sums to dtype): the exact decode of the rows the check sends back, consistent with the rest."""
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    with torch.autocast(x.device.type, enabled=False):
        return F.linear(x.to(dtype).to(acc), W.to(dtype).to(acc)).topk(k)


def bin_of(V, bin=BIN, tiles=TILES):
    """The bin of each of the V columns, as the kernel lays them out (tests build rows whose top-k shares one bin)."""
    NT, c = triton.cdiv(V, tiles[1]), torch.arange(V)
    return (c % NT) * (tiles[1] // bin) + (c // NT) // bin
