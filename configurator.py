"""
nanoGPT's configurator, done safely. Usage from a script with module-level defaults:

    python train.py config/symbolic.py --batch_size=256 --compile=False

The config file is plain Python assignments, executed in its own namespace (not the script's);
then each --key=value is parsed with ast.literal_eval (bare words stay strings). Every key must
already exist in the defaults and keep its type (an int is accepted where a float is expected).
Any mistake is a ConfigError with one line naming the bad key or value; scripts turn it into an
exit with status 2 via `die`.
"""
import ast
import difflib
import math
import os
import re
import sys

from datafolder import DataError


class ConfigError(ValueError):
    pass


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def _closest(key, allowed):
    near = difflib.get_close_matches(key, allowed, n=1)
    return f" (did you mean '{near[0]}'?)" if near else ""


def merge(defaults, overrides, source):
    """defaults updated by a dict of overrides, each key and type checked as on the command line."""
    return {**defaults, **{RENAMED.get(k, k): _check(k, v, defaults, source) for k, v in overrides.items()}}


# keys renamed since: config files, command lines and checkpoints (checkpoint.load_checkpoint) with an old name
# keep working. Phi's settings drive PonderLM as well as DiscoLoop, so they are not called disco_*.
RENAMED = {"disco_tau": "phi_tau", "disco_topk": "phi_topk", "disco_chunk": "phi_chunk"}


def renamed(d):
    """d with every old key name replaced by its new one."""
    return {RENAMED.get(k, k): v for k, v in d.items()}


def _check(key, value, defaults, source):
    key = RENAMED.get(key, key) if key not in defaults else key
    if key not in defaults:
        raise ConfigError(f"unknown config key '{key}' in {source}{_closest(key, list(defaults))}")
    want = type(defaults[key])
    if want is float and type(value) is int:
        return float(value)
    if type(value) is not want:
        raise ConfigError(f"{key}={value!r} in {source} has type {type(value).__name__}, "
                          f"expected {want.__name__} (default {defaults[key]!r})")
    return value


def _num(lo=None, hi=None, lo_open=False, hi_open=False):
    """A predicate for finite numbers in a range, and its text."""
    def ok(v):
        return (math.isfinite(v) and (lo is None or (v > lo if lo_open else v >= lo))
                and (hi is None or (v < hi if hi_open else v <= hi)))
    lo_s = "" if lo is None else f"{lo} {'<' if lo_open else '<='} "
    hi_s = "" if hi is None else f" {'<' if hi_open else '<='} {hi}"
    return ok, f"a finite number {lo_s}x{hi_s}".replace("number  x", "number x")


def _one_of(*allowed):
    return (lambda v: v in allowed), f"one of {allowed}"


JOIN_RULE = re.compile(r"^\s*([\w/]+)\s*(>=|<=)\s*([-+.\w]+)\s*$")


def parse_join_rule(rule):
    """'acc/val_id>=0.9' -> ('acc/val_id', '>=', 0.9). A one-line ValueError for anything else."""
    m = JOIN_RULE.match(rule)
    try:
        value = float(m.group(3)) if m else math.nan
    except ValueError:
        value = math.nan
    if not m or not math.isfinite(value):
        raise ConfigError(f"split_join rule {rule!r} is invalid: allowed 'metric>=number' or 'metric<=number', "
                          "e.g. 'acc/val_id>=0.9'")
    metric, op = m.group(1), m.group(2)
    never = (metric.startswith("acc") and (value > 1 if op == ">=" else value < 0)) or \
        (metric.startswith("loss") and op == "<=" and value < 0)
    if never:  # accuracies lie in [0, 1], losses are >= 0: the split would silently never join
        raise ConfigError(f"split_join rule {rule!r} can never hold ({metric} lies in "
                          f"{'[0, 1]' if metric.startswith('acc') else '[0, inf)'})")
    if "test" in metric:
        raise ConfigError(f"split_join rule {rule!r}: a test split must not steer training; use a validation "
                          "or training metric")
    return metric, op, value


def _split_join(v):
    """{training split: iteration >= 0 or a rule}; a bad rule raises its own one-line ConfigError."""
    for when in v.values():
        if isinstance(when, str):
            parse_join_rule(when)
        elif not isinstance(when, int) or isinstance(when, bool) or when < 0:
            return False
    return isinstance(v, dict)



def _stop_metric(v):  # the end point may be chosen by a validation split only (never train, never test)
    return v == "" or v == "val_loss" or (v.count("/") == 1 and v.split("/")[0] in ("acc", "acc1", "loss")
                                          and v.split("/")[1].startswith("val"))


