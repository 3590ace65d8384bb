"""
nanoGPT's configurator, done safely. Usage from a script with module-level defaults:

    python train.py config/symbolic.py --batch_size=256 --compile=False

The config file is plain Python assignments, executed in its own namespace (not the script's);
a config that derives from another says so first, in nanoGPT's own words, then lists only what it changes:

    exec(open(sibling("symbolic.py")).read())  # config/symbolic.py, then this file's changes

(`sibling(name)` is the path of `name` beside the file that says it; a plain `open("x.py")` is looked up beside that
file first, then in the current folder, so a parent is found whoever runs it and from wherever; a missing parent or
a cycle is one line).
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

from discoloop.common import ConfigError, check_writable
from discoloop.compat import RENAMED, retire


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
    config[new] = retire({new: value}, source)[new]  # a retired value (a kernel moved to lab/): its default, noted


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
    """An output file written at the end of a script's work: its folder can be made (and is, when it is written;
    common.check_writable makes and removes it now, so a refused command leaves no folder behind)."""
    if not path:
        return True
    try:
        check_writable(path, "")
    except ConfigError:
        return False
    return not os.path.isdir(path)


OUTPUT = (output_file, "a writable file path (its folder is made when it is written)")


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


def inert(config, defaults, active, typed=()):
    """{key: why} for every key set away from its default, or typed at any value (`typed`: a user asked for it), that
    has no effect in the resolved config. `active` is
    each owner's declaration of when its keys act (GPTConfig.ACTIVE, train_config.ACTIVE): {key or family prefix
    ending in '_': (predicate over the config, what it needs, a format string over the config)}; a prefix covers
    every key of its family, those added later too. A key is inert when a rule covering it is false."""
    out = {}
    for k, v in config.items():
        if k not in defaults or (v == defaults[k] and k not in typed):
            continue
        for name, (ok, needs) in active.items():
            if (k == name or (name.endswith("_") and k.startswith(name))) and not ok(config):
                out[k] = f"{k}={v!r} has no effect: it needs {needs.format(**config)}"
                break
    return out


def check_inert(config, defaults, active, stated):
    """Inert keys (inert()): one typed on the command line is a ConfigError (the user asked for something that would
    not happen); one a config file set (an override made it inert) is a note on stderr. Returns {key: why}, for
    config.json."""
    found = inert(config, defaults, active, [k for k, where in stated.items() if where == COMMAND_LINE])
    typed = [k for k in found if stated.get(k) == COMMAND_LINE]
    if typed:
        raise ConfigError(f"{found[typed[0]]}: drop --{typed[0]}, or set what it needs")
    for k, why in found.items():
        print(f"note: {why} (set in {stated.get(k, 'the weights')})", file=sys.stderr)
    return found


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

COMMAND_LINE = "command line"


class _Text(str):
    """A config file's text, remembering its path: exec() of it runs it as that file (its parents beside it)."""
    def __new__(cls, text, path):
        obj = super().__new__(cls, text)
        obj.path = path
        return obj


class _ConfigFile:
    """open() of a config file inside a config file: read() gives a _Text; everything else is the file's."""
    def __init__(self, f, path):
        self.f, self.path = f, path

    def read(self, *a):
        return _Text(self.f.read(*a), self.path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def __getattr__(self, name):
        return getattr(self.f, name)


def _config_namespace(top):
    """The namespace config files run in: `open` and `sibling` look beside the file running now (then, for open,
    in the current folder: nanoGPT's own lookup), `exec` of a file's text runs it as that file; a missing parent
    or a file that executes itself again (a cycle) is a one-line ConfigError naming the chain."""
    chain = []

    def here():
        return os.path.dirname(chain[-1]) if chain else os.path.dirname(os.path.abspath(top))

    def sibling(name):
        return os.path.join(here(), name)

    def open_(name, mode="r", *a, **k):
        path = name
        if isinstance(name, str) and not os.path.isabs(name):
            beside = os.path.join(here(), name)
            path = beside if os.path.exists(beside) or not os.path.exists(name) else name
        if isinstance(path, str) and "r" in mode and "b" not in mode and "+" not in mode and not os.path.exists(path):
            raise ConfigError(f"config file '{chain[-1] if chain else top}' names a parent '{name}' that is neither "
                              f"beside it ({os.path.join(here(), name)}) nor in the current folder")
        f = open(path, mode, *a, **k)
        return _ConfigFile(f, os.path.abspath(path)) if "b" not in mode and set(mode) <= {"r", "t"} else f

    def exec_(source, globals_=None, locals_=None):
        path = getattr(source, "path", None)
        if path is None:  # not a file's text: Python's exec as it is
            return exec(source, namespace if globals_ is None else globals_, locals_)
        if path in chain:
            short = [os.path.relpath(p) if not os.path.relpath(p).startswith("..") else p for p in chain + [path]]
            raise ConfigError(f"config files execute each other in a cycle: {' -> '.join(short)}")
        chain.append(path)
        try:
            exec(compile(source, path, "exec"), namespace if globals_ is None else globals_, locals_)
        finally:
            chain.pop()

    namespace = {"sibling": sibling, "open": open_, "exec": exec_}  # functions: not keys
    return namespace


def configure(defaults, argv, doc="", source=None, checks=None, stated=None):
    """Return a new dict: defaults updated by config files and --key=value overrides in argv.
    -h / --help prints `doc`, every key with its default and the comment on its line in `source`,
    and exits 0. stated: a dict that receives {key: where it was set} (a config file's path, or COMMAND_LINE) for
    every key a config file or the command line sets, so that a caller can tell a stated value from a default and
    a typed one from a file's (train.py: what a pretrained folder may decide; inert keys: refused or noted)."""
    if "-h" in argv or "--help" in argv:
        print_help(defaults, doc, source)
        sys.exit(0)
    config, stated = dict(defaults), {} if stated is None else stated
    given = {a[2:].split("=", 1)[0] for a in argv if a.startswith("--") and "=" in a}
    for arg in argv:
        if not arg.startswith("--"):
            if os.path.isdir(arg):
                raise ConfigError(f"config file '{arg}' is a directory, not a Python config file")
            if not os.path.isfile(arg):
                raise ConfigError(f"config file '{arg}' not found")
            namespace = _config_namespace(arg)
            try:
                with open(arg) as f:
                    namespace["exec"](_Text(f.read(), os.path.abspath(arg)))
            except ConfigError:
                raise
            except Exception as e:  # a broken config file is the user's bad input, say where
                raise ConfigError(f"config file '{arg}' failed: {type(e).__name__}: {e}") from None
            keys = {k for k, v in namespace.items()
                    if not k.startswith("_") and type(v).__name__ not in ("module", "function", "type")}
            for key in keys:
                _set(config, key, _check(key, namespace[key], defaults, arg), arg, keys)
            stated.update({RENAMED.get(k, k): arg for k in keys})
        else:
            if "=" not in arg:
                raise ConfigError(f"override '{arg}' must look like --key=value")
            key, text = arg[2:].split("=", 1)
            value = parse_value(text)
            if isinstance(defaults.get(key), str) and not isinstance(value, str):
                value = text  # --wandb_run_name=123 means the string "123"
            _set(config, key, _check(key, value, defaults, "command line"), "command line", given)
            stated[RENAMED.get(key, key)] = COMMAND_LINE
    check(config, checks or {})
    return config
