"""
What a data folder's meta.json says, read by one checked reader (read_meta) that imports nothing of the project but
common.py: a reader of a prepared folder (qa_data.py, shards.py, dataset.py) needs no ownership rule to read it. Its
`kind` (KINDS): 'qa' question-answer splits, qa_data.py; 'tokens' token shards, shards.py; 'tasks' lm-eval task YAMLs;
'model' pretrained weights. Its `generator`: the data/<generator>/prepare.py that made it, with that script's `config`.
Whose a folder is: folder_owner.py.
"""
import os

from discoloop.common import DataError, read_json, read_unchanged

KINDS = ("qa", "tokens", "tasks", "model")  # tasks: lm-eval task YAMLs (data/benchmarks); model: pretrained weights (data/smollm2)


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
    meta = read_unchanged(path, read_json)  # read once per process while unchanged
    if not isinstance(meta.get("kind", ""), str):  # a list or an object would be an unhashable key below
        raise DataError(f"'{path}': kind={str(meta['kind'])[:60]!r} is invalid: allowed {KINDS} (damaged: prepare the "
                        "folder again)")
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
    if not isinstance(kind, str) or kind not in KINDS:
        raise DataError(f"meta.json names kind={kind!r}: allowed {KINDS} (a folder prepared before meta.json named "
                        "its kind: prepare it again)")
    return kind
