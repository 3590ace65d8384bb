"""The command line of the .ci measurement scripts that read trained runs (arms_measure.py, pipeline_measure.py):
RUN [RUN ...] [--key=value ...]. Every run is checked before the first is measured: a typo is named with the
script's usage line (its docstring's `    python ...` line), not a traceback."""
import os
import sys


def refuse(script, why):
    """The entry points' rule: one line on stderr, exit 2, before any work."""
    print(f"{os.path.basename(script)}: {why}", file=sys.stderr)
    sys.exit(2)


def runs_and_options(doc, script, defaults):
    """(runs, options): `defaults` names every option and its default; an int default takes a whole number >= 1."""
    usage = "; usage: python " + doc.split("    python ")[1].splitlines()[0]
    runs = [a for a in sys.argv[1:] if not a.startswith("--")]
    for r in runs or [""]:
        if not (os.path.isfile(r) or os.path.isfile(os.path.join(r, "ckpt.pt"))):
            why = repr(r) + " is neither a checkpoint nor a run folder with ckpt.pt" if r else "no run given"
            refuse(script, why + usage)
    opts = dict(defaults)
    for a in (a for a in sys.argv[1:] if a.startswith("--")):
        key, eq, value = a[2:].partition("=")
        if key not in defaults or not eq:
            refuse(script, f"{a!r} is invalid: allowed --key=value with key one of {sorted(defaults)}{usage}")
        if isinstance(defaults[key], int):
            if not (value.isdecimal() and int(value) >= 1):  # isdigit() admits '²', which int() refuses
                refuse(script, f"--{key}={value!r} is invalid: allowed a whole number >= 1{usage}")
            value = int(value)
        opts[key] = value
    return runs, opts