# The one validator of each non-model key, applied by configure() for every script that has the key
# (train.py, bench.py, probe.py, eval_harness.py, the prepare scripts). Model keys are GPTConfig's to check.
CHECKS = {
    "dtype": _one_of("auto", "float32", "bfloat16", "float16"),
    "init_from": _one_of("scratch", "resume"),
    "optimizer": _one_of("adamw", "muon"),
    "lr_schedule": _one_of("cosine", "linear"),
    "learning_rate": _num(0, lo_open=True),
    "min_lr": _num(0),
    "weight_decay": _num(0),
    "grad_clip": _num(0),
    "beta1": _num(0, 1, hi_open=True),
    "beta2": _num(0, 1, hi_open=True),
    "adam_eps": _num(0, lo_open=True),
    "ema_decay": _num(0, 1, hi_open=True),
    "muon_momentum": _num(0, 1, hi_open=True),
    "peak_flops": _num(0),
    "stop_metric": (_stop_metric, "'' or a validation metric such as 'acc/val_id', 'loss/val_id' or 'val_loss' "
                                  "(a training or test split must not choose the end point)"),
    "out_dir": (lambda v: v.strip() != "", "a folder path"),
    "split_join": (_split_join, "a dict {training split: iteration (an integer >= 0) or a rule such as "
                                "'acc/val_id>=0.9'}"),
}
for _k in ("batch_size", "gradient_accumulation_steps", "eval_interval", "log_interval", "eval_batch_size",
           "eval_iters", "stop_patience", "iters", "num_proc", "shard_tokens", "batch_docs", "max_tokens", "n",
           "world_size"):
    CHECKS[_k] = (lambda v: v >= 1, "an integer >= 1")
for _k in ("max_iters", "warmup_iters", "lr_decay_iters", "seed", "warmup", "val_tokens", "limit"):
    CHECKS[_k] = (lambda v: v >= 0, "an integer >= 0")
CHECKS["threads"] = (lambda v: v >= 0, "0 (torch default) or an integer >= 1")
CHECKS["extra_loops"] = (lambda v: v >= 0, "an integer >= 0")
OUTPUT_FILES = ("json", "png")  # written at the end of a script's work: their folder is made and checked first


def check(config):
    """Every key's validator, then the relations between keys; a one-line ConfigError at the first bad value."""
    for k, (ok, allowed) in CHECKS.items():
        if k in config:
            try:
                good = ok(config[k])
            except TypeError:  # e.g. a string where the rule compares numbers
                good = False
            if not good:
                raise ConfigError(f"{k}={config[k]!r} is invalid: allowed {allowed}")
    if {"min_lr", "learning_rate"} <= set(config) and config["min_lr"] > config["learning_rate"]:
        raise ConfigError(f"min_lr={config['min_lr']} is above learning_rate={config['learning_rate']}: "
                          "the schedule decays to min_lr, so allowed min_lr <= learning_rate")
    for k in OUTPUT_FILES:
        if config.get(k):
            check_output_file(k, config[k])


def check_with_data(config, data):
    """The keys that are checked against the training data (train.py, once the folder is open): metric names,
    the position shift, the vocabulary, and a first batch that the mix at iteration 0 can fill."""
    names, val = data.metric_names, [m for m in data.metric_names if "val" in m]
    for split, rule in config["split_join"].items():
        if isinstance(rule, str) and parse_join_rule(rule)[0] not in names:
            raise ConfigError(f"split_join[{split!r}]={rule!r}: {parse_join_rule(rule)[0]!r} is not a metric of this "
                              f"dataset (e.g. {val})")
    if config["stop_metric"] and config["stop_metric"] not in names:
        raise ConfigError(f"stop_metric={config['stop_metric']!r} is not among this dataset's metrics: {val}")
    shift, block = config["pos_shift"], config["block_size"]
    if shift and data.seq_len + shift > block:
        raise ConfigError(f"pos_shift={shift} with training sequences of {data.seq_len} tokens needs block_size >= "
                          f"{data.seq_len + shift}, not {block}")
    if config["vocab_size"] and config["vocab_size"] < data.vocab_size:
        raise ConfigError(f"vocab_size={config['vocab_size']} is smaller than the dataset's vocabulary ({data.vocab_size})")
    if config["loops_by_hops"] or config["extra_loops"]:
        check_loops_by_hops(config, data)
    first = int((data.row_join == 0).sum()) if hasattr(data, "row_join") else None  # QA: examples in the mix at 0
    batch, accum = config["batch_size"], config["gradient_accumulation_steps"]
    if first is not None and batch * accum > first:
        raise ConfigError(f"batch_size={batch} x gradient_accumulation_steps={accum} is more than the {first} training "
                          f"examples in the mix at iteration 0 of '{config['data_dir']}': allowed at most {first}")


def check_loops_by_hops(config, data):
    """loops_by_hops reads a k-hop question after k loops: QA data, and k loops that the model can run."""
    from model import RECURRENCES  # model.py imports this module
    if not config["loops_by_hops"]:
        raise ConfigError(f"extra_loops={config['extra_loops']} adds loops to loops_by_hops's; allowed 0 without it")
    if not hasattr(data, "hops"):
        raise ConfigError("loops_by_hops=True is for question-answer data (a k-hop question after k loops); "
                          f"'{config['data_dir']}' is a token corpus")
    K, copies, extra = config["n_loop"], RECURRENCES[config["recurrence"]].copies, config["extra_loops"]
    for s in data.splits:  # training rows: hops + up to extra_loops loops; evaluation: k loops for k hops
        need = data.hops(s) + (extra if s in data.train_splits else 0)
        if need > K and (s in data.train_splits or copies):
            raise ConfigError(f"loops_by_hops=True: split {s!r} needs {need} loops ({data.hops(s)} hops"
                              f"{f' + extra_loops={extra}' if s in data.train_splits and extra else ''}), more than "
                              f"n_loop={K} {'untied copies' if copies else 'trained loops'}: allowed n_loop >= {need}")


