"""
open_data: a prepared folder's training data, by the kind its meta.json names (qa_data.QAData for question-answer
folders, shards.TokenData for token shards: one interface), prepared first by data/<dataset>/prepare.py where
that is cheap. The one place that picks a prepare script by the dataset's name, and so where its contract is:

    DEFAULTS      {key: default}: the script's arguments (its --help), out_dir among them
    CHECKS        {key: (predicate, what is allowed)}: each argument's one check (configurator.merge runs them)
    prepare(c)    makes c['out_dir'] (c: DEFAULTS merged with data_args) and records in its meta.json the `kind`
                  (data_meta.KINDS), the `generator` (the dataset's name) and the `config` it was made from
    ON_FIRST_USE  True: train.py runs prepare() at every start (a no-op when the folder is this config's; question-
                  answer sets, seconds); False: only when data_args say how and the folder is not there (a corpus)
    KIND          optional, 'model': the script makes pretrained model folders (init_from=data/<name>/<folder>)

A question-answer script is its parameters, checks and a build function (prepare_tools.prepare_qa is the sequence).
Then check_with_data: the training keys that can only be checked against the opened data.
"""
import importlib
import os

from discoloop.common import ConfigError, DataError, weights_fit
from configurator import merge
from discoloop.curriculum import check_against
from discoloop.folder_owner import hf_folder
from discoloop.data_meta import kind_of, read_meta
from model import RECURRENCES, GPTConfig
from discoloop.tokenizer import check_folder_tokenizer, check_shards_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def generators():
    return sorted(d for d in os.listdir(os.path.join(REPO, "data")) if os.path.isfile(os.path.join(REPO, "data", d, "prepare.py")))


def load_prepare(generator):
    """data/<generator>/prepare.py as a module, checked to follow the contract (the module docstring)."""
    if generator not in generators():
        raise DataError(f"dataset={generator!r} has no data/{generator}/prepare.py: allowed {generators()}")
    prep = importlib.import_module(f"data.{generator}.prepare")
    lacks = [n for n in ("DEFAULTS", "CHECKS", "prepare", "ON_FIRST_USE") if not hasattr(prep, n)]
    if lacks:
        raise DataError(f"data/{generator}/prepare.py lacks {lacks[0]}: a prepare script defines DEFAULTS, CHECKS, "
                        "prepare(c) and ON_FIRST_USE (dataset.py's docstring)")
    return prep


def open_data(dataset, data_dir, data_args, block_size, eval_iters, seed, split_join, make=True, barrier=None, qa=None):
    """The training data of a folder, by the kind its meta.json names: QAData (question-answer folders) or
    TokenData (token shards), one interface (vocab_size, config, seq_len, steps_per_epoch, get_batch,
    evaluate, metric_names). make: run data/<dataset>/prepare.py first where it says that is cheap (QA
    folders: a no-op when this generator made the folder with this config), or for a token corpus when
    data_args says how; barrier: under DDP, the other ranks wait for rank 0's prepare; qa: QAData's options."""
    prep = load_prepare(dataset)
    if make and (prep.ON_FIRST_USE or (data_args and not os.path.exists(os.path.join(data_dir, "meta.json")))):
        prep.prepare(merge(prep.DEFAULTS, {**data_args, "out_dir": data_dir}, "data_args", prep.CHECKS))
    if barrier:
        barrier()
    if not os.path.exists(os.path.join(data_dir, "meta.json")) and not data_args and not prep.ON_FIRST_USE:
        raise DataError(f"data_dir={data_dir!r} holds no prepared dataset, and dataset={dataset!r} is not prepared on "
                        f"first use without data_args: run python data/{dataset}/prepare.py --out_dir={data_dir} first")
    meta = read_meta(data_dir)
    if meta.get("generator", dataset) != dataset:
        raise DataError(f"data_dir={data_dir!r} holds data made by data/{meta['generator']}/prepare.py, "
                        f"not dataset={dataset!r}")
    if kind_of(meta) == "tokens":
        from discoloop.shards import TokenData  # each kind's reader is loaded by the runs that read that kind only
        if split_join:
            raise DataError(f"split_join={split_join!r} is for QA datasets; a token corpus has no splits to join")
        if data_args:
            record = {k: meta[k] for k in ("encoding",) if k in meta}  # shards made by hand record it here alone
            check_made_with(prep.DEFAULTS, data_args, {**record, **meta.get("config", {})}, data_dir)
        return TokenData(data_dir, block_size, eval_iters, seed, meta)  # meta.json read once, handed on
    from discoloop.qa_data import QAData  # (as TokenData above)
    # a join by rule ('acc/val_id>=0.9') is not known yet: the split waits until train.py sets it
    return QAData(data_dir, block_size, {s: None if isinstance(j, str) else j for s, j in split_join.items()}, meta=meta,
                  **(qa or {}))


