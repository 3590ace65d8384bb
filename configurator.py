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
import os
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
    return {**defaults, **{k: _check(k, v, defaults, source) for k, v in overrides.items()}}


def _check(key, value, defaults, source):
    if key not in defaults:
        raise ConfigError(f"unknown config key '{key}' in {source}{_closest(key, list(defaults))}")
    want = type(defaults[key])
    if want is float and type(value) is int:
        return float(value)
    if type(value) is not want:
        raise ConfigError(f"{key}={value!r} in {source} has type {type(value).__name__}, "
                          f"expected {want.__name__} (default {defaults[key]!r})")
    return value


def script_defaults(path):
    """{key: (default, meaning)} for the `key = literal  # meaning` lines at the top level of a
    script such as train.py, read from its source without running it (for --help and bench.py plan)."""
    with open(path) as f:
        src = f.read()
    lines = src.splitlines()
    out = {}
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "config_keys":
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
                config[key] = _check(key, value, defaults, arg)
        else:
            if "=" not in arg:
                raise ConfigError(f"override '{arg}' must look like --key=value")
            key, text = arg[2:].split("=", 1)
            value = parse_value(text)
            if isinstance(defaults.get(key), str) and not isinstance(value, str):
                value = text  # --wandb_run_name=123 means the string "123"
            config[key] = _check(key, value, defaults, "command line")
    return config
