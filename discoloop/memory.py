"""
Memory of one training step, measured on CPU and planned for a GPU we do not have.

Activations are measured, not guessed: `measure_step` runs the configured model's forward and
backward under a TorchDispatchMode that follows every storage an op creates until it is freed
(`LiveBytes`). With real CPU tensors that is a measurement; under FakeTensorMode the same code
runs the full 440M shape at the configured micro-batch without allocating or computing anything,
so the plan measures the real shape directly (attention is a flash kernel on CPU and GPU: no T x T
matrix is kept). tests/test_memory.py holds the plan's figures to real tensors and to an
independent count of what autograd saves.

    python bench.py plan config/pretrain.py           # the per-rank plan, against 80 and 141 GB
    python bench.py plan config/pretrain.py --activation_checkpointing=auto   # every policy, and what 'auto' picks
"""
import contextlib
import weakref
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from discoloop.common import table
from model import GPT, RECURRENCES, GPTConfig
from muon import takes_muon

GB = 1e9
GPUS = {"H100 80GB": 80e9, "H200 141GB": 141e9}
HEADROOM = 0.9  # plan at most 90% of the device: CUDA context, NCCL buffers and allocator fragmentation
AUTO_ORDER = ("none", "attn_mm", "attn", "block")  # activation_checkpointing by what it recomputes, least first
AUTO_MARGIN = 0.85  # 'auto' keeps its plan within 85% of the device: HEADROOM less 5% for the plan's own error


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages created inside the mode that are still alive (`now`) and their
    maximum (`peak`). Views share their base's storage and are counted once. Copies of
    parameters to a lower precision (autocast) are counted apart, in `weight_copies`."""

    def __init__(self, params=()):
        super().__init__()
        self.now = self.peak = self.weight_copies = 0
        self.live = {}
        self.params = {p.untyped_storage()._cdata for p in params}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        is_copy = (func is torch.ops.aten._to_copy.default and isinstance(args[0], torch.Tensor)
                   and args[0].untyped_storage()._cdata in self.params)
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                key = st._cdata  # the StorageImpl's address: one entry per storage, fake or real
                if key in self.live or key in self.params:
                    continue
                n = st.nbytes()
                self.live[key] = (n, is_copy)
                if is_copy:
                    self.weight_copies += n
                self.now += n
                self.peak = max(self.peak, self.now)
                weakref.finalize(st, self._free, key)  # storages keep their Python object while alive
        return out

    def _free(self, key):
        n, is_copy = self.live.pop(key)
        self.now -= n
        if is_copy:
            self.weight_copies -= n


def measure_step(cfg, B, T, dtype=torch.bfloat16, fake=True):
    """One forward + backward of GPT(cfg) on (B, T) tokens, as a gradient-accumulation micro-step:
    the gradients already exist (made by an untracked first step), so they are not counted here.
    Returns bytes: act = kept from forward to backward (activations), copies = low-precision
    weight copies among what forward keeps, peak = the most alive at any moment of forward +
    backward (activations, recomputed blocks, chunk buffers: everything but resident state)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() if fake else contextlib.nullcontext():
        m = GPT(cfg)
        x = torch.randint(0, cfg.vocab_size, (B, T))
        y = torch.randint(0, cfg.vocab_size, (B, T))
        for tracked in (False, True):
            live = LiveBytes(m.parameters())
            with live if tracked else contextlib.nullcontext():
                # CPU autocast stands in for CUDA's: both keep matmul outputs in bf16, reductions in fp32
                with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                    _, loss = m(x, y)
                act, copies = live.now, live.weight_copies
                loss.backward()
    return {"act": act - copies, "copies": copies, "peak": live.peak}


def param_groups(model, optimizer):
    """Parameter counts (Muon, AdamW) as train.configure_optimizers splits them."""
    muon = adamw = 0
    for n, p in model.named_parameters():
        if optimizer == "muon" and takes_muon(n, p):
            muon += p.numel()
        else:
            adamw += p.numel()
    return muon, adamw


@dataclass
class Plan:
    rows: dict          # name -> bytes per rank
    detail: dict        # analytic sizes of the largest transients, for reading the measured peak
    total: float
    tokens_per_step: int


