"""The fused Phi forward (lab/phi_triton.py, lab/phi.py's "fused" candidate) runs its own Triton kernel here, on the CPU,
under Triton's interpreter: each bin's candidates are its largest logits, the top-k over them equals torch.topk's, the
rows a bin could hide a top-k value in are found and decoded again, and Phi, dx and dW equal the float64 reference (to
1e-12 of their scale in fp64, 1e-6 in fp32, 2e-2 in bf16). TRITON_INTERPRET is set per test (monkeypatch: it is gone
after the test, so no other test of the xdist worker sees it); phi_triton wraps its kernel once per mode, so the
interpreter's wrapper is the one these tests run whatever was imported before."""
import importlib.util
import os
import subprocess
import sys
from functools import partial

import pytest
import torch

import kernels
from conftest import REPO
from lab.phi import CANDIDATES
from test_phi import reference

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="triton is not installed: these tests run the kernel under its interpreter")
# (rows, d, V, k, bin, keep, tiles): the module's defaults with V not a multiple of BV; many small bins (rows are
# decoded again); rows not a multiple of BM, d not a multiple of BK, two bins a tile
CASES = [(64, 32, 700, 16, 128, 8, (64, 128, 64)), (64, 32, 1000, 8, 16, 2, (32, 64, 16)),
         (50, 24, 1500, 12, 64, 4, (64, 256, 32))]


