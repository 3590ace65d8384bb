"""loop_loss (issue 62 item 3): training adds loop_loss x the mean loss of the head read after each earlier loop, which
is exactly model(x, y, n_loop=k) for k < K (float64, every recurrence that loops); off (0) and in eval mode the loss is
the last loop's alone; an early state that has not passed a coda is refused, a loop_loss on recurrence='none' is inert."""
import pytest
import torch

from model import GPT, GPTConfig

CASES = [("loop", {}), ("disco", {"disco_gate": "learned"}), ("disco", {"phi_topk": 5, "per_loop_norm": True}),
         ("ponder", {}), ("loop", {"n_prelude": 1, "n_layer": 3})]


@pytest.mark.parametrize("rec,extra", CASES)
def test_loop_loss_is_the_weighted_mean_of_earlier_readouts(rec, extra):
    cfg = {"vocab_size": 30, "n_layer": 2, "n_head": 2, "n_embd": 16, "block_size": 8, "recurrence": rec, "n_loop": 3,
           "loop_loss": 0.4, **extra}
    torch.manual_seed(0)
    m = GPT(GPTConfig(**cfg)).double()
    x, y = torch.randint(0, 30, (2, 8)), torch.randint(0, 30, (2, 8))
    y[0, :3] = -1
    for sparse in (False, True):
        m.train()
        loss = m(x, y, sparse_targets=sparse)[1]
        m.eval()
        each = [m(x, y, n_loop=k, sparse_targets=sparse)[1] for k in (1, 2, 3)]
        assert abs(loss.item() - (each[2] + 0.4 * (each[0] + each[1]) / 2).item()) < 1e-12
        assert abs(m(x, y, sparse_targets=sparse)[1].item() - each[2].item()) < 1e-12  # evaluation: the last loop only
    m.train()
    m(x, y)[1].backward()
    assert all(p.grad is not None for p in m.parameters() if p.requires_grad)


def test_loop_loss_off_and_refused():
    torch.manual_seed(0)
    a = GPT(GPTConfig(vocab_size=30, n_layer=1, n_head=2, n_embd=16, block_size=8, recurrence="disco", n_loop=3)).double()
    x, y = torch.randint(0, 30, (2, 8)), torch.randint(0, 30, (2, 8))
    a.train()
    assert torch.equal(a(x, y)[1], a(x, y, n_loop=3)[1])  # off: the last loop's loss, nothing added
    with pytest.raises(ValueError, match="loop_loss=0.5 is invalid"):
        GPTConfig(vocab_size=30, n_layer=3, n_head=2, n_embd=16, recurrence="loop", n_loop=2, n_coda=1, loop_loss=0.5)
    from configurator import inert
    assert "loop_loss" in inert({**GPTConfig.defaults(), "recurrence": "none", "loop_loss": 0.3}, GPTConfig.defaults(),
                                GPTConfig.ACTIVE)


def test_rising_weights_with_one_earlier_loop_are_inert():
    """K = 2 has one earlier loop: 'rising' weighs it as 'mean' does, and said nothing (issue 72 item 5)."""
    from configurator import inert
    c = {**GPTConfig.defaults(), "loop_loss": 0.6, "loop_loss_weights": "rising", "n_loop": 2}
    found = inert(c, GPTConfig.defaults(), GPTConfig.ACTIVE, ["loop_loss_weights"])
    assert "loop_loss_weights" in found and "n_loop > 2" in found["loop_loss_weights"], found
    assert "loop_loss_weights" not in inert({**c, "n_loop": 3}, GPTConfig.defaults(), GPTConfig.ACTIVE, [])
