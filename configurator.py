"""
nanoGPT's configurator, done safely. Usage from a script with module-level defaults:

    python train.py config/symbolic.py --batch_size=256 --compile=False

The config file is plain Python assignments, executed in its own namespace (not the script's);
a config that derives from another says so first, in nanoGPT's own words, then lists only what it changes:

    exec(open(sibling("symbolic.py")).read())  # config/symbolic.py, then this file's changes

(`sibling(name)` is the path of `name` beside the config file, so this works from any directory).
Then each --key=value is parsed with ast.literal_eval (bare words stay strings). Every key must
already exist in the defaults and keep its type (an int is accepted where a float is expected).
Any mistake is a ConfigError with one line naming the bad key or value; scripts turn it into an
exit with status 2 via `die`. Each script passes the checks of its own keys (`checks`: {key: (predicate,
allowed)}), kept next to the code that owns the key; this module only parses, types and prints --help.
"""
import ast
import difflib
import math
import os
import sys

from common import ERRORS, ConfigError, die
from compat import RENAMED


def _closest(key, allowed):
    near = difflib.get_close_matches(key, allowed, n=1)
    return f" (did you mean '{near[0]}'?)" if near else ""


def merge(defaults, overrides, source, checks=None):
    """defaults updated by a dict of overrides, each key, type and value checked as on the command line."""
    out = dict(defaults)
    for k, v in overrides.items():
        _set(out, k, _check(k, v, defaults, source), source, set(overrides))
    check(out, checks or {})
    return out


def _set(config, key, value, source, given):
    """config[new name] = value; an old name and its new name both given is a conflict, not a silent pick."""
    new = RENAMED.get(key, key)
    twice = sorted(n for n in given if n != key and RENAMED.get(n, n) == new)
    if twice:
        raise ConfigError(f"{key}={value!r} and {twice[0]} in {source} set one key twice ({new}; "
                          f"{', '.join(k for k, v in RENAMED.items() if v == new)} is its old name): give only {new}")
    config[new] = value


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


def num(lo=None, hi=None, lo_open=False, hi_open=False):
    """A predicate for finite numbers in a range, and its text."""
    def ok(v):
        return (math.isfinite(v) and (lo is None or (v > lo if lo_open else v >= lo))
                and (hi is None or (v < hi if hi_open else v <= hi)))
    lo_s = "" if lo is None else f"{lo} {'<' if lo_open else '<='} "
    hi_s = "" if hi is None else f" {'<' if hi_open else '<='} {hi}"
    return ok, f"a finite number {lo_s}x{hi_s}".replace("number  x", "number x")


def one_of(*allowed):
    return (lambda v: v in allowed), f"one of {allowed}"


INT_GE1 = (lambda v: v >= 1, "an integer >= 1")
INT_GE0 = (lambda v: v >= 0, "an integer >= 0")
FOLDER = (lambda v: v.strip() != "", "a folder path")


def output_file(path):
    """An output file written at the end of a script's work: its folder is made now and must be writable."""
    if not path:
        return True
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return False
    return not os.path.isdir(path) and os.access(folder, os.W_OK)


OUTPUT = (output_file, "a writable file path (its folder is made if missing)")


def check(config, checks):
    """Every key's validator in `checks`; a one-line ConfigError at the first bad value."""
    for k, (ok, allowed) in checks.items():
        if k in config:
            try:
                good = ok(config[k])
            except TypeError:  # e.g. a string where the rule compares numbers
                good = False
            if not good:
                raise ConfigError(f"{k}={config[k]!r} is invalid: allowed {allowed}")


def cli(fn, defaults, argv, doc="", source=None, checks=None):
    """A script's main: configure(), then fn(config); a one-line error from either is exit 2."""
    try:
        c = configure(defaults, argv, doc, source, checks)
        return c, fn(c)
    except ERRORS as e:
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


def configure(defaults, argv, doc="", source=None, checks=None, stated=None):
    """Return a new dict: defaults updated by config files and --key=value overrides in argv.
    -h / --help prints `doc`, every key with its default and the comment on its line in `source`,
    and exits 0. stated: a set that receives every key a config file or the command line sets, so that a
    caller can tell a stated value from a default (train.py: what a pretrained folder may decide)."""
    if "-h" in argv or "--help" in argv:
        print_help(defaults, doc, source)
        sys.exit(0)
    config, stated = dict(defaults), set() if stated is None else stated
    given = {a[2:].split("=", 1)[0] for a in argv if a.startswith("--") and "=" in a}
    for arg in argv:
        if not arg.startswith("--"):
            if os.path.isdir(arg):
                raise ConfigError(f"config file '{arg}' is a directory, not a Python config file")
            if not os.path.isfile(arg):
                raise ConfigError(f"config file '{arg}' not found")
            folder = os.path.dirname(os.path.abspath(arg))
            namespace = {"sibling": lambda name: os.path.join(folder, name)}  # a function: not a key
            try:
                with open(arg) as f:
                    exec(compile(f.read(), arg, "exec"), namespace)
            except Exception as e:  # a broken config file is the user's bad input, say where
                raise ConfigError(f"config file '{arg}' failed: {type(e).__name__}: {e}") from None
            keys = {k for k, v in namespace.items()
                    if not k.startswith("_") and type(v).__name__ not in ("module", "function", "type")}
            for key in keys:
                _set(config, key, _check(key, namespace[key], defaults, arg), arg, keys)
            stated.update(RENAMED.get(k, k) for k in keys)
        else:
            if "=" not in arg:
                raise ConfigError(f"override '{arg}' must look like --key=value")
            key, text = arg[2:].split("=", 1)
            value = parse_value(text)
            if isinstance(defaults.get(key), str) and not isinstance(value, str):
                value = text  # --wandb_run_name=123 means the string "123"
            _set(config, key, _check(key, value, defaults, "command line"), "command line", given)
            stated.add(RENAMED.get(key, key))
    check(config, checks or {})
    return config