def check_output_file(key, path):
    """Before the work: the file's folder exists (made now if missing) and is writable, and path is no folder."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{key}={path!r}: cannot make its folder ({e.strerror})") from None
    if os.path.isdir(path) or not os.access(folder, os.W_OK):
        raise ConfigError(f"{key}={path!r} is not a writable file path")


def script_defaults(path):
    """{key: (default, meaning)} for the `key = literal  # meaning` lines at the top level of a
    script such as train.py, read from its source without running it (for --help and bench.py plan)."""
    with open(path) as f:
        src = f.read()
    lines = src.splitlines()
    out = {}
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in ("defaults", "config_keys"):
            break  # the end of the defaults block
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and not node.targets[0].id.startswith("_")):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            if isinstance(value, (int, float, bool, str, dict)):
                line = lines[node.lineno - 1]
                out[node.targets[0].id] = (value, line.split("#", 1)[1].strip() if "#" in line else "")
    return out


def train_defaults():
    """train.py's keys and defaults, read without running it: GPTConfig's model keys, then train.py's own block
    (whose vocab_size and block_size mean the dataset's vocabulary and longest example)."""
    from model import GPTConfig
    train_py = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")
    return {**GPTConfig.defaults(), **{k: v for k, (v, _) in script_defaults(train_py).items()}}


def cli(fn, defaults, argv, doc="", source=None):
    """A script's main: configure(), then fn(config); a ConfigError from either is one line, exit 2."""
    try:
        c = configure(defaults, argv, doc, source)
        return c, fn(c)
    except (ConfigError, DataError) as e:
        die(e)


def parse_value(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare word such as --device=cpu


def key_comments(path):
    """{key: comment} for every `key = ...  # comment`, `key=...,  # comment` (dict(...) keywords)
    and `"key": ...,  # comment` line of a source file: the meanings --help prints, read from
    the code so that they cannot go stale."""
    with open(path) as f:
        src = f.read()
    lines = src.splitlines()
    out = {}

    def note(key, lineno):
        line = lines[lineno - 1]
        if "#" in line and key not in out:
            out[key] = line.split("#", 1)[1].strip()

    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            note(node.targets[0].id, node.lineno)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):  # dataclass fields
            note(node.target.id, node.lineno)
        elif isinstance(node, ast.keyword) and node.arg:
            note(node.arg, node.value.lineno)
        elif isinstance(node, ast.Dict):
            for k in node.keys:
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    note(k.value, k.lineno)
    return out


def print_help(defaults, doc="", source=None):
    if doc:
        print(doc.strip() + "\n")
    meanings = {}
    for path in ([source] if isinstance(source, str) else source or [])[::-1]:  # the first file wins
        meanings.update(key_comments(path))
    print("options (--key=value; a config file path may come first):")
    width = max((len(f"--{k}={v!r}") for k, v in defaults.items()), default=0)
    for k, v in defaults.items():
        print(f"  {f'--{k}={v!r}':<{width}}  {meanings.get(k, '')}".rstrip())


def configure(defaults, argv, doc="", source=None):
    """Return a new dict: defaults updated by config files and --key=value overrides in argv.
    -h / --help prints `doc`, every key with its default and the comment on its line in `source`,
    and exits 0."""
    if "-h" in argv or "--help" in argv:
        print_help(defaults, doc, source)
        sys.exit(0)
    config = dict(defaults)
    for arg in argv:
        if not arg.startswith("--"):
            if os.path.isdir(arg):
                raise ConfigError(f"config file '{arg}' is a directory, not a Python config file")
            if not os.path.isfile(arg):
                raise ConfigError(f"config file '{arg}' not found")
            namespace = {}
            try:
                with open(arg) as f:
                    exec(compile(f.read(), arg, "exec"), namespace)
            except Exception as e:  # a broken config file is the user's bad input, say where
                raise ConfigError(f"config file '{arg}' failed: {type(e).__name__}: {e}") from None
            for key, value in namespace.items():
                if key.startswith("_") or type(value).__name__ in ("module", "function", "type"):
                    continue
                config[RENAMED.get(key, key)] = _check(key, value, defaults, arg)
        else:
            if "=" not in arg:
                raise ConfigError(f"override '{arg}' must look like --key=value")
            key, text = arg[2:].split("=", 1)
            value = parse_value(text)
            if isinstance(defaults.get(key), str) and not isinstance(value, str):
                value = text  # --wandb_run_name=123 means the string "123"
            config[RENAMED.get(key, key)] = _check(key, value, defaults, "command line")
    check(config)
    return config
