"""
DiscoLoop and its baselines in one file, nanoGPT-style.

f_theta is the stack `transformer.h` (n_layer blocks). The recurrences (paper notation):
  none   : K untied copies of f_theta stacked (the non-looped baseline, same FLOPs as K loops)
  loop   : H^0 = W[x], H^{k+1} = f(H^k)                                  (Eq. 1)
  disco  : H^{k+1} = f(H~^k), H~^{k+1} = H^{k+1} + a^k * RMSNorm(Phi(H^{k+1})),
           Phi(h) = sum_v softmax(head(h)/tau)_v W[v], no injection after the last loop   (Eq. 3-5)
  ponder : PonderLM (Zeng et al. 2025, github.com/hzby/PonderingLM, flag `ponderinglm`): the
           recurrence lives only in embedding space. e = W[x]; K-1 times: run the whole model
           (blocks + final norm) on e and add the expected embedding, e <- e + Phi(h); one last full
           pass gives the logits. "3 pondering steps" there = K = 4 here.
The LM head is ln_f followed by the tied projection W^T, and Phi decodes with that same head (an untied head,
tie_embeddings=False, for pretrained checkpoints: Phi decodes with it and encodes with W; pretrained.py loads them).
per_loop_norm (Ouro's modeling_ouro.py): ln_f is applied to every loop's output and the normed state feeds the next
loop; the head and Phi read it as it is. DiscoLoop's order is then: h = ln_f(f(H~)), Phi(h), H~ = h + a RMSNorm(Phi(h)).
"""
import functools
import importlib
import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from kernels import PHI_KERNELS, linear_cross_entropy, topk_phi, upcast
from muon import SplitMuon, takes_muon


@dataclass(frozen=True)
class Recurrence:
    """What the rest of the repo knows of a recurrence (memory.py, bench.py, probe.py read these facts, never the
    name). Its update between two loops is GPT.between; adding a recurrence touches this table, between(), and
    model.py's tests."""
    label: str        # name in tables and plots
    copies: bool      # K untied copies of f_theta: K blocks' parameters, no loops past K
    phi: bool         # decodes Phi between loops: one head matmul per injection (FLOPs, a Phi chunk in memory)
    embed: bool       # the recurrence lives in embedding space: every pass runs the whole model (positions included)
    injects: bool     # DiscoLoop's injection H~ = H + a * RMSNorm(Phi(H)): ln_inj, the gate; probes intervene on H~


RECURRENCES = {
    "none": Recurrence("non-looped (K untied copies)", copies=True, phi=False, embed=False, injects=False),
    "loop": Recurrence("vanilla loop", copies=False, phi=False, embed=False, injects=False),
    "disco": Recurrence("DiscoLoop", copies=False, phi=True, embed=False, injects=True),
    "ponder": Recurrence("PonderLM", copies=False, phi=True, embed=True, injects=False),
}
NORMS = ("rmsnorm", "layernorm")
MLPS = ("swiglu", "gelu")
POS_EMBS = ("rope", "learned", "none")
GATES = ("fixed", "learned")
# activation_checkpointing, what a block keeps for backward: "none" all; "block" its input (all else reruns);
# "attn" also the attention ops' outputs and log-sum-exp; "attn_mm" also every matmul's (torchtitan's list, less its
# every-other-mm). Their op lists are beside Block
CHECKPOINTING = ("none", "block", "attn", "attn_mm", "auto")
LOOP_LOSS_WEIGHTS = ("mean", "rising")
# kv_share, what loop k's attention reads for earlier positions: "" its own loop's keys and values (one slot per
# (loop, layer)); "first" loop 1's, written once (loops 2..K write none; trains: loop 1 of every position is done
# before loop 2 starts); "latest" (inference, Huginn) the last loop each position wrote. Both keep one slot per layer
KV_SHARES = ("", "first", "latest")


