"""
Folders: whose a folder is, whether a script may write into it, and what a data folder's meta.json says.

The one rule (owner/claim): a script writes only into a folder that is absent, empty, or provably its own. What a
folder is, is read from what it holds: meta.json = a prepared folder (its `kind`: 'qa' question-answer splits,
qa_data.py; 'tokens' token shards, shards.py; 'tasks' lm-eval task YAMLs; 'model' pretrained weights; and its
`generator`, the data/<generator>/prepare.py that made it, with that script's `config`); a config.json of
model_type 'discoloop' = an export_hf.py folder; any other config.json, weights or tokenizer files = a Hugging Face
(or someone's) model; train.py's own config.json record, its run.lock or its ckpt.pt = a run folder (a metrics.jsonl
alone proves nothing: anyone may name a file so).
Anything else is nobody's we know, and is left untouched.
"""
import os

from discoloop.common import DataError, is_ours, read_json

KINDS = ("qa", "tokens", "tasks", "model")  # tasks: lm-eval task YAMLs (data/benchmarks); model: pretrained weights (data/smollm2)
MODEL_FILES = (".safetensors", ".bin", ".gguf", ".pt", "tokenizer.json", "tokenizer_config.json")  # a model's files


def _pairs(v):  # a split's shard list: [[file name, token count], ...]
    return isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
                                       and type(p[1]) is int and p[1] >= 0 for p in v)


_STR, _INT1 = (lambda v: isinstance(v, str), "a string"), (lambda v: type(v) is int and v >= 1, "an integer >= 1")
_INT0 = (lambda v: type(v) is int and v >= 0, "an integer >= 0")
# Every meta.json field a reader uses, by the kind the file names: (field, required?, (predicate, what is allowed));
# 'config.x' is a field of its 'config' object (the prepare script's arguments). One reader checks them all.
META_FIELDS = {
    None: [("config", False, (lambda v: isinstance(v, dict), "an object")), ("generator", False, _STR)],
    "tokens": [("shards", True, (lambda v: isinstance(v, dict) and all(_pairs(x) for x in v.values()),
                                 "an object of splits, each a list of [file, token count]")),
               ("dtype", True, (lambda v: v in ("uint16", "uint32"), "'uint16' or 'uint32'")),
               ("vocab_size", True, _INT1), ("eot", False, _INT0), ("encoding", False, _STR),
               ("config.encoding", False, _STR), ("config.tokenizer_file", False, _STR),
               ("config.tiktoken_file", False, _STR), ("config.tokenizer_eot", False, _STR),
               ("config.tokenizer_sha256", False, (lambda v: isinstance(v, str) and len(v) == 64, "a sha256 hex string"))],
    "qa": [("splits", True, (lambda v: isinstance(v, dict) and v and all(
               isinstance(i, dict) and isinstance(i.get("file"), str) and isinstance(i.get("train"), bool)
               for i in v.values()), "an object of splits, each with a 'file' name and 'train' true or false")),
           ("vocab", True, (lambda v: isinstance(v, list) and v and all(isinstance(t, str) for t in v),
                            "a list of token strings")),
           ("checksums", False, (lambda v: isinstance(v, dict), "an object"))],
}


def read_meta(data_dir):
    """meta.json as a dict, or a one-line DataError naming the file and the field: missing, not JSON, not an
    object, a field a reader uses missing or of the wrong type or shape (META_FIELDS, by the kind it names)."""
    path = os.path.join(data_dir, "meta.json")
    if not os.path.isfile(path):
        raise DataError(f"no prepared dataset at '{data_dir}' ({'a file' if os.path.isfile(data_dir) else 'no meta.json'})")
    meta = read_json(path)
    for field, required, (ok, allowed) in META_FIELDS[None] + META_FIELDS.get(meta.get("kind"), []):
        *parent, name = field.split(".")
        where = meta.get(parent[0], {}) if parent else meta
        if name not in where:
            if required:
                raise DataError(f"'{path}' lacks '{field}' (a {meta['kind']} folder's): prepare the folder again")
            continue
        if not ok(where[name]):
            raise DataError(f"'{path}': {field}={str(where[name])[:60]!r} is invalid: allowed {allowed} (damaged: "
                            "prepare the folder again)")
    for split, info in meta["splits"].items() if meta.get("kind") == "qa" else ():  # the split, named
        if not (type(info.get("hops", 1)) is int and info.get("hops", 1) >= 1):
            raise DataError(f"'{path}': splits.{split}.hops={info['hops']!r} is invalid: allowed 'hops' >= 1, an integer "
                            "(damaged: prepare the folder again)")
    return meta


def kind_of(meta):
    """The folder's kind, as its meta.json names it."""
    kind = meta.get("kind")
    if kind not in KINDS:
        raise DataError(f"meta.json names kind={kind!r}: allowed {KINDS} (a folder prepared before meta.json named "
                        "its kind: prepare it again)")
    return kind


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
    """A run's own run.lock (empty or its holder's PID: runlog.lock_run_folder) or ckpt.pt (the mark, common.owned);
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