def check_made_with(defaults, data_args, have, data_dir):
    """A token corpus is prepared once: data_args (its script's defaults where they are silent, as a prepare would
    take them) that say otherwise than the folder's record in any field would be ignored, so are refused in one
    line. Fields the folder does not record (max_tokens, num_proc) are not compared."""
    unknown = sorted(set(data_args) - set(defaults))
    if unknown:
        raise ConfigError(f"data_args key {unknown[0]!r} is not an argument of this dataset's prepare script: allowed "
                          f"{sorted(k for k in defaults if k != 'out_dir')}")
    want = {**defaults, **data_args}
    skip = check_tokenizer_made_with(want, data_args, have, data_dir)
    for k in [*data_args, *(k for k in have if k not in data_args)]:
        if k not in have or k not in want or k == "out_dir" or k in skip:
            continue
        v, h = want[k], have[k]
        same_path = isinstance(v, str) and isinstance(h, str) and v and h and os.path.abspath(v) == os.path.abspath(h)
        if v != h and not same_path:
            said = "" if k in data_args else " (the script's default where data_args are silent)"
            raise ConfigError(f"data_args {k}={v!r}{said}, but data_dir '{data_dir}' holds shards made with {k}={h!r}: "
                              "a corpus is prepared once, so data_args would be ignored; allowed the folder's value, "
                              "another data_dir, or --data_args={} (the folder as it is)")


def check_tokenizer_made_with(want, data_args, have, data_dir):
    """The tokenizer first, as a whole: a tokenizer_file decides the ids whatever `encoding` says, so data_args that
    name another tokenizer than the shards' (encoding='bytes' against shards of a tokenizer.json) are refused naming
    both, and where both sides name the same tokenizer file their `encoding` fields are not compared. Returns the
    fields settled here."""
    if "encoding" not in have and not have.get("tokenizer_file"):
        return set()

    def key(c):  # what decides the ids
        return ("file", os.path.abspath(c["tokenizer_file"])) if c.get("tokenizer_file") else ("encoding", c.get("encoding"))

    def words(c, given, other_file):  # given: the data_args (their defaults are said), None for the folder's record
        note = lambda k: " (the script's default where data_args are silent)" if given is not None and k not in given else ""
        if c.get("tokenizer_file"):
            return f"tokenizer_file={c['tokenizer_file']!r}{note('tokenizer_file')}"
        enc = f"encoding={c.get('encoding')!r}{note('encoding')}"
        return f"tokenizer_file=''{note('tokenizer_file')} and {enc}" if other_file and "tokenizer_file" in c else enc
    if key(want) != key(have):
        raise ConfigError(f"data_args {words(want, data_args, bool(have.get('tokenizer_file')))}, but data_dir "
                          f"'{data_dir}' holds shards made with {words(have, None, bool(want.get('tokenizer_file')))}: "
                          "a corpus is prepared once, so data_args would be ignored; allowed the folder's tokenizer, "
                          "another data_dir, or --data_args={} (the folder as it is)")
    return {"encoding", "tokenizer_file"} if want.get("tokenizer_file") else {"encoding"}


def prepare_weights(path):
    """init_from=data/<generator>/<folder> that is not there yet, where data/<generator>/prepare.py makes pretrained
    model folders (KIND 'model', e.g. data/smollm2): made now, so a config that starts from one runs on first use."""
    rel = os.path.relpath(os.path.abspath(path), os.path.join(REPO, "data")).split(os.sep)
    if os.path.exists(path) or len(rel) != 2 or rel[0] not in generators():
        return
    prep = load_prepare(rel[0])
    if getattr(prep, "KIND", None) == "model":
        prep.prepare(merge(prep.DEFAULTS, {"out_dir": os.path.abspath(path)}, "init_from", prep.CHECKS))