@dataclass
class GPTConfig:
    block_size: int = 1024     # longest sequence (RoPE tables and learned positions are this long)
    vocab_size: int = 50304    # embedding rows (tied with the head unless tie_embeddings=False); train.py: 0 = data's
    n_layer: int = 12          # blocks in the stack: f_theta (one loop), plus the prelude and coda if any
    n_prelude: int = 0         # the first n_prelude blocks run once before the loop (f_theta is the middle blocks)
    n_coda: int = 0            # the last n_coda blocks run once after it (McLeish et al. 2025's retrofitted recurrence)
    n_head: int = 12           # attention heads
    n_kv_head: int = 0         # key/value heads (grouped-query attention, Llama/Qwen2): 0 = n_head; must divide n_head
    n_embd: int = 768          # model width d
    n_hidden: int = 0          # SwiGLU hidden width; 0 = 8/3 * n_embd rounded up to a multiple of 64
    dropout: float = 0.0       # dropout probability in the blocks
    pos_emb: str = "rope"      # "rope" (pretraining backbone) or "learned" (GPT-2 base of the symbolic runs)
    rope_theta: float = 10000.0  # RoPE base
    pos_every_loop: bool = False  # learned positions: add them before every loop, not only to the tokens
    pos_shift: int = 0         # learned positions, training only: each sequence starts at a random 0..pos_shift
                               # (rows past the longest example train too: hop extrapolation, Ruoss et al. 2023)
    sandwich_norm: bool = False  # Ouro-style: also norm each sublayer's output before the residual add
    scaled_init: bool = True   # GPT-2: c_proj ~ N(0, 0.02/sqrt(2 n_layer K)); False = Ouro's N(0, 0.02) everywhere
    per_loop_norm: bool = False  # Ouro: ln_f after every loop, and the normed state feeds the next loop
    ponder_scale_embeds: bool = False     # PonderLM's scale_embeds: the input embedding times sqrt(d)
    ponder_multiply_steps: bool = False   # PonderLM's mutiply_pondering_steps: the input embedding times K-1
    norm: str = "rmsnorm"      # "rmsnorm" or "layernorm" (GPT-2) for the blocks and ln_f
    mlp: str = "swiglu"        # "swiglu" or "gelu" (GPT-2: 4d hidden)
    bias: bool = False         # biases in Linear layers and LayerNorm (GPT-2 has them)
    qkv_bias: bool = False     # biases on the q, k, v projections only (Qwen2); `bias` already includes them
    norm_eps: float = 0.0      # blocks' and ln_f's epsilon: 0 = the norm's own (RMSNorm 1e-6, LayerNorm 1e-5)
    tie_embeddings: bool = True  # head W = embedding W; False (Llama, Qwen2): Phi decodes with the head, encodes with W
    recurrence: str = "disco"  # "disco" | "loop" | "none" (K untied copies) | "ponder" (PonderLM): RECURRENCES
    n_loop: int = 2            # K: applications of f_theta
    disco_gate: str = "fixed"  # "fixed": a = disco_alpha; "learned": a_t = sigmoid(<w, Phi(H_t)> + b)
    disco_alpha: float = 1.0   # the fixed gate alpha*
    phi_tau: float = 1.0       # softmax temperature of Phi, and of what an exit reads where Phi decodes (a loop's: 1)
    phi_topk: int = 0        # 0 = exact Phi over the vocabulary; k > 0 = Phi_k (Appendix B)
    phi_chunk: int = 0       # positions per chunk when decoding Phi (0 = all at once); bounds the B*chunk*V logits
    phi_kernel: str = "auto"  # top-k Phi's kernel (kernels.PHI_KERNELS, equal in float64): "auto" = csr on CUDA, bag
    label_smoothing: float = 0.0  # label smoothing of the training loss
    loop_loss: float = 0.0     # training adds this x the mean loss of the head read after each earlier loop (0 = off)
    loop_loss_weights: str = "mean"  # how loop_loss weighs the earlier loops: "mean" alike; "rising": loop k weighs k
    loss_chunk: int = 1024     # positions per chunk of the head + cross-entropy (0 = all): bounds the (chunk, V) logits
    kv_share: str = ""         # "" each loop its own keys/values; "first" loop 1's; "latest" (inference) KV_SHARES
    activation_checkpointing: str = "none"  # none|block|attn|attn_mm (CHECKPOINTING); auto: least recompute that fits
    # when a key acts (configurator.inert: train.py and bench.py refuse a typed inert key, note a config file's): a
    # key or a family prefix ('phi_': every Phi key, later ones too) -> (predicate over the keys, what it needs)
    ACTIVE = {"phi_": (lambda c: RECURRENCES[c["recurrence"]].phi, "a recurrence that decodes Phi ('disco' or "
                       "'ponder'), not recurrence={recurrence!r}"),
              "disco_": (lambda c: c["recurrence"] == "disco", "recurrence='disco', not {recurrence!r}"),
              "ponder_": (lambda c: c["recurrence"] == "ponder", "recurrence='ponder', not {recurrence!r}"),
              "phi_kernel": (lambda c: c["phi_topk"] > 0, "top-k Phi (phi_topk > 0); exact Phi has no kernel"),
              "disco_alpha": (lambda c: c["disco_gate"] == "fixed", "disco_gate='fixed', not {disco_gate!r}"),
              "pos_every_loop": (lambda c: c["pos_emb"] == "learned", "pos_emb='learned', not {pos_emb!r}"),
              "rope_theta": (lambda c: c["pos_emb"] == "rope", "pos_emb='rope', not {pos_emb!r}"),
              "loop_loss": (lambda c: c["recurrence"] != "none" and not c.get("loops_by_hops") and c["n_loop"] > 1,
                            "loops the head reads alike: n_loop > 1 (n_loop={n_loop}), not recurrence='none' nor "
                            "loops_by_hops"),
              "loop_loss_weights": (lambda c: c["loop_loss"] > 0 and c["n_loop"] > 2,
                                    "loop_loss > 0 with two or more earlier loops to weigh (n_loop > 2; n_loop={n_loop}"
                                    ", loop_loss={loop_loss})"),
              "qkv_bias": (lambda c: not c["bias"], "bias=False (bias=True already has q, k, v biases)")}

    def __post_init__(self):
        def bad(name, allowed):
            raise ValueError(f"{name}={getattr(self, name)!r} is invalid: allowed {allowed}")
        choices = {"recurrence": tuple(RECURRENCES), "disco_gate": GATES, "pos_emb": POS_EMBS, "norm": NORMS,
                   "mlp": MLPS, "phi_kernel": tuple(PHI_KERNELS), "activation_checkpointing": CHECKPOINTING,
                   "loop_loss_weights": LOOP_LOSS_WEIGHTS, "kv_share": KV_SHARES}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                bad(name, allowed)
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "n_loop"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                bad(name, "an integer >= 1")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_head={self.n_head} must divide n_embd={self.n_embd}")
        for name in ("n_prelude", "n_coda", "pos_shift"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                bad(name, "an integer >= 0")
        if (self.n_prelude or self.n_coda) and self.recurrence not in ("loop", "disco"):
            raise ValueError(f"n_prelude={self.n_prelude}, n_coda={self.n_coda} need recurrence 'loop' or 'disco' "
                             f"(PonderLM passes the whole model, 'none' copies it), not {self.recurrence!r}")
        if self.n_prelude + self.n_coda >= self.n_layer:
            raise ValueError(f"n_prelude={self.n_prelude} + n_coda={self.n_coda} leave no block of "
                             f"n_layer={self.n_layer} to loop: allowed n_prelude + n_coda < n_layer")
        kv = self.n_kv_head
        if not isinstance(kv, int) or kv < 0 or (kv and self.n_head % kv):
            bad("n_kv_head", f"0 (= n_head) or a divisor of n_head={self.n_head}")
        if not (self.norm_eps >= 0 and math.isfinite(self.norm_eps)):
            bad("norm_eps", "0 (the norm's default) or a finite number > 0")
        if not self.tie_embeddings and self.phi_topk:
            raise ValueError(f"phi_topk={self.phi_topk} needs tie_embeddings=True (top-k Phi decodes and encodes "
                             "with one matrix); use phi_topk=0 (exact Phi) with an untied head")
        if self.pos_emb == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError(f"rope needs an even head size, got n_embd/n_head={self.n_embd // self.n_head}")
        if self.pos_shift and self.pos_emb != "learned":
            raise ValueError(f"pos_shift={self.pos_shift} needs pos_emb='learned', not {self.pos_emb!r}")
        if not (self.phi_tau > 0 and math.isfinite(self.phi_tau)):
            bad("phi_tau", "a finite number > 0")
        if RECURRENCES[self.recurrence].phi and self.n_loop < 2:
            bad("n_loop", f"an integer >= 2 for recurrence={self.recurrence!r} (one loop has no injection; "
                          "use recurrence='loop' for a single pass)")
        if not math.isfinite(self.disco_alpha):
            bad("disco_alpha", "a finite number")
        if not (self.rope_theta > 0 and math.isfinite(self.rope_theta)):  # a RoPE base <= 0: NaN angles, no error
            bad("rope_theta", "a finite number > 0")
        if not 0 <= self.phi_topk <= self.vocab_size:
            bad("phi_topk", f"0 (exact) or 1..vocab_size={self.vocab_size}")
        for name in ("dropout", "label_smoothing"):
            if not 0 <= getattr(self, name) < 1:
                bad(name, f"0 <= {name} < 1")
        self.check_kv_share(bad)
        if not 0 <= self.loop_loss < 1 or self.loop_loss and self.n_coda:
            bad("loop_loss", "0 <= loop_loss < 1 and 0 with n_coda > 0 (no early state passes the coda)")
        chunks = "0 (no chunking) or a positive number of positions"
        sizes = (("n_hidden", "0 (auto) or a positive width"), ("loss_chunk", chunks), ("phi_chunk", chunks))
        for name, allowed in sizes:
            if getattr(self, name) < 0:
                bad(name, allowed)

    def check_kv_share(self, bad):
        if self.kv_share == "first" and self.activation_checkpointing != "none":
            bad("kv_share", "'' or 'latest' with activation_checkpointing (a recomputed loop 1 would rewrite the keys "
                            "and values loops 2..K read); 'first' with activation_checkpointing='none'")
        if self.kv_share and (RECURRENCES[self.recurrence].copies or RECURRENCES[self.recurrence].embed):
            bad("kv_share", "'' for recurrence 'none' (untied copies) and 'ponder' (every pass the whole model); "
                            "'first' or 'latest' share a looped block's keys and values across loops")

    @classmethod
    def defaults(cls):
        """{field: default}: the model keys of train.py and bench.py are these (defaults written once)."""
        return {f.name: f.default for f in fields(cls)}

    @classmethod
    def from_dict(cls, d):
        """Build from any dict (e.g. train.py's globals): unrelated keys are ignored."""
        return cls(**{k: d[k] for k in cls.defaults().keys() & d.keys()})


# Keys a continuation may set (the looping, the window, training's); the rest is the architecture the weights decide
CONTINUE_KEYS = ("block_size", "n_prelude", "n_coda", "recurrence", "n_loop", "disco_gate", "disco_alpha", "phi_tau",
                 "phi_topk", "phi_chunk", "phi_kernel", "pos_every_loop", "per_loop_norm", "ponder_scale_embeds",
                 "ponder_multiply_steps", "pos_shift", "dropout", "scaled_init", "label_smoothing", "loop_loss",
                 "loop_loss_weights", "loss_chunk", "activation_checkpointing", "kv_share")
ARCH_KEYS = tuple(k for k in GPTConfig.defaults() if k not in CONTINUE_KEYS)
# Keys that decide how the numbers are computed, never a weight (equal results: tests/test_phi.py,
# test_checkpointing.py): where a checkpoint is opened (from_checkpoint.model_from_checkpoint) a value this machine
# cannot run is read as the default, one note each. key -> (default, whether this machine runs the value). Every
# phi_kernel runs anywhere (the retired 'fused' is read as 'auto' by compat.RETIRED); 'auto' checkpointing is resolved
# by a training run, never by a checkpoint
COMPUTE_KEYS = {"activation_checkpointing": ("none", lambda v: v != "auto")}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.size(-1),), self.weight.to(x.dtype), self.eps)


