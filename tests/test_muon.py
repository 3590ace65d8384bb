"""SplitMuon: a fused weight's update is the separate projections' torch.optim.Muon updates, stacked."""
import torch

from model import GPT, GPTConfig
from muon import SplitMuon


def test_fused_update_equals_separate_updates_stacked():
    torch.manual_seed(0)
    d, sizes = 8, [8, 8, 8]
    fused = torch.nn.Parameter(torch.randn(sum(sizes), d))
    parts = [torch.nn.Parameter(p.clone()) for p in fused.detach().split(sizes, 0)]
    kw = dict(lr=0.02, weight_decay=0.1, momentum=0.95, adjust_lr_fn="match_rms_adamw")
    ours, ref = SplitMuon([fused], {fused: sizes}, **kw), torch.optim.Muon(parts, **kw)
    for _ in range(3):  # momentum carries over steps
        g = torch.randn(sum(sizes), d)
        fused.grad = g.clone()
        for p, gp in zip(parts, g.split(sizes, 0)):
            p.grad = gp.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(fused.detach(), torch.cat([p.detach() for p in parts]), rtol=0, atol=0)
    # and it differs from orthogonalizing the fused matrix as one: the split matters
    whole = torch.nn.Parameter(torch.cat([p.detach() for p in parts]))
    whole.grad = torch.randn_like(whole)
    one = whole.detach().clone()
    torch.optim.Muon([whole], **kw).step()
    w2 = torch.nn.Parameter(one.clone())
    w2.grad = whole.grad.clone()
    SplitMuon([w2], {w2: sizes}, **kw).step()
    assert not torch.allclose(whole.detach(), w2.detach())


def test_model_names_its_fused_projections():
    m = GPT(GPTConfig(vocab_size=50, n_layer=2, n_head=2, n_embd=16, mlp="swiglu", n_hidden=32))
    splits = m.projection_splits()
    assert sorted(map(tuple, splits.values())) == [(16, 16, 16)] * 2 + [(32, 32)] * 2
    g = GPT(GPTConfig(vocab_size=50, n_layer=1, n_head=2, n_embd=16, mlp="gelu"))
    assert list(g.projection_splits().values()) == [[16, 16, 16]]  # GELU's c_fc is one matrix
