"""
Folders: whose a folder is, and whether a script may write into it (what a data folder's meta.json says, its one
checked reader: data_meta.py).

The one rule (owner/claim): a script writes only into a folder that is absent, empty, or provably its own. What a
folder is, is read from what it holds: meta.json = a prepared folder (its `kind`, data_meta.KINDS, and its
`generator`, the data/<generator>/prepare.py that made it, with that script's `config`); a config.json of
model_type 'discoloop' = an export_hf.py folder; any other config.json, weights or tokenizer files = a Hugging Face
(or someone's) model; train.py's own config.json record, its run.lock or its ckpt.pt = a run folder (a metrics.jsonl
alone proves nothing: anyone may name a file so).
Anything else is nobody's we know, and is left untouched.
"""
import os

from discoloop.common import DataError, read_json
from discoloop.data_meta import read_meta
from discoloop.ownership import is_ours

MODEL_FILES = (".safetensors", ".bin", ".gguf", ".pt", "tokenizer.json", "tokenizer_config.json")  # a model's files


def hf_folder(path):
    """Whether path is a Hugging Face model folder (config.json, no ckpt.pt), not a run folder or a checkpoint."""
    return (isinstance(path, str) and os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))
            and not os.path.exists(os.path.join(path, "ckpt.pt")))


def _json_object(path):
    """A JSON object file's content, or None for anything else (owner() only looks; the folder's reader says why)."""
    try:
        return read_json(path)
    except DataError:
        return None


def _marked_run_file(path):
    """A run's own run.lock (empty or its holder's PID: runlog.lock_run_folder) or ckpt.pt (the mark, ownership.owned);
    a user's file of either name proves nothing."""
    if not os.path.isfile(path):
        return False
    if path.endswith("run.lock"):
        with open(path, "rb") as f:
            return f.read(33).strip().isdigit() or os.path.getsize(path) == 0
    return is_ours(path, "checkpoint")


def owner(path):
    """Who wrote the folder at path: None (absent or empty), 'train.py', 'export_hf.py', 'data/<generator>/prepare.py',
    or a description of someone else's ('a Hugging Face model', 'unknown files ...'). A file or a path under a file
    is a DataError; a symbolic link is read as the folder it points to."""
    above = os.path.abspath(path)
    while not os.path.exists(above):
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        raise DataError(f"'{path}' is {'a file' if above == os.path.abspath(path) else f'under {above!r}, a file'}, "
                        "not a folder: choose a folder")
    if not os.path.isdir(path) or not os.listdir(path):
        return None
    names = set(os.listdir(path))
    if "meta.json" in names:
        gen = read_meta(path).get("generator")  # a damaged meta.json is its own one line
        if not isinstance(gen, str) or not gen:
            return "an unknown prepared folder (meta.json)"
        return f"data/{gen}.py" if "/" in gen else f"data/{gen}/prepare.py"  # 'pretrain/local_task': a script beside
    config = _json_object(os.path.join(path, "config.json")) if "config.json" in names else None
    if config is not None and config.get("model_type") == "discoloop":
        return "export_hf.py"
    if config is not None and {"init_from", "out_dir", "resumes", "dtype_resolved", "recurrence"} <= set(config):
        return "train.py"  # its record (RunLog.start): the folder is a run's, whatever else a user put beside it
    model_files = any(n.endswith(MODEL_FILES) and not n.startswith("ckpt") for n in names)
    run_files = {n for n in names & {"run.lock", "ckpt.pt"} if _marked_run_file(os.path.join(path, n))}
    if config is None and run_files and not model_files:
        return "train.py"  # its lock or checkpoint beside a torn or hand-edited config.json: still a run's
    if "config.json" in names or model_files:
        return "a Hugging Face model (config.json, weights or tokenizer files)"
    if run_files:  # proof: its lock (the first thing it writes) or its checkpoint
        return "train.py"
    return f"unknown files {sorted(names)[:3]} (no run.lock, no config.json of train.py's)"


def claim(path, writer, key="out_dir"):
    """The one rule: `writer` may write into path only if it is absent, empty or the writer's own; otherwise one line
    naming what the folder is, and nothing is touched. Returns True if the folder already holds the writer's work."""
    who = owner(path)
    if who is not None and who != writer:
        kind = (_json_object(os.path.join(path, "meta.json")) or {}).get("kind")
        what = f"{kind!r} data made by {who}" if who.startswith("data/") else \
            f"a folder made by {who}" if who.endswith(".py") else who
        raise DataError(f"{key}={path!r} holds {what}, not "
                        f"{writer}'s: {writer} writes only into an absent, empty or its own folder; left untouched, "
                        "choose another folder")
    return who is not None