def make_norm(config):
    if config.norm == "layernorm":
        return nn.LayerNorm(config.n_embd, eps=config.norm_eps or 1e-5, bias=config.bias)
    return RMSNorm(config.n_embd, eps=config.norm_eps or 1e-6)


def rope_cache(head_dim, block_size, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(block_size, dtype=torch.float32), inv_freq)
    return freqs.cos(), freqs.sin()  # (T, head_dim/2) each


def apply_rope(x, cos, sin):
    # x: (B, nh, T, hs); rotate the two halves of each head (GPT-NeoX / Llama convention)
    x1, x2 = upcast(x).chunk(2, dim=-1)
    y = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return y.type_as(x)


class KVCache:
    """Keys and values of one attention layer in one loop: K x n_layer of them for generation (GPT.new_cache). Exact
    for every recurrence: the updates between loops act per position, so position t's state depends only on positions
    <= t. The attention asks a cache where its new rows are (start) and what they attend to (extend); speculative.py's
    Lanes answers the same two questions for rows at different positions and loops. A cache that attends itself
    (an `attend(q, k, v)` method: an engine's paged memory, discoloop/vllm_model.py) stores and reads in one call, and
    its start() is every token's own position (B, T)."""

    k = v = None  # (B, kv heads, positions, head size) each, once the first position is in

    def __len__(self):
        return 0 if self.k is None else self.k.size(2)

    def start(self):
        """The first new position (the rows of a call continue the positions cached)."""
        return len(self)

    def extend(self, k, v):
        """Store the new rows' keys and values: (every key, every value, the mask of what each new query sees; None:
        causal from the top left, which a single new row or an empty cache needs)."""
        t0, T = len(self), k.size(2)
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        mask = None
        if t0 and T > 1:
            mask = torch.ones(T, t0 + T, dtype=torch.bool, device=k.device).tril(diagonal=t0)
        return self.k, self.v, mask

    def crop(self, n):
        """Keep the first n positions (speculative.py cuts back past a rejected draft)."""
        if self.k is not None:
            self.k, self.v = self.k[:, :, :n], self.v[:, :, :n]


class SharedSlot:
    """One layer's keys and values shared by every loop (kv_share 'first' or 'latest'): positions before this call
    (`base`) hold what their last writing loop stored; a call's own positions are written by the loops that write
    (SharedView.write) and read by every loop. commit() ends the call: its positions become earlier ones."""

    k = v = None
    base = 0

    def store(self, k, v):
        """This call's rows (positions base..): keys and values, replacing an earlier loop's of the same call."""
        keep = lambda old, new: new if old is None or self.base == 0 else torch.cat([old[:, :, :self.base], new], 2)
        self.k, self.v = keep(self.k, k), keep(self.v, v)

    def commit(self):
        self.base = 0 if self.k is None else self.k.size(2)


