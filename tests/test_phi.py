"""Every top-k Phi kernel, the core's (kernels.PHI_KERNELS) and the lab's candidates (lab/phi.py), computes TopkPhi: in float64 its Phi, dx and dW equal the
dense formula's (softmax over the top-k logits, -inf elsewhere, @ W, differentiated by autograd) to 1e-12, across
chunk boundaries, tau != 1, k = 1 and k = V, and ties (equal rows of W)."""
import importlib.util
import os
from functools import partial

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels import topk_phi
from lab.phi import CANDIDATES, GRADS, phi_variant, twostage_topk


def interpreted(kernel):
    """A kernel run with TRITON_INTERPRET=1 for its call only (Triton's interpreter on the CPU; the variable is gone
    after the call, so no other test sees it)."""
    def phi(*args):
        before = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            return kernel(*args)
        finally:
            if before is None:
                del os.environ["TRITON_INTERPRET"]
            else:
                os.environ["TRITON_INTERPRET"] = before
    return phi


# the registry (its two-stage top-k prunes only where V >= 2 x 4,096), plus two-stage top-k at blocks that prune
# here: 37 = 4 x 8 + a tail of 5, and 37 = 6 x 6 + 1. "fused" (a Triton kernel: CUDA or its interpreter) runs under
# the interpreter where triton is installed (its own tests: tests/test_phi_fused.py)
KERNELS = {**{n: f for n, f in CANDIDATES.items() if n not in ("compiled", "fused")},
           **{f"twostage{b}+{g or 'bag'}": phi_variant(partial(twostage_topk, block=b), GRADS[g]) for b in (6, 8)
              for g in GRADS},
           **({"fused": interpreted(CANDIDATES["fused"])} if importlib.util.find_spec("triton") else {})}
# (B, T, chunk, k, tau): T not a multiple of chunk, chunk 1 with k = 1, chunk >= T with k = V, chunk = T
CASES = [(2, 7, 3, 6, 0.7), (2, 7, 1, 1, 1.0), (1, 5, 8, 37, 2.0), (3, 4, 4, 9, 1.0)]
V, D = 37, 5


def reference(x, W, k, tau):
    """Phi_k from its definition, for autograd to differentiate: the k largest logits keep theirs, the rest -inf."""
    logits = x @ W.t()
    mask = torch.full_like(logits, float("-inf")).scatter(-1, logits.detach().topk(k).indices, 0.0)
    return F.softmax((logits + mask) / tau, dim=-1) @ W


def run(fn, x, W, g):
    """(Phi, dx, dW) of fn(x, W) with upstream gradient g."""
    x, W = x.clone().requires_grad_(), W.clone().requires_grad_()
    out = fn(x, W)
    out.backward(g)
    return out.detach(), x.grad, W.grad


def inputs(B, T, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=gen, dtype=torch.float64) for s in ((B, T, D), (V, D), (B, T, D))]


@pytest.mark.parametrize("B,T,chunk,k,tau", CASES)
@pytest.mark.parametrize("name", list(KERNELS))
def test_kernel_equals_the_dense_formula(name, B, T, chunk, k, tau):
    x, W, g = inputs(B, T)
    want = run(lambda x, W: reference(x, W, k, tau), x, W, g)
    got = run(lambda x, W: KERNELS[name](x, W, k, tau, chunk), x, W, g)
    for what, a, b in zip(("Phi", "dx", "dW"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=f"{name} {what}")


def test_compiled_kernel_equals_bag():
    # the compiled region is traced (dynamo, the Function's forward and backward) by aot_eager: inductor would add
    # ~10 s of C++ builds a shape on this CPU to test torch's own code generator
    x, W, g = inputs(2, 7)
    want = run(lambda x, W: topk_phi(x, W, 6, 0.7, 3), x, W, g)
    got = run(lambda x, W: kernels.compiled_bag("aot_eager")(x, W, 6, 0.7, 3), x, W, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("k", [1, 4, 5, 12, 24])
@pytest.mark.parametrize("name", list(KERNELS))
def test_ties(name, k):
    """Ties are equal logits of equal rows of W: any of the tied tokens may be kept, and Phi, dx and dW summed over
    each group of equal rows do not depend on which. 8 distinct rows x 3 copies: every k not a multiple of 3 cuts
    through a tie; values with few bits make every logit exact, so copies tie exactly."""
    gen = torch.Generator().manual_seed(1)
    bits = lambda *s: torch.randint(-64, 65, s, generator=gen).double() / 64
    distinct, x, g = bits(8, D), bits(2, 6, D), bits(2, 6, D)
    group = torch.arange(24) % 8
    W = distinct[group]
    assert all(len(row.unique()) == 8 for row in (x @ distinct.t()).flatten(0, 1)), "ties only between copies"
    summed = lambda out: (out[0], out[1], torch.zeros(8, D, dtype=torch.float64).index_add_(0, group, out[2]))
    want = summed(run(lambda x, W: reference(x, W, k, 1.3), x, W, g))
    got = summed(run(lambda x, W: KERNELS[name](x, W, k, 1.3, 4), x, W, g))
    for what, a, b in zip(("Phi", "dx", "dW summed over copies"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=f"{name} {what}")


@pytest.mark.parametrize("grad", list(GRADS))
def test_one_input_needs_no_gradient(grad):
    """A frozen embedding (or a constant state) gets no gradient, and the other one is still right."""
    x, W, g = inputs(2, 7)
    want = run(lambda x, W: reference(x, W, 4, 1.0), x, W, g)
    fn = phi_variant(kernels.sorted_topk, GRADS[grad])
    for frozen in ("x", "W"):
        xs, Ws = x.clone().requires_grad_(frozen != "x"), W.clone().requires_grad_(frozen != "W")
        fn(xs, Ws, 4, 1.0, 3).backward(g)
        assert (xs.grad is None) == (frozen == "x") and (Ws.grad is None) == (frozen == "W")
        torch.testing.assert_close(Ws.grad if frozen == "x" else xs.grad, want[2] if frozen == "x" else want[1],
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n,k,block", [(37, 5, 8), (64, 8, 16), (100, 3, 7), (37, 37, 4), (40, 9, 8), (37, 1, 36)])
def test_twostage_topk_finds_the_top_k(n, k, block):
    logits = torch.randn(3, 4, n, dtype=torch.float64)
    vals, idx = twostage_topk(logits, k, block)
    torch.testing.assert_close(vals.sort(-1, descending=True).values, logits.topk(k).values, rtol=0, atol=0)
    assert torch.equal(logits.gather(-1, idx), vals) and all(len(r.unique()) == k for r in idx.flatten(0, 1))


def test_reference_tells_k_and_tau_apart():
    """The tests above can fail: the reference (and bag) change with k and tau."""
    x, W, _ = inputs(2, 7)
    assert not torch.allclose(reference(x, W, 6, 1.0), reference(x, W, 7, 1.0))
    assert not torch.allclose(topk_phi(x, W, 6, 1.0, 3), topk_phi(x, W, 6, 0.7, 3))


def test_unknown_kernel_is_one_line():
    x, W, _ = inputs(1, 2)
    with pytest.raises(ValueError, match=r"kernel='bagg' is invalid: allowed one of \('auto', 'bag'"):
        topk_phi(x, W, 2, 1.0, 2, kernel="bagg")
