"""
What a measurement keeps (bench.py and the lab scripts; nothing in training imports this): a results table printed a
row at a time and appended to a JSON-lines file as it comes, so a run cut by a time limit keeps every row it finished,
and bench.py step's cache of memory plans (device-independent arithmetic, made once per configuration).
"""
import json
import os

from common import ConfigError, DataError, atomic_write, die, read_json, table
from memory import plan


def check_row_log(path):
    """A --json file is new, empty, a device (/dev/null) or JSON lines a RowLog wrote (its first line a {"run": ...}
    object): rows are appended to nothing else (a user's file is never extended)."""
    if not path or not os.path.isfile(path) or not os.path.getsize(path):
        return
    with open(path, "rb") as f:
        first = f.readline()
    try:
        ok = "run" in json.loads(first)
    except (ValueError, TypeError):
        ok = False
    if not ok:
        raise ConfigError(f"json={path!r} holds something other than this script's JSON lines: rows are appended "
                          "only to a new file or to one bench.py or lab/ wrote; choose another path")


class RowLog:
    """A results table printed a row at a time, each row also appended to a JSON-lines file as it comes (the first
    line the run's description): a run killed by a time limit keeps every row it finished."""

    def __init__(self, header, path, meta):
        try:
            check_row_log(path)
        except ConfigError as e:
            die(e)
        self.header, self.path, self.records = header, path, {}
        print(table(header, []), flush=True)
        self.write({"run": meta})

    def write(self, obj):
        obj = {k: (None if isinstance(v, float) and v != v else v) for k, v in obj.items()}  # NaN is not JSON: null
        if self.path:  # one write of one whole line (O_APPEND): no reader sees half a row
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps(obj, default=str) + "\n").encode())
            finally:
                os.close(fd)

    def add(self, name, cells, record):
        print(table(self.header, [cells]).splitlines()[-1], flush=True)
        self.records[name] = record
        self.write({"row": name, **record})

    def fail(self, name, why):
        print(f"{name}: failed, left out: {why}", flush=True)
        self.write({"row": name, "failed": why})


PLAN_MARK = "discoloop_plan_cache"  # the key that makes a JSON file bench.py step's plan cache: no other file is rewritten


def read_plan_cache(path):
    """The plan cache at path ({} if absent): a regular file holding a JSON object with PLAN_MARK, else one line (a
    user's file, a device, a pipe or a folder is never read as one nor overwritten)."""
    if not path or not os.path.exists(path):  # new (a dangling link: its target is made)
        return {PLAN_MARK: 1}
    if not os.path.isfile(path):
        raise ConfigError(f"plan_cache={path!r} is not a regular file: allowed a new path or a plan cache bench.py step wrote")
    try:
        cache = read_json(path)
    except DataError as e:
        raise ConfigError(f"plan_cache={path!r} is not a plan cache ({e}): choose a new path") from None
    if cache.get(PLAN_MARK) != 1:
        raise ConfigError(f"plan_cache={path!r} is not a plan cache (no {PLAN_MARK!r} key): a file of yours is not "
                          "replaced; choose a new path")
    return cache


def cached_plan(c, r, dtype):
    """Total GB of memory.plan for recurrence r at one micro-batch, from/into c['plan_cache'] (keyed by the
    configuration that decides it: the same on every device). An entry that is not a number in (0, 1e6) GB is made
    again."""
    keep = {k: v for k, v in c.items() if k not in ("variants", "steps", "warmup", "json", "plan_cache", "device",
                                                     "threads", "compile", "compile_mode")}
    key = json.dumps({**keep, "recurrence": r, "dtype": str(dtype)}, sort_keys=True, default=str)
    cache = read_plan_cache(c["plan_cache"])
    v = cache.get(key)
    if not (type(v) in (int, float) and 0 < v < 1e6):  # GB: a plan of a petabyte is not one
        cache[key] = plan({**c, "recurrence": r, "gradient_accumulation_steps": 1}, 1, dtype).total / 1e9
        if c["plan_cache"]:
            atomic_write(os.path.realpath(c["plan_cache"]), json.dumps(cache))  # a symbolic link stays one
    return cache[key]
