"""recurrence='ponder' against PonderLM's reference recurrence, transcribed from the reference code itself
(not from model.py): hzby/PonderingLM, src/llamafactory/model/modeling/modeling_llama.py,
LlamaForCausalLM.forward, the `if getattr(self.config, "ponderinglm", False):` branch (about L1211-1265 of
the public file); modeling_gpt2.py and modeling_gpt_neox.py have the same loop. Its steps, in order:

    inputs_embeds0 = embed_tokens(input_ids)
    if scale_embeds: embed_scale = sqrt(d); inputs_embeds0 = inputs_embeds0 * embed_scale
    current = inputs_embeds0 * pondering_steps if mutiply_pondering_steps else inputs_embeds0
    for _ in range(pondering_steps):
        h = self.model(inputs_embeds=current)          # every layer + the final norm
        probs = softmax(lm_head(h) / softmax_temperature)
        current = current + probs @ (embed_tokens.weight * embed_scale   if scale_embeds else embed_tokens.weight)
    logits = lm_head(self.model(inputs_embeds=current))

"3 pondering steps" = 4 full passes = K = 4 here. The GPT-2 file adds the position table inside
self.model, i.e. on every pass. The reference has no "read the head after n passes" of a trained model:
its only knob, pondering_steps, sets the pass count AND the input multiplier together. model.py's
n_loop (probes: Stage-1 = 1 pass) keeps the TRAINED multiplier K-1, so that the state after pass n is
exactly the prefix of the trained K-pass computation; `multiplier` below is that one extra argument.
"""
import math

import pytest
import torch

from model import GPT, GPTConfig


def reference_ponder(model, idx, pondering_steps, multiplier=None):
    """The reference's forward, with model.py's blocks standing in for the reference's self.model."""
    cfg, tr = model.config, model.transformer
    W = tr.wte.weight                                 # embed_tokens.weight (= lm_head.weight: tied)
    rope = (model.rope_cos, model.rope_sin) if cfg.pos_emb == "rope" else None
    pos = tr.wpe.weight[:idx.size(1)] if cfg.pos_emb == "learned" else 0

    def base_model(inputs_embeds):                    # self.model(...): positions, every layer, final norm
        x = inputs_embeds + pos
        for block in tr.h:
            x = block(x, rope)
        return tr.ln_f(x)

    def lm_head(h):
        return h @ W.T

    inputs_embeds0 = W[idx]
    if cfg.ponder_scale_embeds:
        embed_scale = torch.sqrt(torch.tensor(inputs_embeds0.shape[-1], dtype=inputs_embeds0.dtype))
        inputs_embeds0 = inputs_embeds0 * embed_scale
    steps_mult = pondering_steps if multiplier is None else multiplier
    current = inputs_embeds0 * steps_mult if cfg.ponder_multiply_steps else inputs_embeds0
    for _ in range(pondering_steps):
        probs = torch.softmax(lm_head(base_model(current)) / cfg.phi_tau, dim=-1)
        if cfg.ponder_scale_embeds:
            current = current + probs @ (W * embed_scale)
        else:
            current = current + probs @ W
    return lm_head(base_model(current))


def make(K, pos_emb, scale, multiply, tau=1.0):
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=16, vocab_size=41, n_layer=2, n_head=2, n_embd=16, pos_emb=pos_emb,
                    recurrence="ponder", n_loop=K, ponder_scale_embeds=scale, ponder_multiply_steps=multiply,
                    phi_tau=tau, norm="rmsnorm", mlp="swiglu")
    model = GPT(cfg).double().eval()
    with torch.no_grad():  # non-trivial norms, and a peaked head, so the increment's scale matters
        for n, p in model.named_parameters():
            if "ln" in n:
                p.add_(0.3 * torch.randn_like(p))
        model.transformer.wte.weight.mul_(8)
    return model


@pytest.mark.parametrize("pos_emb", ["rope", "learned"])  # modeling_llama.py / modeling_gpt2.py
@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("multiply", [False, True])
@pytest.mark.parametrize("K", [2, 4])
def test_ponder_equals_reference(K, multiply, scale, pos_emb):
    model = make(K, pos_emb, scale, multiply, tau=0.9)
    idx = torch.randint(0, 41, (3, 10))
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], reference_ponder(model, idx, K - 1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n_loop", [1, 2, 5])
@pytest.mark.parametrize("scale", [False, True])
def test_probe_n_loop_keeps_the_trained_multiplier(n_loop, scale):
    """n_loop != K: n passes on an input multiplied by the trained K-1 (the reference would multiply by
    n-1, i.e. describe a different model; the two agree only without mutiply_pondering_steps)."""
    K = 4
    model = make(K, "rope", scale, True)
    idx = torch.randint(0, 41, (2, 9))
    with torch.no_grad():
        ours = model(idx, n_loop=n_loop)[0]
        torch.testing.assert_close(ours, reference_ponder(model, idx, n_loop - 1, multiplier=K - 1),
                                   rtol=1e-12, atol=1e-12)
        if n_loop - 1 != K - 1:
            assert not torch.allclose(ours, reference_ponder(model, idx, n_loop - 1), atol=1e-6)
        # the hook sees pass n of the full K-pass computation: the same state the n_loop=n readout ends on
        seen = {}
        model(idx, hook=lambda k, h, h_next: seen.update({k: h}))  # returns None: nothing replaced
        if n_loop <= K:
            torch.testing.assert_close(model.head(seen[n_loop]), ours, rtol=1e-12, atol=1e-12)


def test_unscaled_increment_is_what_the_reference_does_not_do():
    """Guards the test itself: with scale_embeds the sqrt(d) on the increment matters (the bug this caught)."""
    model = make(4, "rope", True, True)
    idx = torch.randint(0, 41, (2, 9))
    cfg = model.config
    with torch.no_grad():
        ref = reference_ponder(model, idx, 3)
        W = model.transformer.wte.weight
        e = W[idx] * math.sqrt(cfg.n_embd) * 3
        for k in range(3):  # the old model.py: increment without sqrt(d)
            e = e + model.phi(model.f_theta(e))
        old = model.head(model.f_theta(e))
    assert (old - ref).abs().max() > 1e-3