class SharedView:
    """What one loop's attention at one layer sees of a SharedSlot: the positions of this call start at slot.base;
    `write`: this loop stores its keys and values (loop 1 always; every loop for 'latest'), else it reads loop 1's."""

    def __init__(self, slot, write):
        self.slot, self.write = slot, write

    def __len__(self):
        return self.slot.base

    def start(self):
        return self.slot.base

    def extend(self, k, v):
        t0, T = self.slot.base, k.size(2)
        if self.write:
            self.slot.store(k, v)
        mask = torch.ones(T, t0 + T, dtype=torch.bool, device=k.device).tril(diagonal=t0) if t0 and T > 1 else None
        return self.slot.k, self.slot.v, mask

    def crop(self, n):
        """Keep the first n positions (as KVCache.crop)."""
        if self.slot.k is not None:
            self.slot.k, self.slot.v = self.slot.k[:, :, :n], self.slot.v[:, :, :n]
        self.slot.base = min(self.slot.base, n)


def rope_at(rope, t0, T):
    """RoPE's (cos, sin) of positions t0..t0+T-1, or of each row's own (t0 a (B, T) tensor of positions)."""
    if torch.is_tensor(t0):
        return rope[0][t0][:, None], rope[1][t0][:, None]  # (B, 1, T, head_dim/2)
    return rope[0][t0:t0 + T], rope[1][t0:t0 + T]


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head or config.n_head  # GQA: n_head / n_kv_head queries share a key/value head
        self.kv_dim = self.n_kv_head * (config.n_embd // config.n_head)
        # q, k, v fused in this order: (n_embd + 2 kv_dim) rows
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + 2 * self.kv_dim, bias=config.bias or config.qkv_bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout

    def forward(self, x, rope=None, cache=None):
        B, T, C = x.size()
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split([C, self.kv_dim, self.kv_dim], dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, hs).transpose(1, 2)  # the cache keeps kv heads only
        v = v.view(B, T, self.n_kv_head, hs).transpose(1, 2)
        if rope is not None:
            cos, sin = rope_at(rope, cache.start() if cache is not None else 0, T)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if hasattr(cache, "attend"):  # an engine's paged key/value memory: it stores, masks and attends (B, T, C)
            return self.c_proj(cache.attend(q, k, v))
        mask = None  # causal (SDPA's is_causal aligns top-left)
        if cache is not None:
            k, v, mask = cache.extend(k, v)
        # GQA: query head i reads key/value head i // (n_head / n_kv_head) (Hugging Face's repeat_kv)
        gqa = {"enable_gqa": True} if self.n_kv_head != self.n_head else {}
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and T > 1,
                                           dropout_p=self.dropout if self.training else 0.0, **gqa)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):  # SwiGLU (Llama/Ouro) or GELU (GPT-2)
    def __init__(self, config):
        super().__init__()
        self.swiglu = config.mlp == "swiglu"
        auto = 64 * math.ceil(8 * config.n_embd / 3 / 64) if self.swiglu else 4 * config.n_embd
        hidden = config.n_hidden or auto
        self.c_fc = nn.Linear(config.n_embd, (2 if self.swiglu else 1) * hidden, bias=config.bias)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)

    def forward(self, x):
        if self.swiglu:
            gate, up = self.c_fc(x).chunk(2, dim=-1)
            return self.c_proj(F.silu(gate) * up)
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


# selective activation checkpointing (CHECKPOINTING): a policy's ops are kept (MUST_SAVE), the rest recomputed
SDPA_OPS = [getattr(torch.ops.aten, "_scaled_dot_product_" + n).default
            for n in ("flash_attention", "efficient_attention", "cudnn_attention", "flash_attention_for_cpu")
            if hasattr(torch.ops.aten, "_scaled_dot_product_" + n)]
MATMUL_OPS = [torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default]
CONTEXTS = {name: {"context_fn": functools.partial(create_selective_checkpoint_contexts, ops)}
            for name, ops in (("attn", SDPA_OPS), ("attn_mm", SDPA_OPS + MATMUL_OPS))}


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)
        # sandwich norm (Ouro): normalize each sublayer's output too
        self.ln_1b = make_norm(config) if config.sandwich_norm else nn.Identity()
        self.ln_2b = make_norm(config) if config.sandwich_norm else nn.Identity()
        self.drop = nn.Dropout(config.dropout)

        self.policy = config.activation_checkpointing  # CHECKPOINTING, applied in forward

    def forward(self, x, rope=None, cache=None):
        if self.policy != "none" and torch.is_grad_enabled():
            # in forward, so compile_blocks compiles checkpoint(block), which keeps memory and policy (pytorch#161889).
            # Non-reentrant: replays dropout's RNG. Selective: no autocast cache, or loop 2's forward skips casts its
            # rerun makes
            device, cached = x.device.type, self.policy == "block"
            with torch.autocast(device, enabled=torch.is_autocast_enabled(device), cache_enabled=cached):
                return checkpoint(self.layers, x, rope, cache, use_reentrant=False, **CONTEXTS.get(self.policy, {}))
        return self.layers(x, rope, cache)

    def layers(self, x, rope=None, cache=None):
        x = x + self.drop(self.ln_1b(self.attn(self.ln_1(x), rope, cache)))
        x = x + self.drop(self.ln_2b(self.mlp(self.ln_2(x))))
        return x


