"""A pre-warmed Python for the suite's script runs: it imports torch once, then forks a child per request.

Why: the suite runs repo scripts as real processes (exit codes, one-line errors, excepthooks, atomic files) a few
hundred times, and each fresh interpreter spent ~1.5 s importing torch: most of the suite's time on 2 cores.
A forked child is still a separate process with its own exit code, stdout and stderr; only the import is shared.
No project module is imported here (a child imports the repo's files fresh, from its own cwd and sys.path), and
no torch op runs here before a fork (OpenMP's thread pool must not exist in the parent of a fork).

Protocol, one JSON line each way on stdin/stdout: {"args", "cwd", "env", "out", "err"} -> {"pid"}, then {"rc"}.
"""
import atexit
import json
import os
import runpy
import sys
import threading

import numpy  # noqa: F401  (pre-imported: the point of this process)
import torch  # noqa: F401
import tqdm  # noqa: F401


def child(req):
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, path in ((1, req["out"]), (2, req["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    script, *argv = req["args"]
    sys.argv = [script, *argv]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # what `python script.py` puts first
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:  # as the interpreter does: None is 0, an int is itself, anything else is printed, 1
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else (print(e.code, file=sys.stderr), 1)[1]
    except BaseException:  # noqa: BLE001  (the script's own excepthook decides what is printed)
        try:
            sys.excepthook(*sys.exc_info())
            code = 1
        except SystemExit as e:  # common.py's hook ends an out-of-memory error with die(): exit 2
            code = e.code if isinstance(e.code, int) else 1
    for t in threading.enumerate():  # the interpreter joins non-daemon threads before exiting
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code & 0xFF)


def main():
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                child(req)
            finally:  # a child never returns into this loop, whatever failed in its setup
                os._exit(70)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        rc = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
        print(json.dumps({"rc": rc}), flush=True)


if __name__ == "__main__":
    main()
