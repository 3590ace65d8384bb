"""The command line of the .ci measurement scripts that read trained runs (arms_measure.py, pipeline_measure.py):
RUN [RUN ...] [--key=value ...]. Every run is checked before the first is measured: a typo is named with the
script's usage line (its docstring's `    python ...` line), not a traceback."""
import os
import sys


def runs_and_options(doc, script):
    runs = [a for a in sys.argv[1:] if not a.startswith("--")]
    for r in runs or [""]:
        if not (os.path.isfile(r) or os.path.isfile(os.path.join(r, "ckpt.pt"))):
            why = repr(r) + " is neither a checkpoint nor a run folder with ckpt.pt" if r else "no run given"
            sys.exit(os.path.basename(script) + ": " + why + "; usage: python " + doc.split("    python ")[1].splitlines()[0])
    return runs, dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
