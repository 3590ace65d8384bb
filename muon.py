"""
Muon that sees each projection as its own matrix. Ouro, Llama and the paper's setup have separate
q, k, v (and gate, up) weights; our blocks fuse them (c_attn, and c_fc for SwiGLU) for speed. Muon
orthogonalizes a whole matrix, so a fused weight would be orthogonalized as one (3d, d) matrix, a
different update. SplitMuon runs torch.optim.Muon's exact step on each row block of a fused weight
(tests/test_muon.py: equal to torch.optim.Muon on the separate matrices, stacked).
"""
import torch
from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz


def takes_muon(name, p):
    """The block matrices (2-D, inside f_theta) go to Muon; embeddings, norms and gates to AdamW."""
    return p.dim() == 2 and name.startswith("transformer.h.")


class SplitMuon(torch.optim.Muon):
    def __init__(self, params, splits, **kwargs):
        """splits: {parameter: row sizes of its projections}; parameters not in it are one matrix."""
        self.splits = splits
        super().__init__(params, **kwargs)

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is None, "SplitMuon takes no closure"
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:  # the same state as torch.optim.Muon's
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - group["momentum"])
                update = p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                p.mul_(1 - group["lr"] * group["weight_decay"])
                sizes = self.splits.get(p, [p.size(0)])
                for rows, u in zip(p.split(sizes, 0), update.split(sizes, 0)):  # views: p changes in place
                    u = _zeropower_via_newtonschulz(u, group["ns_coefficients"], group["ns_steps"], group["eps"])
                    rows.add_(u, alpha=-_adjust_lr(group["lr"], group["adjust_lr_fn"], rows.shape))