def check_with_data(config, data, defaults):
    """The keys that are checked against the training data (train.py, once the folder is open): metric names,
    the position shift, the vocabulary, and a first batch that the mix at iteration 0 can fill. defaults: the
    keys' defaults (train_config's: this module sits below the key file)."""
    check_data_belongs(config, data, defaults)
    names, val = data.metric_names, [m for m in data.metric_names if "val" in m]
    check_against(config["split_join"], names)
    if config["stop_metric"] and config["stop_metric"] not in names:
        raise ConfigError(f"stop_metric={config['stop_metric']!r} is not among this dataset's metrics: {val}")
    shift, block = config["pos_shift"], config["block_size"]
    if shift and data.seq_len + shift > block:
        raise ConfigError(f"pos_shift={shift} with training sequences of {data.seq_len} tokens needs block_size >= "
                          f"{data.seq_len + shift}, not {block}")
    if config["vocab_size"] and config["vocab_size"] < data.vocab_size:
        raise ConfigError(f"vocab_size={config['vocab_size']} is smaller than the dataset's vocabulary ({data.vocab_size})")
    try:  # vocab_size 0 is the data's: the model keys' one validator again, at that size (phi_topk <= it)
        GPTConfig.from_dict({**config, "vocab_size": config["vocab_size"] or data.vocab_size})
    except ValueError as e:
        raise ConfigError(f"{e} (the vocabulary of '{config['data_dir']}')") from None
    weights_fit({**config, "vocab_size": config["vocab_size"] or data.vocab_size}, "the model keys", ConfigError)
    if config["loops_by_hops"] or config["extra_loops"]:
        check_loops_by_hops(config, data)
    first = int((data.row_join == 0).sum()) if data.kind == "qa" else None  # QA: examples in the mix at 0
    batch, accum = config["batch_size"], config["gradient_accumulation_steps"]
    if first is not None and batch * accum > first:
        raise ConfigError(f"batch_size={batch} x gradient_accumulation_steps={accum} is more than the {first} training "
                          f"examples in the mix at iteration 0 of '{config['data_dir']}': allowed at most {first}")


def check_data_belongs(config, data, defaults):
    """The data is the one the config and the starting weights mean: Stage-1 splits are asked only of question-answer
    data (data_args against a corpus's folder: dataset.check_made_with); the tokenizer its shards name is still the one they were made with; an init_from folder's own tokenizer is the
    data's."""
    d, corpus = config["data_dir"], data.kind == "tokens"
    if corpus and config["stage1_splits"] != defaults["stage1_splits"]:
        raise ConfigError(f"stage1_splits={config['stage1_splits']!r} names question-answer splits; '{d}' is a token "
                          f"corpus (no splits): allowed only the default {defaults['stage1_splits']!r}")
    check_shards_tokenizer(data.config, d)
    init = config["init_from"]
    if init not in ("scratch", "resume") and hf_folder(init):
        check_folder_tokenizer(init, data, d)


def check_loops_by_hops(config, data):
    """loops_by_hops reads a k-hop question after k loops: QA data, and k loops that the model can run."""
    if not config["loops_by_hops"]:
        raise ConfigError(f"extra_loops={config['extra_loops']} adds loops to loops_by_hops's; allowed 0 without it")
    if data.kind != "qa":
        raise ConfigError("loops_by_hops=True is for question-answer data (a k-hop question after k loops); "
                          f"'{config['data_dir']}' is a token corpus")
    K, copies, extra = config["n_loop"], RECURRENCES[config["recurrence"]].copies, config["extra_loops"]
    for s in data.splits:  # training rows: hops + up to extra_loops loops; evaluation: k loops for k hops
        need = data.hops(s) + (extra if s in data.train_splits else 0)
        if need > K and (s in data.train_splits or copies):
            raise ConfigError(f"loops_by_hops=True: split {s!r} needs {need} loops ({data.hops(s)} hops"
                              f"{f' + extra_loops={extra}' if s in data.train_splits and extra else ''}), more than "
                              f"n_loop={K} {'untied copies' if copies else 'trained loops'}: allowed n_loop >= {need}")
