"""
Prepared data folders: what a folder is, whether a script may touch it, and the prepare scripts.

Every folder's meta.json names its `kind` ('qa': question-answer splits, tasks.py; 'tokens': token
shards, shards.py; 'tasks': lm-eval task YAMLs, data/benchmarks) and its `generator` (the data/<generator>/prepare.py that made it) with that
script's `config`. The rule every prepare script follows: it deletes or rewrites only a folder it can
prove it made, i.e. same kind, same generator, same config. Anything else is one line and stays
untouched. Folders written before meta.json named kind and generator are recognized by their config
keys (exactly this generator's, less keys added since).
"""
import contextlib
import fcntl
import json
import os

from common import DataError

KINDS = ("qa", "tokens", "tasks", "model")  # tasks: lm-eval task YAMLs (data/benchmarks); model: pretrained weights (data/smollm2)


def read_meta(data_dir):
    """meta.json as a dict, or a one-line DataError (missing, not JSON, not an object)."""
    path = os.path.join(data_dir, "meta.json")
    if not os.path.isfile(path):
        raise DataError(f"no prepared dataset at '{data_dir}' (missing meta.json)")
    try:
        with open(path, "rb") as f:
            meta = json.loads(f.read().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"'{path}' is not valid JSON ({getattr(e, 'msg', 'not UTF-8')})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("config", {}), dict):
        raise DataError(f"'{path}' is not a dataset description (a JSON object with 'config')")
    return meta


def kind_of(meta):
    """'qa' or 'tokens'; folders from before meta.json named it are told apart by their contents."""
    kind = meta.get("kind") or ("qa" if "vocab" in meta or "splits" in meta else "tokens")  # older folders
    if kind not in KINDS:
        raise DataError(f"meta.json names kind={kind!r}: allowed {KINDS}")
    return kind


def generator_of(meta, generators_keys):
    """The generator that made a folder: meta['generator'], or for an older folder the one of
    `generators_keys` ({name: (keys, keys added since)}) whose config keys it has exactly."""
    if "generator" in meta:
        return meta["generator"]
    have = set(meta.get("config", {}))
    for name, (keys, added) in generators_keys.items():
        if have <= set(keys) and set(keys) - have <= set(added):
            return name
    return None


def check_ours(out_dir, kind, generator, config, keys, added=()):
    """May `generator` (writing `kind` folders from `config`) use out_dir? 'absent' (make it), 'same'
    (made by it with this config), 'upgrade' (made by it with this config before a key in `added` existed);
    otherwise a DataError naming what the folder is, and nothing is touched."""
    if not os.path.exists(out_dir):
        return "absent"
    if not os.path.isdir(out_dir):
        raise DataError(f"'{out_dir}' is a file, not a data folder")
    if not os.path.exists(os.path.join(out_dir, "meta.json")):
        if not os.listdir(out_dir):
            return "absent"
        raise DataError(f"'{out_dir}' exists and is not a prepared dataset (no meta.json): left untouched; "
                        "choose another folder or empty it")
    meta = read_meta(out_dir)
    have_kind = kind_of(meta)
    made_by = generator_of(meta, {generator: (keys, added)})
    if have_kind != kind or made_by != generator:
        raise DataError(f"'{out_dir}' holds a {have_kind!r} dataset made by {made_by or 'another generator'}, "
                        f"not by data/{generator}/prepare.py: left untouched; choose another folder")
    have = meta.get("config", {})
    for k in keys:
        if k in have and have[k] != config[k]:
            raise DataError(f"'{out_dir}' was prepared with {k}={have[k]!r}, not {config[k]!r}: left untouched; "
                            "delete it or choose another folder")
    missing = [k for k in keys if k not in have]
    return "upgrade" if missing or "generator" not in meta else "same"


@contextlib.contextmanager
def prepare_lock(out_dir):
    """Two processes preparing one folder take turns: an exclusive lock on the parent folder (the
    data folder itself is replaced by a rename), released by the kernel if the holder dies."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    fd = os.open(parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
