"""
Back-compat in one place: what older config files, command lines, checkpoints and data folders said, read as today's.
Every reader of those (configurator.py for config files and command lines, checkpoint.load_checkpoint for checkpoints,
prepare_tools.check_ours for a prepare script's own folders) goes through here, so retiring an old form is one deletion
in this file.
"""

import sys

# keys renamed since: Phi's settings drive PonderLM as well as DiscoLoop, so they are not called disco_*
RENAMED = {"disco_tau": "phi_tau", "disco_topk": "phi_topk", "disco_chunk": "phi_chunk"}


def renamed(d):
    """d with every old key name replaced by its new one."""
    return {RENAMED.get(k, k): v for k, v in d.items()}


# compute-only values retired since (a Phi kernel moved to lab/phi.py): they change no weight, so a checkpoint that
# names one reads as today's default, with one note
# ("fused", the Triton decode: 7.27x the matmul floor against auto's 5.71x on an H200 at 440M, lab/phi_triton.py)
RETIRED = {"phi_kernel": (("dense", "twostage", "unsorted", "fused"), "auto", "a Phi kernel moved to lab/phi.py")}


def retire(d, note="the checkpoint"):
    """d with every retired compute-only value replaced by its default, one note each on stderr naming where it was
    (note: 'the checkpoint', a config file, 'command line'; None: no note)."""
    for key, (old, default, what) in RETIRED.items():
        if isinstance(d.get(key), str) and d[key].split("+")[0] in old:
            if note:
                print(f"note: {note} has {key}={d[key]!r} ({what}; it changes no weight): read as {default!r}",
                      file=sys.stderr)
            d = {**d, key: default}
    return d


def upgrade_checkpoint(ckpt):
    """A loaded checkpoint (a dict) in today's form: renamed keys in its model_args and config, the precision it was
    trained in as 'dtype_resolved' (it was 'dtype', the name of the key that asks for one), and weight names without
    the '_orig_mod.' prefix that a whole-model torch.compile gave them before compile went per block."""
    if "dtype" in ckpt and "dtype_resolved" not in ckpt:
        ckpt["dtype_resolved"] = ckpt.pop("dtype")
    for key in ("model_args", "config"):
        if isinstance(ckpt.get(key), dict):
            ckpt[key] = retire(renamed(ckpt[key]), "the checkpoint" if key == "model_args" else None)  # config repeats it
    for key in ("model", "ema"):
        if isinstance(ckpt.get(key), dict):
            ckpt[key] = {k.removeprefix("_orig_mod."): v for k, v in ckpt[key].items()}
    return ckpt


# a prepare script's config keys added since its first folders: a folder it made without them is its own, made again
# (a QA folder: its other splits come out byte-identical, generation is deterministic and new keys only add splits)
ADDED_SINCE = {"symbolic": ("n_val", "pad_left"), "nl": ("n_val", "pad_left")}
# ... or kept, taken on trust (token shards without their tokenizer's hash: remaking a corpus is a job; train.py and
# the prepare script say so)
TRUSTED_SINCE = {"pretrain": ("tokenizer_sha256",)}


def old_folder(meta, generator, keys):
    """Why a prepare script's own folder is of an older form and is made again ('' if it is today's): meta.json
    from before it recorded its `kind`, or a config without a key added since (ADDED_SINCE)."""
    if meta.get("kind") is None:
        return "made before meta.json recorded its kind"
    missing = [k for k in keys if k not in meta.get("config", {}) and k in ADDED_SINCE.get(generator, ())]
    return f"made before {missing[0]!r} existed" if missing else ""


# exits.py gate's file before each checkpoint had its own (from_checkpoint.gate_path): one exit_gate.pt beside ckpt.pt
OLD_GATE_FILE = "exit_gate.pt"


# What earlier commits wrote where the project writes, before those files carried ownership.MARK, by writer
# (ownership.OWNERS): only a proof counts, never a shape (a user's file may share any shape). A checkpoint proves itself
# by the CRC-32 of its whole content written inside it (common.content_crc: no file matches it by accident); the plan
# cache by the mark of its own it carried then. Anything else unmarked is left as it is: ownership.target writes beside.
# Each test is f(obj, checksum): checksum is common.content_crc, handed in (this file imports nothing of ours).
OLD_WRITERS = {
    "checkpoint": lambda o, crc: type(o.get("crc32")) is int and "model_args" in o and
    crc({k: v for k, v in o.items() if k != "crc32"}) == o["crc32"],
    "plan cache": lambda o, crc: o.get("discoloop_plan_cache") == 1,  # that commit's own mark
}


def old_writer(writer, obj, checksum):
    """Whether obj (a loaded JSON object, first row or torch dict) is `writer`'s file of an earlier commit, proven
    (checksum: common.content_crc)."""
    test = OLD_WRITERS.get(writer)
    return bool(test) and test(obj, checksum)
