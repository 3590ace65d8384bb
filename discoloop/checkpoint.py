"""
Checkpoints: written atomically, loaded without running code, checked against their content checksum;
the keys a resume may change. (The rest of the run folder, metrics and config.json, is runlog.py's.)

A checkpoint is a dict of tensors and plain Python values only: model and optimizer state, the
GPTConfig fields (`model_args`), the full training config, iteration, RNG states and the
dataset's generating config. `torch.load(weights_only=True)` therefore suffices, so loading
someone else's file cannot execute their code.
"""
import os
import shutil
import sys

import torch

from discoloop.common import CheckpointError, ConfigError, atomic_write, content_crc, not_regular, tmp_name
from discoloop.ownership import marked, owned
from discoloop.compat import renamed, retire, upgrade_checkpoint
from configurator import COMMAND_LINE
from discoloop.curriculum import joins_changed
from model import ARCH_KEYS, GPT, GPTConfig


def save_checkpoint(obj, path):
    """temp file + fsync + rename: a kill at any moment leaves either the old or the new file. A
    failed write (disk full) removes its temp file and raises a one-line CheckpointError."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    obj = marked(obj, "checkpoint")  # ownership.owned: only a file with the mark is ever replaced or deleted
    obj = {**obj, "crc32": content_crc(obj)}
    try:
        atomic_write(path, lambda f: torch.save(obj, f), durable=True)
    except (OSError, RuntimeError) as e:  # torch.save reports a full disk as RuntimeError
        reason = getattr(e, "strerror", None) or (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise CheckpointError(f"could not write '{path}' ({reason}); the previous checkpoint, if any, is kept") from None


def earlier_work(out_dir, eval_only=False):
    """An earlier run's files in out_dir, which a new run deletes and a resume may replace: ckpt.pt and ckpt_<iter>.pt,
    each carrying the project's mark (ownership.owned: a user's file of that name is one line, never touched), and a
    non-empty metrics.jsonl (its first row's mark, or a checkpoint of ours beside it: a run before the mark).
    eval_only reads ckpt.pt and appends a row: it replaces nothing, so nothing is asked of the rest."""
    names = [n for n in sorted(os.listdir(out_dir)) if n == "ckpt.pt" or n[:5] + n[-3:] == "ckpt_.pt" and n[5:-3].isdigit()]
    metrics = os.path.join(out_dir, "metrics.jsonl")
    try:
        for n in [] if eval_only else names:
            owned(os.path.join(out_dir, n), "checkpoint", "checkpoint", "replaced or deleted")
        if not names and not eval_only:
            owned(metrics, "metrics", "metrics.jsonl")
    except ConfigError as e:
        raise CheckpointError(f"out_dir {out_dir!r}: {e}") from None
    return names + (["metrics.jsonl"] if os.path.isfile(metrics) and os.path.getsize(metrics) else [])


def keep_copy(path, copy_path):
    """copy_path holds path's checkpoint as it is now: a hard link where the file system has them (ckpt.pt is
    replaced by rename, never written in place, so the link keeps this version), else a copy."""
    tmp = tmp_name(copy_path)
    try:
        os.link(path, tmp)
    except OSError:
        shutil.copyfile(path, tmp)
    os.replace(tmp, copy_path)


# which model keys size each weight (by a part of its name): what a mismatch names
SIZED_BY = (("wpe", "block_size, pos_emb"), ("c_attn", "n_embd, n_head, n_kv_head, bias, qkv_bias"),
            ("mlp.c_fc", "n_embd, n_hidden, mlp, bias"), ("mlp.c_proj", "n_hidden, mlp, bias"),
            ("wte", "vocab_size, n_embd"), ("lm_head", "vocab_size, tie_embeddings"), ("gate_", "disco_gate"),
            ("ln_inj", "recurrence"), ("ln_", "norm, bias, sandwich_norm"), ("attn.c_proj", "n_embd, bias"))


def sizes_match(args, weights, where):
    """model_args against the weights present (their names and shapes), before any module is built: a record of
    100,000 layers beside the weights of one is one line naming the keys that make the size, not minutes of building;
    then every weight's shape against the model these args build on the meta device (no memory, no time): a hand-edited
    n_hidden, n_kv_head, mlp or block_size is one line naming the weight and the keys that size it."""
    blocks = {k.split(".")[2] for k in weights if k.startswith("transformer.h.")}
    copies = args.get("n_loop", 1) if args.get("recurrence") == "none" else 1
    want = args.get("n_layer", 0) * copies if isinstance(copies, int) else None
    keys = f"n_layer={args.get('n_layer')!r}" + (f" x n_loop={copies!r} (recurrence='none': untied copies)" if copies != 1 else "")
    wte = weights.get("transformer.wte.weight")
    why = (f"{keys} make {want} blocks, its weights hold {len(blocks)}" if want != len(blocks) else
           f"vocab_size={args.get('vocab_size')!r}, n_embd={args.get('n_embd')!r}, its embedding is {tuple(wte.shape)}"
           if wte is not None and tuple(wte.shape) != (args.get("vocab_size"), args.get("n_embd")) else None)
    if not why:
        try:
            with torch.device("meta"):
                built = GPT(GPTConfig.from_dict(args)).state_dict()
        except (TypeError, ValueError):
            built = None  # the config's own validator names it where the model is built
        for name, w in (weights.items() if built is not None else ()):
            shape = tuple(built[name].shape) if name in built else None
            if shape != tuple(w.shape):
                sized = next((k for part, k in SIZED_BY if part in name), "the architecture keys")
                args_say = f"{list(shape)} for these model_args" if shape else "no such weight in the model they build"
                why = f"{name} is {list(w.shape)} in the file, {args_say} (sized by {sized})"
                break
    if why:
        raise CheckpointError(f"'{where}': its model_args do not describe its weights ({why}): damaged or hand-edited; "
                              "use another copy")


RESUME_KEYS = ("model", "model_args", "optimizers", "config", "iter_num", "rng_cpu")


def load_checkpoint(path, map_location="cpu", required=("model", "model_args")):
    if os.path.isdir(path):
        path = os.path.join(path, "ckpt.pt")
    if not os.path.isfile(path):
        is_, folder = not_regular(path), os.path.dirname(path) or "."  # a pipe would block torch.load for ever
        kept = [f for f in os.listdir(folder) if f[:5] == "ckpt_" and f[5:-3].isdigit() and f[-3:] == ".pt"] \
            if not is_ and os.path.isdir(folder) else []  # a folder of kept checkpoints (keep_every) without ckpt.pt
        hint = f" (its folder holds {', '.join(sorted(kept, key=lambda f: int(f[5:-3])))}: allowed one of them)"
        raise CheckpointError(f"checkpoint '{path}' {'is ' + is_ if is_ else 'not found'}{hint if kept else ''}")
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
    if isinstance(ckpt, dict) and "crc32" in ckpt and content_crc({k: v for k, v in ckpt.items() if k != "crc32"}) != ckpt["crc32"]:
        raise CheckpointError(f"'{path}' is damaged: its content does not match the checksum written with it "
                              "(flipped or overwritten bytes); use another copy")
    return {**upgrade_checkpoint(ckpt), "path": path}  # an older checkpoint reads as today's; its errors name the file


# The keys a resume may change: the budget, intervals, stopping, logging, and where and how fast it runs.
# Everything else (model, data, optimizer, schedule, batch, seed, precision, EMA) is what the weights were
# trained with: the checkpoint's config is the truth, and a resume that differs is refused, naming the key.
# (split_join is listed: its own rule, joins_acted, lets only joins that have not acted yet move.)
RESUMABLE = ("max_iters", "eval_interval", "keep_every", "log_interval", "eval_iters", "eval_batch_size", "stage1_splits", "eval_only", "init_from",
             "overwrite", "stop_metric", "stop_patience", "split_join", "threads", "device", "compile", "compile_mode", "cuda_graph", "phi_kernel",
             "memory_check", "activation_checkpointing",  # memory, not numbers: equal gradients (tests/test_checkpointing.py)
             "peak_flops", "wandb_log", "wandb_project", "wandb_run_name", "out_dir", "data_dir", "data_args")


def resume_changes(saved, config, saved_dtype, defaults):
    """({key: [checkpoint's, now]} this resume changes, None) or (None, a one-line reason it may not). A key newer than
    the checkpoint reads as its default (defaults: every key's, train.py's; its older behaviour); dtype may be 'auto' or
    the precision it was trained in."""
    saved = {**defaults, **saved}
    changed = {}
    for k, now in config.items():
        if (k not in saved or saved[k] == now or k in ("init_from", "overwrite", "eval_only")  # how it is invoked
                or (k == "dtype" and now in ("auto", saved_dtype))):
            continue
        if k == "dtype":
            return None, (f"dtype: the checkpoint was trained with {saved_dtype or saved[k]!r}"
                          f"{' (dtype=auto resolved so)' if saved[k] == 'auto' else ''}, now {now!r}; a resume may change only "
                          f"what does not change the numbers: allowed dtype='auto' or {saved_dtype or saved[k]!r}")
        if k not in RESUMABLE:
            return None, (f"{k}: the checkpoint was trained with {saved[k]!r}, now {now!r}; a resume may change "
                          f"only {', '.join(RESUMABLE)}")
        changed[k] = [saved[k], now]
    return changed, None


def load_for_resume(path, config, data_config, rows, defaults):
    """(checkpoint, {key: [checkpoint's, now]} this resume changes), or a one-line CheckpointError: the model,
    the data's generating config and the curriculum's acted joins must be what the weights were trained with."""
    ckpt = load_checkpoint(path, required=RESUME_KEYS)
    sizes_match(ckpt["model_args"], ckpt["model"], path)  # before the model is built from them
    changes, why = resume_changes(ckpt["config"], config, ckpt.get("dtype_resolved"), defaults)
    # phi_kernel may change: the same numbers up to rounding and ties
    model_keys = [k for k in GPTConfig.__dataclass_fields__ if k not in RESUMABLE]
    why = why or config_mismatch(ckpt["model_args"], config, model_keys) \
        or config_mismatch(ckpt.get("data_config", {}), data_config, list(data_config)) \
        or joins_changed(ckpt["config"].get("split_join", {}), config["split_join"], rows, ckpt["iter_num"])
    if why:
        raise CheckpointError(f"cannot resume from {path}: {why}")
    return ckpt, changes


def resume_architecture(path, config, stated):
    """init_from=resume: {architecture key (pretrained.ARCH_KEYS): the checkpoint's value} for every key the command
    line does not type. The weights decide their architecture, as a Hugging Face folder does on a branch: a run
    branched from one took these from the folder over its config file's, and its own command (the folder's name
    replaced by 'resume') continues it; a config file's other value is noted, one line per key, as the branch noted
    it. Typed keys stay, for load_for_resume to compare (and refuse). Only the record is read (tensors are mapped,
    not loaded); {} when it cannot be read, and load_for_resume says why."""
    if not os.path.isfile(path):  # absent, or a pipe (torch.load would block): the full load says which
        return {}
    try:
        saved = retire(renamed(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["model_args"]),
                       None)  # the full load that follows notes what it retires
    except Exception:  # not there, damaged, not ours: the full load that follows gives the one-line reason
        return {}
    take = {k: saved[k] for k in ARCH_KEYS if k in saved and stated.get(k) != COMMAND_LINE}
    for k, v in take.items():
        if k in stated and config.get(k) != v:
            print(f"note: {k}={v!r} of the checkpoint replaces {k}={config[k]!r} of {stated[k]} (the weights decide "
                  "their architecture)", file=sys.stderr)
    return take


def restore_training(ckpt, path, optimizers, ema, device_type, need_optimizer=True):
    """A resumed run's optimizer state, RNG states and weight average, from its checkpoint (the weights are
    loaded with the model). Without optimizer state a fresh optimizer would not continue the run: refused."""
    if need_optimizer and (len(ckpt["optimizers"]) != len(optimizers) or not all(s.get("state") for s in ckpt["optimizers"])):
        raise CheckpointError(f"cannot resume from {path}: it holds no optimizer state for this run's "
                              f"{len(optimizers)} optimizer(s); a fresh optimizer would not continue the run")
    for opt, state in zip(optimizers, ckpt["optimizers"]):
        opt.load_state_dict(state)
    torch.set_rng_state(ckpt["rng_cpu"])
    if device_type == "cuda" and "rng_cuda" in ckpt:
        torch.cuda.set_rng_state(ckpt["rng_cuda"])
    if ema is not None and "ema" in ckpt:
        ema.load_state_dict(ckpt["ema"])


def config_mismatch(saved, wanted, keys):
    """First key whose value differs, as a one-line reason, or None."""
    for k in keys:
        if k in saved and k in wanted and saved[k] != wanted[k]:
            return f"{k}: checkpoint has {saved[k]!r}, now {wanted[k]!r}"
    return None
