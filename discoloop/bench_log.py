"""
What a measurement keeps (bench.py and the lab scripts; nothing in training imports this): a results table printed a
row at a time and appended to a JSON-lines file as it comes, so a run cut by a time limit keeps every row it finished,
and bench.py step's cache of memory plans (device-independent arithmetic, made once per configuration).
"""
import json
import os

from discoloop.common import atomic_write, read_json, table
from discoloop.ownership import marked, target
from discoloop.memory import plan


class RowLog:
    """A results table printed a row at a time, each row also appended to a JSON-lines file as it comes (the first
    line the run's description): a run killed by a time limit keeps every row it finished."""

    @staticmethod
    def check(path):
        """Whether a RowLog may write to path, asked before any work: only to a new file or one a RowLog began (its
        first row's mark); a user's file is left as it is and the rows go beside it (ownership.target)."""
        return target(path, "rows", "json")

    def __init__(self, header, path, meta):
        self.header, self.path, self.records = header, self.check(path), {}
        print(table(header, []), flush=True)
        self.write(marked({"run": meta}, "rows"))

    def write(self, obj):
        obj = {k: (None if isinstance(v, float) and v != v else v) for k, v in obj.items()}  # NaN is not JSON: null
        if self.path:  # one write of one whole line (O_APPEND): no reader sees half a row
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
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


def read_plan_cache(path):
    """The plan cache at path ({} if absent or empty): a JSON object bench.py step wrote (its mark); path is
    ownership.target's, so a user's file is never read as one nor overwritten."""
    if not path or not os.path.isfile(path) or not os.path.getsize(path):
        return marked({}, "plan cache")
    return marked(read_json(path), "plan cache")  # an earlier commit's cache (its own mark) is kept, marked as today's


def cached_plan(c, r, dtype):
    """Total GB of memory.plan for recurrence r at one micro-batch, from/into c['plan_cache'] (keyed by the
    configuration that decides it: the same on every device). An entry that is not a number in (0, 1e6) GB is made
    again."""
    keep = {k: v for k, v in c.items() if k not in ("variants", "steps", "warmup", "json", "plan_cache", "device",
                                                     "threads", "compile", "compile_mode")}
    key = json.dumps({**keep, "recurrence": r, "dtype": str(dtype)}, sort_keys=True, default=str)
    path = target(c["plan_cache"], "plan cache", "plan_cache")  # a user's file stays; the cache goes beside it
    cache = read_plan_cache(path)
    v = cache.get(key)
    if not (type(v) in (int, float) and 0 < v < 1e6):  # GB: a plan of a petabyte is not one
        cache[key] = plan({**c, "recurrence": r, "gradient_accumulation_steps": 1}, 1, dtype).total / 1e9
        if path:
            atomic_write(path, json.dumps(cache))  # a symbolic link stays one (atomic_write)
    return cache[key]
