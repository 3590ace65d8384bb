"""
The run folder's record, apart from the checkpoint: one run per folder (a lock), metrics.jsonl (one row
per evaluation), config.json (the config and every resume), and the decisions train.py reads from the rows
(early stopping, curriculum joins). Decisions come from the rows alone, so a resumed run takes exactly the
decisions the uninterrupted one took; `probe.py plot` replays the same rules on finished logs.
"""
import fcntl
import json
import os
import sys
import time

from discoloop.common import TMP_RE, DataError, RunError, atomic_write
from discoloop.ownership import marked
from discoloop.curriculum import fired_joins
from discoloop.folder_owner import claim


def open_run_folder(out_dir, lock=True):
    """Make out_dir and prove it writable now, not at the first checkpoint; with lock, hold it for this process
    (lock_run_folder). A one-line RunError for a folder that is not train.py's (folder_owner.claim: a Hugging Face
    model, an export, a dataset, unknown files), a file in its place, an unwritable folder or a live holder."""
    for name in ("ckpt.pt", "metrics.jsonl", "config.json", "run.lock"):  # a folder where a run writes a file: not ours
        if os.path.isdir(os.path.join(out_dir, name)):
            raise RunError(f"'{os.path.join(out_dir, name)}' is a folder where the run writes its {name}: move it away "
                           "or choose another out_dir")
    try:
        claim(out_dir, "train.py")
    except DataError as e:
        raise RunError(str(e)) from None
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = os.path.join(out_dir, f".write-test-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise RunError(f"out_dir={out_dir!r} is not writable ({e.strerror})") from None
    return lock_run_folder(out_dir) if lock else None


def lock_run_folder(out_dir):
    """Hold an exclusive lock on out_dir for the life of this process, so that two runs never share
    a folder. The kernel drops the lock when the holder dies, so a killed run never blocks the next.
    Then remove temp files of earlier, dead runs (holding the lock, no live run can own one)."""
    path = os.path.join(out_dir, "run.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunError(f"out_dir '{out_dir}' is in use by another run (PID {holder}): wait for it, stop it, "
                       "or choose another out_dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    for tmp in [os.path.join(out_dir, n) for n in os.listdir(out_dir) if TMP_RE.fullmatch(n)]:  # exactly our own
        if os.path.isfile(tmp) or os.path.islink(tmp):  # temp files (common.TMP_RE); a folder of that name is not ours
            os.remove(tmp)
    return fd  # keep it open: closing it releases the lock


def read_metrics(path):
    """Rows of a metrics.jsonl. A torn line (a crash or a full disk during the append), or one that is
    not a metrics row, is skipped with a warning instead of blocking the run or the plot."""
    rows = []
    if not os.path.exists(path):
        return rows
    if os.path.isdir(path):
        raise RunError(f"'{path}' is a folder, not a metrics file")
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            if not isinstance(row, dict) or type(row.get("iter")) is not int:
                print(f"warning: {path}:{lineno} is a torn line or not a metrics row, skipped", file=sys.stderr)
                continue
            rows.append(row)
    return rows


def append_metrics(path, row):
    """One write of one whole line, so readers never see half a row from a live run."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(row) + "\n").encode())
    finally:
        os.close(fd)


def write_atomic_json(path, obj):
    atomic_write(path, json.dumps(obj, indent=1))


def early_stop_row(rows, metric, patience):
    """Index of the evaluation row at which a run with stop_metric=metric and stop_patience=patience
    stops (its best value, the first on ties, lies `patience` evaluations back), or None. A run that
    stops early is the prefix of the same run without stopping. --eval_only rows do not count."""
    sign = 1 if metric.startswith(("loss/", "val_loss")) else -1
    best, best_i, n = None, 0, 0
    for i, r in enumerate(rows):
        if metric not in r or r.get("eval_only"):
            continue
        if best is None or sign * r[metric] < sign * best:
            best, best_i = r[metric], n
        if n - best_i >= patience:
            return i
        n += 1
    return None


class RunLog:
    """metrics.jsonl and config.json of one run folder, and the decisions read from its rows."""

    def __init__(self, out_dir):
        self.metrics_path = os.path.join(out_dir, "metrics.jsonl")
        self.config_path = os.path.join(out_dir, "config.json")
        self.rows = []
        self.wandb = None

    def start_wandb(self, project, name, config):
        """Also send every row to wandb; no login or no network is one line before any training."""
        import wandb
        try:
            wandb.init(project=project, name=name, config=config, resume="allow")
        except Exception as e:
            raise RunError(f"wandb_log=True but wandb could not start ({type(e).__name__}: "
                           f"{(str(e).strip().splitlines() or [''])[0][:160]}): run `wandb login`, set "
                           "WANDB_MODE=offline, or pass --wandb_log=False") from None
        self.wandb = wandb

    def read(self):
        self.rows = read_metrics(self.metrics_path)
        return self.rows

    def start(self, iter_num, config, resumed, changes=None, **facts):
        """A new run empties metrics.jsonl; a resumed one drops the rows written after its checkpoint, so the
        file reads as one run. config.json gets the config, `facts` (e.g. the resolved dtype) and, on
        resume, one more entry in its list of resumes with what that resume changed."""
        self.rows = [r for r in self.rows if r["iter"] <= iter_num] if resumed else []
        atomic_write(self.metrics_path, "".join(json.dumps(r) + "\n" for r in self.rows))
        resumes = []
        if resumed and os.path.exists(self.config_path):
            try:
                with open(self.config_path) as f:
                    resumes = list(json.load(f).get("resumes", []))
            except (OSError, ValueError, AttributeError):
                pass  # an unreadable config.json loses only the resume history, which is rewritten now
        if resumed:
            resumes.append({"iter": iter_num, "at": time.strftime("%Y-%m-%d %H:%M:%S"), "changed": changes or {}})
        write_atomic_json(self.config_path, {**config, **facts, "resumes": resumes})

    def append(self, row):  # the file's first row carries the project's mark (ownership.owned: whose file this is)
        append_metrics(self.metrics_path, row if self.rows else marked(row, "metrics"))
        self.rows.append(row)
        if self.wandb is not None:
            self.wandb.log(row, step=row["iter"])

    def evaluated(self, it):
        """Whether the run itself evaluated iteration `it` (an --eval_only row does not count)."""
        return any(r["iter"] == it and not r.get("eval_only") for r in self.rows)

    def early_stop(self, metric, patience):
        """The row at which stop_metric ran out of patience, or None."""
        i = early_stop_row(self.rows, metric, patience) if metric else None
        return None if i is None else self.rows[i]

    def fired_joins(self, rules):
        """{split: iteration} for the join rules ({split: 'metric>=x'}) that have held so far."""
        return fired_joins(self.rows, rules)
