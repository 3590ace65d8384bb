"""
Checkpoints: written atomically, loaded without running code.

A checkpoint is a dict of tensors and plain Python values only: model and optimizer state, the
GPTConfig fields (`model_args`), the full training config, iteration, RNG states and the
dataset's generating config. `torch.load(weights_only=True)` therefore suffices, so loading
someone else's file cannot execute their code.
"""
import os

import torch

from model import GPT, GPTConfig


class CheckpointError(ValueError):
    pass


def save_checkpoint(obj, path):
    """temp file + fsync + rename: a kill at any moment leaves either the old or the new file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


RESUME_KEYS = ("model", "model_args", "optimizers", "config", "iter_num", "rng_cpu")


def load_checkpoint(path, map_location="cpu", required=("model", "model_args")):
    if os.path.isdir(path):
        path = os.path.join(path, "ckpt.pt")
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint '{path}' not found")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # empty, truncated, foreign or code-carrying pickles all end here
        first = (str(e).strip().splitlines() or ["no detail"])[0]
        if "weights_only" in first or "Weights only load failed" in first:
            first = "it holds objects other than tensors and plain values"  # never advise weights_only=False
        size = os.path.getsize(path)
        raise CheckpointError(f"'{path}' is not a readable checkpoint ({size} bytes; {type(e).__name__}: "
                              f"{first[:200]})") from None
    for key in required:
        if not isinstance(ckpt, dict) or key not in ckpt:
            raise CheckpointError(f"'{path}' is not a complete discoloop checkpoint (no '{key}' entry)")
    return ckpt


def strip_compile_prefix(state_dict):
    # torch.compile wraps the module as _orig_mod; checkpoints from older code may carry the prefix
    return {k.removeprefix("_orig_mod."): v for k, v in state_dict.items()}


def model_from_checkpoint(ckpt, use_ema=True, **overrides):
    """Rebuild the GPT of a checkpoint (its weight average when it has one and use_ema);
    overrides (e.g. disco_alpha) change config fields."""
    try:
        config = GPTConfig(**{**ckpt["model_args"], **overrides})
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint model config is invalid: {e}") from None
    model = GPT(config)
    weights = ckpt["ema"] if use_ema and "ema" in ckpt else ckpt["model"]
    missing, unexpected = model.load_state_dict(strip_compile_prefix(weights), strict=False)
    if missing or unexpected:
        raise CheckpointError(f"checkpoint does not match its config: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")
    return model


def config_mismatch(saved, wanted, keys):
    """First key whose value differs, as a one-line reason, or None."""
    for k in keys:
        if k in saved and k in wanted and saved[k] != wanted[k]:
            return f"{k}: checkpoint has {saved[k]!r}, now {wanted[k]!r}"
    return None