class GPT(nn.Module):
    @classmethod
    def from_pretrained(cls, folder, override_args=None, **overrides):
        """nanoGPT's entry point for a forker: a Hugging Face GPT-2/Llama/Qwen2 folder as a GPT through the project's
        pretrained.py, imported at call time, by name (model.py copied alone imports and runs without it)."""
        pretrained = importlib.import_module("discoloop.pretrained")  # the one stated arrow up (test_house)
        return pretrained.from_pretrained(folder, **(override_args or {}), **overrides)

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.rec = RECURRENCES[config.recurrence]
        n_blocks = config.n_layer * (config.n_loop if self.rec.copies else 1)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            h=nn.ModuleList([Block(config) for _ in range(n_blocks)]),
            ln_f=make_norm(config),
        ))
        if config.pos_emb == "learned":
            self.transformer.wpe = nn.Embedding(config.block_size, config.n_embd)
        if self.rec.injects:
            self.transformer.ln_inj = RMSNorm(config.n_embd)  # the RMSNorm of Eq. (3)
            if config.disco_gate == "learned":  # Eq. (5): d+1 parameters shared by all loops
                self.gate_w = nn.Parameter(torch.zeros(config.n_embd))
                self.gate_b = nn.Parameter(torch.zeros(()))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight  # tied: W is both the embedding and the head
        if config.pos_emb == "rope":
            cos, sin = rope_cache(config.n_embd // config.n_head, config.block_size, config.rope_theta)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)
        # GPT-2 scaled init of the residual projections, by the depth one forward pass goes through
        depth = self.depth()
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight") and config.scaled_init:
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * depth))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def projection_splits(self):
        """{fused weight: row sizes of its projections}: q, k, v in c_attn, gate, up in a SwiGLU c_fc (Muon's
        matrices)."""
        d, out = self.config.n_embd, {}
        for block in self.transformer.h:
            kv = block.attn.kv_dim
            out[block.attn.c_attn.weight] = [d, kv, kv]
            if block.mlp.swiglu:
                h = block.mlp.c_fc.weight.size(0) // 2
                out[block.mlp.c_fc.weight] = [h, h]
        return out

    def configure_optimizers(self, optimizer, learning_rate, weight_decay, betas, eps, muon_momentum, fused=False):
        """[AdamW] or [AdamW, Muon]. Weight decay on matrices only. With 'muon', the 2-D block matrices go to Muon
        (AdamW-like lr by match_rms_adamw; q, k, v and gate, up orthogonalized apart, muon.py); embeddings, norms,
        gates to AdamW."""
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        muon_names = [n for n, p in params.items() if optimizer == "muon" and takes_muon(n, p)]
        decay = [p for n, p in params.items() if p.dim() >= 2 and n not in muon_names]
        no_decay = [p for n, p in params.items() if p.dim() < 2]
        opts = [torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=learning_rate, betas=betas, eps=eps, fused=fused)]
        if muon_names:
            opts.append(SplitMuon([params[n] for n in muon_names], self.projection_splits(), lr=learning_rate,
                                  weight_decay=weight_decay, momentum=muon_momentum, adjust_lr_fn="match_rms_adamw"))
        return opts

    def get_num_params(self, non_embedding=True):
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and self.config.pos_emb == "learned":
            n -= self.transformer.wpe.weight.numel()
        return n

    # ---- pieces of the recurrence -------------------------------------------------------------
    def head(self, h):
        """LM head: final norm, then the projection (W unless tie_embeddings=False), logits in the activation dtype."""
        return self.lm_head(self.normed(h))

    def normed(self, h):
        """What the head reads: ln_f(h), or h itself when every loop's output is already normed."""
        return h if self.config.per_loop_norm else self.transformer.ln_f(h)

    def depth(self):
        """Blocks one forward pass goes through: prelude + K loops of the middle + coda."""
        cfg = self.config
        return cfg.n_prelude + cfg.n_coda + (cfg.n_layer - cfg.n_prelude - cfg.n_coda) * cfg.n_loop

    def f_theta(self, x, copy=0, cache=None, part=None, done=None):
        """One application of f_theta (the middle blocks when there is a prelude or coda); `copy` picks the untied
        copy for recurrence='none'; cache: this loop's KVCache of every layer (generation); part: 'prelude' or
        'coda' runs those blocks instead (once, outside the loop). done (B, T): exited tokens (adaptive depth), whose
        frozen state x enters every block (Elbayad et al.'s state copying); all exited: only their K/V are stored."""
        cfg = self.config
        rope = (self.rope_cos, self.rope_sin) if cfg.pos_emb == "rope" else None
        n = cfg.n_layer
        lo, hi = {"prelude": (0, cfg.n_prelude), "coda": (n - cfg.n_coda, n)}.get(part, (cfg.n_prelude, n - cfg.n_coda))
        x0, store = x, done is not None and bool(done.all())
        for i, block in zip(range(lo, hi), self.transformer.h[copy * n + lo:copy * n + hi]):
            x = x if done is None else torch.where(done[..., None], x0, x)
            if not store:  # generation (a cache) runs the blocks eager: a compiled block recompiles for every length
                x = block(x, rope) if cache is None else block.layers(x, rope, cache[i])
            elif cache is not None:  # the later tokens attend to these keys and values
                block.attn(block.ln_1(x), rope, cache[i])
        return x

    def compile_blocks(self, enable=True, **options):
        """torch.compile each Block on its own (regional compilation), never the unrolled model: one graph serves every
        layer and loop (no Python number differs between calls), so compile time does not grow with depth x K;
        checkpoint(block) compiles whole (eager's memory). In place (deepcopy before it); enable=False undoes it."""
        for block in self.transformer.h:
            if enable:
                block.forward = torch.compile(block.forward, **options)  # hooks run outside the compiled region
            elif "forward" in vars(block):
                del block.forward
        return self

    def phi(self, h, p=None):
        """Decode-then-encode Phi(h) = softmax(head(h)/tau) @ W, exact or top-k (Appendix B; TopkPhi). Exact Phi decodes
        `phi_chunk` positions at a time; its (B, chunk, V) probabilities are kept for backward (top-k avoids that)
        unless activation_checkpointing is not 'none': each chunk then reruns whole in backward (PonderLM's at the
        440M shape)."""
        cfg = self.config
        W, head = self.transformer.wte.weight, self.lm_head.weight  # one tensor unless tie_embeddings=False
        if p is not None:  # decoded already (decode, adaptive depth): encode it
            return (p @ W).to(h.dtype)
        x = self.normed(h)
        chunk = cfg.phi_chunk or x.size(1)
        if cfg.phi_topk:  # tied only (GPTConfig)
            return topk_phi(x, W, cfg.phi_topk, cfg.phi_tau, chunk, cfg.phi_kernel).to(h.dtype)
        recompute = cfg.activation_checkpointing != "none" and torch.is_grad_enabled()
        out = [checkpoint(self.exact_phi, xs, W, head, use_reentrant=False) if recompute
               else self.exact_phi(xs, W, head) for xs in x.split(chunk, dim=1)]
        return torch.cat(out, dim=1).to(h.dtype)

    def exact_phi(self, xs, W, head=None):
        """softmax(head(xs)/tau) @ W: decoded with the head's matrix (default W: tied), encoded with W."""
        logits = F.linear(xs, W if head is None else head)  # (B, chunk, V), activation dtype; only softmax upcasts
        scaled = logits / self.config.phi_tau if self.config.phi_tau != 1 else logits
        return F.softmax(scaled, dim=-1, dtype=upcast(logits).dtype) @ W

    # ---- forward -----------------------------------------------------------------------------
    def forward(self, idx, targets=None, n_loop=None, hook=None, sparse_targets=False, loops=None):
        """(logits (B, T, V), None) without targets; (None, mean loss) with targets (B, T), -1 = no target. The loss
        never materializes the (B, T, V) logits (LinearCrossEntropy, `loss_chunk`).
        n_loop: loops to run (default K): fewer reads the head early (Stage-1 = 1), more runs extra loops (not for
            recurrence='none', whose copies are untied).
        hook: optional hook(k, h, h_next) after loop k = 1..n_loop: h is f_theta's output (PonderLM: the full
            pass's), h_next what feeds loop k+1 (disco: the injected H~; ponder: the updated embedding; the last
            loop: h). A return value other than None replaces h_next: how probes read every loop and apply Eq. (2).
        sparse_targets: one target per question (QA data): the head and loss run on the rows that have one.
        loops: optional (B,) loop counts 1..n_loop: row b is read after loop loops[b] (train.py's loops_by_hops).
            Not checked here (a host sync): the caller's data is (dataset.check_with_data).
        """
        cfg, early = self.config, []  # loop_loss: the states of the loops before the last, each read by the head
        last = n_loop or cfg.n_loop

        def record(k, h, nxt):  # loop_loss: keep every earlier loop's state, then the caller's hook
            if k < last:
                early.append(h)
            return hook(k, h, nxt) if hook else None
        aux = self.training and targets is not None and cfg.loop_loss > 0 and loops is None
        h = self.hidden(idx, n_loop, record if aux else hook, loops=loops)  # (B, T, d)
        if targets is None:
            return self.head(h), None
        if sparse_targets:
            keep = targets.reshape(-1) != -1
            early = [e.reshape(-1, h.size(-1))[keep] for e in early]
            h, targets = h.reshape(-1, h.size(-1))[keep], targets.reshape(-1)[keep]  # (N, d), (N,)
        loss = [linear_cross_entropy(self.normed(e), self.lm_head.weight, targets, cfg.loss_chunk, cfg.label_smoothing)
                for e in [h] + early]
        if not early:
            return None, loss[0]
        # "rising": loop k weighs k (LayerSkip's early-exit loss grows with depth); "mean": every earlier loop alike
        weights = [k if cfg.loop_loss_weights == "rising" else 1 for k in range(1, len(early) + 1)]
        return None, loss[0] + cfg.loop_loss * sum(w * e for w, e in zip(weights, loss[1:])) / sum(weights)

    def hidden(self, idx, n_loop=None, hook=None, cache=None, loops=None, exits=None):
        """The final state that the LM head reads, (B, T, d): embed -> prelude -> K loops (loop_step) -> coda. See
        forward; cache (new_cache): idx continues the positions already cached, whose keys and values every loop
        reuses (generation). exits: an Exit (adaptive depth), which sets each token's loop as it settles."""
        cfg = self.config
        B, T = idx.size()
        t0 = cache[0][0].start() if cache is not None else 0  # an int, or each token's position (B, T): an engine's
        if not torch.is_tensor(t0) and t0 + T > cfg.block_size:  # an engine bounds positions itself (max_model_len)
            raise ValueError(f"sequence length {t0 + T} exceeds block_size={cfg.block_size}")
        K = cfg.n_loop if n_loop is None else n_loop
        if K < 1 or (self.rec.copies and K > cfg.n_loop):
            raise ValueError(f"n_loop={K} is invalid: allowed 1.."
                             f"{cfg.n_loop if self.rec.copies else 'any'} for recurrence={cfg.recurrence}")
        at = None  # (B, T): the loop each token is read after (a row's `loops`, or set as tokens exit)
        if loops is not None:
            at = loops[:, None].expand(B, T)
        if exits is not None:
            at = torch.full((B, T), K, device=idx.device)
            exits.loops.append(at)
        decoded = []  # adaptive depth: each loop's (decoded p, state h) (the kl rule and the gate read the one before)

        def settle(k, h):  # adaptive depth after loop k < K: the settled tokens exit here; the update encodes p
            p, stop = self.decode(h, decoded[-1] if decoded else None, exits)
            at.masked_fill_(stop & (at == K) & (k >= exits.min_loops), k)
            decoded.append((p, h))
            return p
        if cache is None and cfg.kv_share == "first" and K > 1:  # loops 2..K read loop 1's keys and values: kept here
            cache = self.new_cache(K)
        x, pos = self.embed(idx, t0)
        if cfg.n_prelude:
            x = self.f_theta(x, cache=cache[0] if cache is not None else None, part="prelude")
        for k in range(1, K + 1):
            done = None if exits is None else at < k  # tokens exited at an earlier loop: their state x stays
            read = settle if exits is not None and k < K else None
            h, x_next = self.loop_step(k, x, pos, cache[k - 1] if cache is not None else None, K, done, read)
            if h is None:  # every token exited: f_theta only stored their keys and values
                continue
            if hook is not None:
                replaced = hook(k, h, x_next)
                x_next = x_next if replaced is None else replaced
            if at is not None:  # tokens read after an earlier loop keep that loop's output
                out = h if k == 1 else torch.where((at < k)[..., None], out, h)
            x = x_next if done is None else torch.where(done[..., None], x, x_next)
        x = x if at is None else out
        if cfg.n_coda:  # the head reads the coda's output (after the loop, or after a row's own loop count)
            x = self.f_theta(x, cache=cache[0] if cache is not None else None, part="coda")
        if cache is not None and cfg.kv_share:  # this call's positions are earlier ones now
            for view in cache[0]:
                if isinstance(view, SharedView):  # (an engine's paged memory keeps its own positions)
                    view.slot.commit()
        return x

    def hidden_stepwise(self, idx, n_loop=None):
        """hidden() as generation computes it, one position a call through a new cache: what kv_share='latest' reads
        (each loop sees the last loop of every earlier position); the same as hidden() for the other keys."""
        cache = self.new_cache(n_loop)
        return torch.cat([self.hidden(idx[:, t:t + 1], n_loop, cache=cache) for t in range(idx.size(1))], dim=1)

    def loop_step(self, k, x, pos=None, cache=None, last=None, done=None, read=None):
        """Loop k of the recurrence for a set of positions, the one place its body is written: f_theta on what loop k
        reads (x; the learned positions again where the recurrence adds them) with loop k's keys and values (cache:
        one per layer), the per-loop norm, then the recurrence's update (between). Returns (h, x_next): f_theta's
        output, which the head reads after loop k, and what loop k+1 reads (h itself after loop `last`, default K).
        k: an int, or a (B,) tensor of one loop per row (speculative.py's pipeline runs rows at different loops in one
        call: tied loops only). done (B, T): exited tokens (adaptive depth; all of them: (None, x), only their keys and
        values stored). read(k, h): an exit's decoding after the norm, whose p the update then encodes."""
        cfg, rows = self.config, torch.is_tensor(k)
        last = cfg.n_loop if last is None else last
        if rows and self.rec.copies:
            raise ValueError("recurrence='none' has K untied copies: one call cannot run rows at different loops")
        x_in = x
        if pos is not None and self.rec.embed:  # a recurrence in embedding space runs the whole model every pass
            x_in = x + pos  # (PonderLM's GPT-2 adds the positions each time)
        elif pos is not None and cfg.pos_every_loop and rows:
            x_in = torch.where((k > 1)[:, None, None], x + pos, x)
        elif pos is not None and cfg.pos_every_loop and k > 1:
            x_in = x + pos
        h = self.f_theta(x_in, copy=k - 1 if self.rec.copies else 0, cache=cache, done=done)
        if done is not None and done.all():
            return None, x
        if cfg.per_loop_norm:  # Ouro: the normed state is what the next loop (and Phi) sees
            h = self.transformer.ln_f(h)
        p = read(k, h) if read is not None else None
        if rows:  # rows after the last loop pass h on, the others the update
            return h, torch.where((k == last)[:, None, None], h, self.between(h, x, p))
        return h, h if k == last else self.between(h, x, p)

    def embed(self, idx, t0=0):
        """(token embeddings, learned positions or None) of positions t0.. : positions join the tokens here once,
        unless the recurrence lives in embedding space (PonderLM adds them every pass)."""
        cfg = self.config
        B, T = idx.size()
        x = self.transformer.wte(idx)  # (B, T, d)
        if self.rec.embed:  # PonderLM's input scalings (hzby/PonderingLM): x sqrt(d) with scale_embeds (see
            x = x * self.emb_scale()  # between), x the TRAINED K-1 pondering steps, also when n_loop differs from K
            if cfg.ponder_multiply_steps:
                x = x * max(1, cfg.n_loop - 1)
        if cfg.pos_emb != "learned":
            return x, None
        where = t0 if torch.is_tensor(t0) else torch.arange(t0, t0 + T, device=idx.device)  # (B, T) or (T,)
        if self.training and cfg.pos_shift:
            if T + cfg.pos_shift > cfg.block_size:
                raise ValueError(f"pos_shift={cfg.pos_shift} with sequences of {T} tokens needs "
                                 f"block_size >= {T + cfg.pos_shift}, not {cfg.block_size}")
            where = where + torch.randint(0, cfg.pos_shift + 1, (B, 1), device=idx.device)  # (B, T)
        pos = self.transformer.wpe(where)  # (T, d) or (B, T, d)
        return (x, pos) if self.rec.embed else (x + pos, pos)

    def between(self, h, x, p=None):
        """The recurrence's update between two loops: what feeds the next loop, from this loop's output h and
        its input x. Every recurrence's update is here (and its facts in RECURRENCES)."""
        rec = self.config.recurrence
        if rec == "disco":  # Eq. (3)-(5): H~ = H + a * RMSNorm(Phi(H))
            return self.inject(h, p)
        if rec == "ponder":  # the embedding plus the expected embedding of the prediction, probs @ (W * scale)
            return x + self.emb_scale() * self.phi(h, p)
        return h  # loop (Eq. 1), none (the next untied copy)

    def inject(self, h, p=None):
        """H~ = H + a * RMSNorm(Phi(H)) (Eq. 3), with the fixed or learned gate (Eq. 5); p: Phi's decoded p."""
        e = self.phi(h, p)  # (B, T, d)
        alpha = self.gate(e).unsqueeze(-1) if self.config.disco_gate == "learned" else self.config.disco_alpha
        return h + alpha * self.transformer.ln_inj(e)

    def decode(self, h, before, exits):
        """(p = softmax(head(h)/tau) as Phi encodes it, the tokens settled (B, T) by the exit): one head application."""
        cfg = self.config  # a loop decodes no Phi: its exits read the plain head (phi_tau inert there, as in training)
        logits = upcast(self.head(h)) / (cfg.phi_tau if self.rec.phi else 1)
        k = cfg.phi_topk if self.rec.phi else 0
        if k:
            logits = logits.masked_fill(logits < logits.topk(k, dim=-1).values[..., -1:], -math.inf)
        p = logits.softmax(-1)
        return p, exits.settled(h, p, before)

    def gate(self, e):
        """The learned gate of Eq. (5), a_t = sigmoid(<w, Phi(H_t)> + b), (B, T), from e = Phi(H)."""
        return torch.sigmoid(e @ self.gate_w.to(e.dtype) + self.gate_b)

    def gate_values(self, h):
        """The learned gate for a post-loop state h (B, T); for probing where DiscoLoop injects."""
        return self.gate(self.phi(h))

    def emb_scale(self):
        """PonderLM's scale_embeds multiplies W by sqrt(d) in BOTH its uses: the input and the increment."""
        return math.sqrt(self.config.n_embd) if self.rec.embed and self.config.ponder_scale_embeds else 1.0

    def flops_per_token(self, T, recompute="none"):
        """Forward+backward FLOPs per token (PaLM appendix B estimate), counting every loop, plus what `recompute` (a
        policy) reruns: "block"/"auto" matmuls and attention, "attn" matmuls, "attn_mm" none counted; exact Phi unless
        "none"."""
        cfg = self.config
        looped = range(cfg.n_prelude, cfg.n_layer - cfg.n_coda)  # a prelude and a coda run once
        block_runs = sum(p.numel() * (1 if self.rec.copies or i not in looped else cfg.n_loop)
                         for i, b in enumerate(self.transformer.h) for p in b.parameters())
        L = self.depth()
        head = cfg.vocab_size * cfg.n_embd
        extra = 0  # Phi per injection: exact = head and mixing matmuls, forward and backward (2 x 6dV);
        if self.rec.phi:  # top-k = a forward-only head (2dV, TopkPhi) + O(kd)
            k = cfg.phi_topk
            extra = (cfg.n_loop - 1) * (2 * head + 12 * k * cfg.n_embd if k else 12 * head)
        total = 6 * (block_runs + head) + extra + 12 * L * cfg.n_embd * T
        if recompute in ("block", "auto", "attn"):
            total += 2 * block_runs + (0 if recompute == "attn" else 4 * L * cfg.n_embd * T)
        if recompute != "none" and self.rec.phi and not cfg.phi_topk:  # exact Phi chunks run again
            total += (cfg.n_loop - 1) * 4 * head
        return total

    def new_cache(self, n_loop=None):
        """An empty key/value cache for generation: one KVCache per (loop, layer), K x n_layer. It holds
        K * n_layer * T * 2 * n_kv_head * head size numbers per sequence (2d without GQA: 6.4 GB in fp32 at the 440M
        config's 8,192 tokens). With kv_share, one SharedSlot per layer seen by every loop (SharedView): 1/K of it."""
        K = n_loop or self.config.n_loop
        if not self.config.kv_share:
            return [[KVCache() for _ in range(self.config.n_layer)] for _ in range(K)]
        slots = [SharedSlot() for _ in range(self.config.n_layer)]
        return [[SharedView(s, k == 0 or self.config.kv_share == "latest") for s in slots] for k in range(K)]

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, n_loop=None, use_cache=True,
                 generator=None, n_vocab=None, exits=None, stop=None):
        """nanoGPT's generate: idx (B, T) and max_new_tokens more, each sampled from the head after n_loop loops
        (default K) among ids < n_vocab (default all: rows past a tokenizer's ids only pad the embedding).
        temperature 0 = greedy; top_k keeps the k likeliest (sampling_probs). With use_cache the prompt runs once and
        each new token runs through every loop alone, reusing the cached keys and values (new_cache); without, every
        step reruns the whole prefix. exits: an Exit (adaptive depth); stop(idx) True ends it early. Past block_size
        is an error, not a sliding window."""
        if idx.size(1) + max_new_tokens > self.config.block_size:
            raise ValueError(f"prompt ({idx.size(1)} tokens) + max_new_tokens={max_new_tokens} exceeds "
                             f"block_size={self.config.block_size}: shorten the prompt or ask for fewer tokens")
        cache = self.new_cache(n_loop) if use_cache else None
        new = idx
        for _ in range(max_new_tokens):
            h = self.hidden(new, n_loop, cache=cache, exits=exits)[:, -1]
            logits = self.head(h).float()[:, :n_vocab]  # (B, V)
            if temperature == 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                nxt = torch.multinomial(sampling_probs(logits, temperature, top_k), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
            new = nxt if use_cache else idx
            if stop is not None and stop(idx):
                break
        return idx


# ---- generation's choices: what a token is sampled from, when a token stops looping --------------------------------
def sampling_probs(logits, temperature, top_k=None):
    """The distribution generation samples from, of float logits (..., V): / temperature, the top_k likeliest,
    softmax. GPT.generate and speculative.py's decoders read it here. The top logit is subtracted first: a tiny
    temperature (1e-40) then sends the others to -inf, never the top one to inf (inf - inf: NaN)."""
    logits = (logits - logits.amax(-1, keepdim=True)) / temperature
    if top_k:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits.softmax(-1)


EXIT_RULES = ("prob", "kl", "gate")  # Exit's rules, named once: the scripts' keys (exit_rule) read this


@dataclass
class Exit:
    """Adaptive depth, at inference only: after loop k < n_loop a token stops once what it decodes (GPT.decode: p,
    with top-k Phi its top k renormalised) has settled by the rule: "prob": max p >= threshold; "kl": KL(p_k-1 || p_k)
    <= threshold (from loop 2 on); "gate": score(h, p, (p_k-1, h_k-1)) >= threshold. Its state then stays what feeds
    loop k+1; later tokens attend to its keys and values."""
    rule: str = "prob"
    threshold: float = 0.9
    min_loops: int = 1  # no exit before this many loops
    loops: list = None  # each forward appends its (B, T) exit loops (blocks run: these x the looped layers)
    score: object = None  # "gate": a learned exit's callable (h, p, (p, h) before or None) -> (B, T) in 0..1

    def __post_init__(self):
        self.loops = []
        hi = math.inf if self.rule == "kl" else 1
        rules = EXIT_RULES if callable(self.score) else EXIT_RULES[:2]  # 'gate' needs its score
        if self.rule not in rules or not 0 <= self.threshold <= hi or self.min_loops < 1:
            raise ValueError(f"exit rule={self.rule!r}, threshold={self.threshold!r}, min_loops={self.min_loops!r} "
                             f"is invalid: allowed rule 'prob', 'kl' or 'gate' (with a score), threshold 0..{hi}, "
                             "min_loops >= 1")

    def settled(self, h, p, before):
        """(B, T): the tokens this rule stops, from loop k's state h, its decoded p and loop k-1's (p, h) or None."""
        if self.rule == "gate":  # a learned exit reads the state and what it decodes
            return self.score(h, p, before) >= self.threshold
        if self.rule == "prob":
            return p.amax(-1) >= self.threshold
        if before is None:  # "kl" compares with the loop before: none at loop 1
            return torch.zeros(p.shape[:-1], dtype=torch.bool, device=p.device)
        return (before[0] * (before[0].clamp_min(1e-30).log() - p.clamp_min(1e-30).log())).sum(-1) <= self.threshold
