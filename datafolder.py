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
import importlib.util
import json
import os

REPO = os.path.dirname(os.path.abspath(__file__))
KINDS = ("qa", "tokens", "tasks")  # tasks: lm-eval task YAMLs and their data (data/benchmarks)


class DataError(ValueError):
    """A dataset folder that cannot be used as it is (missing, damaged, inconsistent, not ours): one line."""


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


def load_prepare(generator):
    """data/<generator>/prepare.py as a module (its DEFAULTS, prepare(), ...)."""
    path = os.path.join(REPO, "data", generator, "prepare.py")
    if not os.path.isfile(path):
        raise DataError(f"no data/{generator}/prepare.py: allowed {sorted(generators())}")
    spec = importlib.util.spec_from_file_location(f"prepare_{generator}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def open_data(dataset, data_dir, data_args, block_size, eval_iters, seed, split_join, make=True, barrier=None):
    """The training data of a folder, by the kind its meta.json names: QAData (question-answer folders) or
    TokenData (token shards), one interface (vocab_size, config, seq_len, steps_per_epoch, get_batch,
    evaluate, metric_names). make: run data/<dataset>/prepare.py first where it says that is cheap (QA
    folders: a no-op when this generator made the folder with this config), or for a token corpus when
    data_args says how; barrier: under DDP, the other ranks wait for rank 0's prepare."""
    from configurator import merge  # imported here: these modules read folders through this one
    from shards import TokenData
    from tasks import QAData
    prep = load_prepare(dataset)
    if make and (prep.ON_FIRST_USE or (data_args and not os.path.exists(os.path.join(data_dir, "meta.json")))):
        prep.prepare(merge(prep.DEFAULTS, {**data_args, "out_dir": data_dir}, "data_args"))
    if barrier:
        barrier()
    meta = read_meta(data_dir)
    if meta.get("generator", dataset) != dataset:
        raise DataError(f"data_dir={data_dir!r} holds data made by data/{meta['generator']}/prepare.py, "
                        f"not dataset={dataset!r}")
    if kind_of(meta) == "tokens":
        if split_join:
            raise DataError(f"split_join={split_join!r} is for QA datasets; a token corpus has no splits to join")
        return TokenData(data_dir, block_size, eval_iters, seed)
    # a join by rule ('acc/val_id>=0.9') is not known yet: the split waits until train.py sets it
    return QAData(data_dir, block_size, {s: None if isinstance(j, str) else j for s, j in split_join.items()})


def generators():
    return [d for d in os.listdir(os.path.join(REPO, "data")) if os.path.isfile(os.path.join(REPO, "data", d, "prepare.py"))]


class WordVocab:
    """The tokenizer of a question-answer folder: its tokens are the words of meta.json's vocabulary."""

    def __init__(self, vocab):
        self.vocab, self.stoi = vocab, {t: i for i, t in enumerate(vocab)}
        self.n_vocab, self.eot_token = len(vocab), None

    def encode_ordinary(self, text):
        unknown = [w for w in text.split() if w not in self.stoi]
        if unknown:
            raise DataError(f"{unknown[:3]} not in this dataset's vocabulary (e.g. {self.vocab[:5]})")
        return [self.stoi[w] for w in text.split()]

    def decode(self, ids):
        return " ".join(self.vocab[i] for i in ids)


def tokenizer_for(ckpt):
    """The tokenizer a checkpoint was trained with: for token shards the encoding data/pretrain/prepare.py
    recorded (tiktoken, bytes, or a tokenizer.json), for a question-answer folder its vocabulary."""
    data_config = ckpt.get("data_config", {})
    if "encoding" in data_config:  # token shards: the generator config says how to rebuild the encoder
        prep = load_prepare("pretrain")
        return prep.get_encoding({**prep.DEFAULTS, **data_config})
    return WordVocab(read_meta(ckpt["config"]["data_dir"])["vocab"])