@pytest.fixture
def P(monkeypatch):
    """phi_triton under Triton's interpreter, for this test only."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from lab import phi_triton  # after the variable: its gate and its kernel's wrapper read it
    return phi_triton


def as_sets(idx):
    return [set(r.tolist()) for r in idx.reshape(-1, idx.size(-1))]


@needs_triton
@pytest.mark.parametrize("M,d,V,k,bin,keep,tiles", CASES)
def test_candidates_are_each_bins_largest_and_the_top_k_is_topk(P, M, d, V, k, bin, keep, tiles):
    gen = torch.Generator().manual_seed(V)
    x, W = torch.randn(M, d, generator=gen), torch.randn(V, d, generator=gen)
    logits = x @ W.t()
    cand, cols = P.candidates(x, W, torch.float32, bin, keep, tiles)
    bins = P.bin_of(V, bin, tiles)
    assert cand.size(1) == (bins.max() + 1) * keep
    for b, (cv, cc) in enumerate(zip(cand.view(M, -1, keep).unbind(1), cols.view(M, -1, keep).unbind(1))):
        mine = logits[:, bins == b]
        want = mine.topk(min(keep, mine.size(1))).values
        torch.testing.assert_close(cv[:, :want.size(1)], want, rtol=1e-5, atol=1e-5)  # descending, as topk
        assert (cv[:, want.size(1):] == float("-inf")).all()  # a bin with fewer columns than keep
        real = cc[:, :want.size(1)].long()
        assert (bins[real] == b).all()
        torch.testing.assert_close(logits.gather(1, real), cv[:, :want.size(1)], rtol=1e-5, atol=1e-5)
    vals, idx = P.decode_topk(x, W, k, bin, keep, tiles)
    ref = logits.topk(k)
    assert idx.dtype == torch.int64 and as_sets(idx) == as_sets(ref.indices)
    torch.testing.assert_close(vals, ref.values, rtol=1e-5, atol=1e-5)


@needs_triton
def test_rows_a_bin_could_hide_a_top_k_value_in_are_decoded_again(P):
    """The first 32 rows point along u, and so do bin 0's columns: their top-8 lies in bin 0, which keeps only 3, so the
    top-8 of the candidates is wrong there; the check must send exactly these rows to the exact decode."""
    M, d, V, k, bin, keep, tiles = 64, 32, 1000, 8, 16, 3, (32, 64, 16)
    gen = torch.Generator().manual_seed(3)
    x, W = torch.randn(M, d, generator=gen), torch.randn(V, d, generator=gen)
    u = torch.randn(d, generator=gen)
    u /= u.norm()
    zero = (P.bin_of(V, bin, tiles) == 0).nonzero().squeeze(1)
    W[zero] = 8 * u + 0.1 * torch.randn(len(zero), d, generator=gen)
    x[:32] = 8 * u + 0.1 * torch.randn(32, d, generator=gen)
    logits = x @ W.t()
    ref = logits.topk(k)
    cand, cols = P.candidates(x, W, torch.float32, bin, keep, tiles)
    top, j = cand.topk(k)
    exact = P.exact_rows(cand, top, keep)
    assert not exact[:32].any() and exact[32:].sum() > 16
    unchecked = as_sets(cols.gather(1, j))
    assert all(unchecked[r] != as_sets(ref.indices)[r] for r in range(32))  # what the check prevents
    assert all(unchecked[r] == as_sets(ref.indices)[r] for r in range(32, M) if exact[r])
    vals, idx = P.decode_topk(x, W, k, bin, keep, tiles)
    assert as_sets(idx) == as_sets(ref.indices)
    torch.testing.assert_close(vals, ref.values, rtol=1e-5, atol=1e-5)


def run(fn, x, W, g):
    """(Phi, dx, dW) of fn(x, W) with upstream gradient g."""
    x, W = x.clone().requires_grad_(), W.clone().requires_grad_()
    out = fn(x, W)
    out.backward(g.to(out.dtype))
    return out.detach(), x.grad, W.grad


@needs_triton
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("how", ["kernels", "small bins"])
def test_phi_and_gradients_equal_the_float64_reference(P, dtype, tol, how):
    """Through lab/phi.py's "fused" (the module's bins; bag's backward on a CPU) and through TopkPhi with small bins (rows
    decoded again) and csr's backward (not in bf16: a CPU's sparse matmul has none); 2 chunks, the last one short. The
    reference is the dense formula in float64 on the same (rounded) values."""
    B, T, chunk, d, V, k, tau = 2, 20, 12, 32, 500, 8, 0.7
    gen = torch.Generator().manual_seed(5)
    x, W, g = (torch.randn(*s, generator=gen, dtype=torch.float64) for s in ((B, T, d), (V, d), (B, T, d)))
    x, W, g = (x / d ** 0.5).to(dtype), W.to(dtype), g.to(dtype)  # logits of unit scale: bf16 rounds them by < 1%
    if how == "kernels":
        fn = partial(CANDIDATES["fused"], k=k, tau=tau, chunk=chunk)
    else:
        decode = partial(P.decode_topk, bin=16, keep=2, tiles=(64, 64, 32))
        grads = kernels.csr_grads if dtype != torch.bfloat16 else None
        fn = lambda x, W: kernels.TopkPhi.apply(x, W, k, tau, chunk, None, grads, decode)
    got = run(fn, x, W, g)
    want = run(lambda x, W: reference(x, W, k, tau), x.double(), W.double(), g.double())
    for what, a, b in zip(("Phi", "dx", "dW"), got, want):
        assert a.dtype == dtype
        err = (a.double() - b).abs().max().item()
        assert err <= tol * b.abs().max().item(), f"{what} in {dtype}: {err:.2e} off, over {tol:g} of its scale"


@needs_triton
def test_autocast_decodes_in_bf16(P):
    """Under autocast the kernel casts fp32 x and W to bf16 in its registers (as F.linear's autocast casts them): its
    values are bf16 and its top-k is a top-k of the bf16-rounded logits, up to their rounding."""
    gen = torch.Generator().manual_seed(7)
    x, W = torch.randn(2, 16, 32, generator=gen), torch.randn(700, 32, generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        vals, idx = P.decode_topk(x, W, 8)
    exact = x.bfloat16().double() @ W.bfloat16().double().t()
    assert vals.dtype == torch.bfloat16 and idx.shape == (2, 16, 8)
    kth = exact.topk(8).values[..., -1:]
    assert (exact.gather(-1, idx) >= kth - 1e-2 * kth.abs()).all() and all(len(s) == 8 for s in as_sets(idx))
    torch.testing.assert_close(vals.double(), exact.gather(-1, idx), rtol=1e-2, atol=1e-2)


@needs_triton
def test_fewer_candidates_than_k_is_the_exact_decode(P):
    gen = torch.Generator().manual_seed(9)
    x, W = torch.randn(2, 5, 16, generator=gen), torch.randn(200, 16, generator=gen)
    vals, idx = P.decode_topk(x, W, 20)  # 2 tiles x 1 bin x 8 kept = 16 candidates < 20
    ref = (x @ W.t()).topk(20)
    assert as_sets(idx) == as_sets(ref.indices)
    torch.testing.assert_close(vals, ref.values, rtol=1e-5, atol=1e-5)


@needs_triton
def test_a_cpu_tensor_without_the_interpreter_is_one_line(P, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")  # phi_triton is imported already: its decode checks the tensor
    with pytest.raises(ValueError, match=r"^phi_kernel='fused' needs CUDA, .*\(TRITON_INTERPRET=1\): x is on cpu$"):
        CANDIDATES["fused"](torch.randn(1, 2, 4), torch.randn(9, 4), 2, 1.0, 2)


def test_without_cuda_or_the_interpreter_it_is_one_line_and_imports_no_triton():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the fused kernel runs there")
    code = ("import sys, torch\nfrom lab.phi import CANDIDATES\nassert 'triton' not in sys.modules\ntry:\n"
            "    CANDIDATES['fused'](torch.randn(1, 2, 4), torch.randn(9, 4), 2, 1.0, 2)\n"
            "except ValueError as e:\n    print(e)\nprint('triton' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["phi_kernel='fused' needs CUDA, or Triton's interpreter on the CPU "
                                     "(TRITON_INTERPRET=1)", "False"]