def plan(c, world_size, dtype=torch.bfloat16):
    """Per-rank memory plan of train.py's config dict `c` for a GPU run (bf16 autocast, DDP with
    gradient_as_bucket_view, so no second copy of the gradients). Activations and the backward peak
    are measured on the configured model at the configured micro-batch with fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    # csr and fused Phi (a bincount, a Triton kernel: no fake-tensor shapes) keep at most bag's: planned as bag
    cfg = GPTConfig.from_dict({**c, "phi_kernel": "bag" if c["phi_kernel"] in ("csr", "fused") else c["phi_kernel"]})
    B, T = c["batch_size"], c["block_size"]
    with FakeTensorMode():
        model = GPT(cfg)
        n_params = sum(p.numel() for p in model.parameters())
        muon, adamw = param_groups(model, c["optimizer"])
        matmul = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "wpe" not in n)
    r = measure_step(cfg, B, T, dtype, fake=True)
    rows = {
        "parameters (fp32)": 4 * n_params,
        "gradients (fp32)": 4 * n_params,
        "AdamW state (2 x fp32)": 8 * adamw,
        "Muon momentum (fp32)": 4 * muon,
        "bf16 weight copies (autocast cache, all matmul weights)": 2 * matmul if dtype != torch.float32 else 0,
        f"activations kept for backward ({B} x {T} tokens)": r["act"],
        "backward peak above them (recompute, chunk buffers)": r["peak"] - r["act"] - r["copies"],
    }
    V, d = cfg.vocab_size, cfg.n_embd
    kv = (cfg.n_kv_head or cfg.n_head) * (d // cfg.n_head)  # k and v width: n_kv_head heads (grouped-query attention)
    detail = {
        f"a logits chunk ({cfg.loss_chunk or B * T} rows x V: bf16 + fp32 + bf16 grad)": (cfg.loss_chunk or B * T) * V * 8,
        f"a Phi chunk ({B} x {cfg.phi_chunk or T} x V bf16 logits)":
            B * (cfg.phi_chunk or T) * V * 2 if RECURRENCES[cfg.recurrence].phi else 0,
        "attention of one layer (flash: q, k, v, out bf16 + fp32 logsumexp)": B * T * ((2 * d + 2 * kv) * 2 + cfg.n_head * 4),
    }
    accum_local = max(1, c["gradient_accumulation_steps"] // world_size)
    return Plan(rows=rows, detail=detail, total=sum(rows.values()), tokens_per_step=B * T * accum_local * world_size)


def fits(p, device_bytes):
    return p.total <= HEADROOM * device_bytes


def device_bytes(device):
    """A CUDA device's memory in bytes; 0 for any other device (nothing is planned against it)."""
    return torch.cuda.get_device_properties(device).total_memory if str(device).startswith("cuda") else 0


def pick_checkpointing(total_of, capacity):
    """activation_checkpointing='auto' on a device of `capacity` bytes: the first policy of AUTO_ORDER whose plan,
    total_of(policy) bytes, fits AUTO_MARGIN of it, planned in that order until one fits; "block" (the least memory)
    where none does, and without a memory figure (capacity 0: a CPU plans nothing and picks alike on every machine)."""
    return next((a for a in AUTO_ORDER if capacity and total_of(a) <= AUTO_MARGIN * capacity), "block")


def auto_note(picked, planned, capacity, where="this GPU"):
    """The line that says what 'auto' picked on a device of `capacity` bytes, from which plans ({policy: bytes})."""
    return (f"activation_checkpointing='auto' -> {picked!r} on {where} ({capacity / GB:.0f} GB): the least recompute "
            f"({' < '.join(AUTO_ORDER)}) whose plan fits {AUTO_MARGIN:.0%} of it, {AUTO_MARGIN * capacity / GB:.1f} GB; "
            "planned: " + ", ".join(f"{a} {t / GB:.2f}" for a, t in planned.items()) + " GB")


def check_fits(c, world_size, dtype, capacity, check=True, show=True):
    """(policy, why): c's activation_checkpointing, 'auto' resolved for a device of `capacity` bytes (pick_checkpointing;
    0: not CUDA, nothing planned), and None or the one line that says why its plan does not fit HEADROOM of the device
    and what to change (train.py stops with it before allocating). check=False: no fit test. show: print the plan."""
    plans, asked = {}, c["activation_checkpointing"]

    def total_of(policy):
        plans[policy] = plans.get(policy) or plan({**c, "activation_checkpointing": policy}, world_size, dtype)
        return plans[policy].total
    policy = pick_checkpointing(total_of, capacity) if asked == "auto" else asked
    if show and asked == "auto" and not capacity:
        print(f"activation_checkpointing='auto' -> {policy!r}: no GPU memory to fit here (a CPU plans nothing), so the "
              "least memory, alike on every such machine")
    if not capacity or not (check or plans):  # a CPU, or a GPU told not to check a given policy
        return policy, None
    total = total_of(policy)
    if show and asked == "auto":
        print(auto_note(policy, {a: p.total for a, p in plans.items()}, capacity))
    if show:
        print(format_plan(plans[policy], {**c, "activation_checkpointing": policy}, world_size))
    if not check or total <= HEADROOM * capacity:
        return policy, None
    return policy, (f"the memory plan needs {total / 1e9:.1f} GB per rank, more than 90% of this GPU's "
                    f"{capacity / 1e9:.0f} GB: lower batch_size (raise gradient_accumulation_steps), set "
                    f"activation_checkpointing='block', or pass --memory_check=False to try anyway")


def format_plan(p, c, world_size):
    lines = [f"memory plan per rank ({RECURRENCES[c['recurrence']].label}, K={c['n_loop']}, micro-batch {c['batch_size']} x "
             f"{c['block_size']}, {c['gradient_accumulation_steps']} micro-steps over {world_size} ranks = "
             f"{p.tokens_per_step:,} tokens per step, activation_checkpointing={c['activation_checkpointing']!r}):",
             table(["item", "GB"], [[k, f"{v / GB:.2f}"] for k, v in p.rows.items()]
                   + [["**total**", f"**{p.total / GB:.2f}**"]]
                   + [[f"(inside the peak) {k}", f"{v / GB:.2f}"] for k, v in p.detail.items()])]
    for name, cap in GPUS.items():
        lines.append(f"{name}: {p.total / GB:.1f} GB planned, {HEADROOM * cap / GB:.0f} GB usable (90%) -> "
                     + ("fits" if fits(p, cap) else "DOES NOT FIT"))
    return "\n".join(lines)
