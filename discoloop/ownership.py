"""
Which files are the project's, by a mark, not a name: the one table of marks (OWNERS, writer -> how its files are
stored), `marked` (what every writer adds to what it writes) and `owned` (the one check every script makes before it
replaces, extends or deletes a file). What earlier commits wrote before the mark is read through compat.py
(compat.old_writer) and counts only by a proof (a checkpoint's content CRC, the plan cache's own old mark), never by
its shape. Any other unmarked file is the user's: `target` leaves it as it is and writes beside it. Imports common.py
(errors, what a path is) and compat.py.
"""
import json
import os
import sys

import torch

from discoloop import compat
from discoloop.common import ConfigError, content_crc, not_regular

# Ownership by a mark, not a name: every file the project may later replace, extend or delete carries MARK (a JSON
# object's key, the first row's key of a JSON-lines file, a figure's Creator metadata, a checkpoint's key) whose value
# starts with its writer's name. A user's file cannot carry it by accident; owned() is the one check every script makes
# before any work. Folders are judged by what they hold (folder_owner.owner, whose proof of a run is its marked ckpt.pt).
MARK = "discoloop_mark"
FIGURE_METADATA = {"Creator": f"{MARK} figure"}  # savefig(metadata=...): PNG text, PDF Info and SVG metadata, uncompressed
# The one table: writer (the mark's start) -> how its files are stored ('torch' dict, 'json' object, 'jsonl' whose first
# row is marked, 'figure'). What earlier commits wrote before they carried this mark: compat.OLD_WRITERS, same names.
OWNERS = {"checkpoint": "torch", "exit gate": "torch", "metrics": "jsonl", "rows": "jsonl", "plan cache": "json",
          "probe.py": "json", "exits.py": "json", "eval_harness.py": "json", "figure": "figure"}


def marked(obj, writer):
    """A JSON object or torch dict with the project's mark saying what wrote it (writer: OWNERS, or 'probe.py acc')."""
    assert writer.split(" ")[0] in OWNERS or writer in OWNERS, writer
    return {MARK: writer, **obj}


def _keys(obj):  # a few of a file's keys, each short: a cache's keys are whole configurations
    return [k if len(k) <= 40 else k[:37] + "..." for k in sorted(map(str, obj))[:4]]


def _mark_of(obj, writer, container):
    """None when obj carries the mark of `writer`, 'old' when it is that writer's file of an earlier commit (before the
    mark: compat.OLD_WRITERS); else what it is, in a few words."""
    if not isinstance(obj, dict):
        return f"a {container} holding a {type(obj).__name__}"
    mark = obj.get(MARK)
    if mark is None and compat.old_writer(writer, obj, content_crc):
        return "old"
    if not isinstance(mark, str):
        return (f"a {container} object with keys {_keys(obj)} and no mark" if mark is None else
                f"a {container} object whose {MARK!r} is {mark!r}, not the project's")
    return None if mark.startswith(writer) else f"the project's {mark!r}, not a {writer!r} file"


def _found(path, writer):
    """None when the regular, non-empty file at path carries `writer`'s mark, 'old' when it is that writer's file of an
    earlier commit; else what it holds, in a few words."""
    form = OWNERS[writer]
    if form == "figure":  # PNG and SVG write their metadata first, a PDF its Info dictionary last
        with open(path, "rb") as f:
            head = f.read(1 << 20)
            f.seek(max(f.tell(), os.fstat(f.fileno()).st_size - (1 << 16)))
            tail = f.read()
        if FIGURE_METADATA["Creator"].encode() in head + tail:
            return None
        return "a file without the figure mark"
    if form == "torch":
        try:  # mmap: the pickle is read, the tensors are not; weights_only: nobody's code runs
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:
            return f"a file torch cannot read as a {writer} ({type(e).__name__})"
        return _mark_of(obj, writer, "torch file")
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.loads(f.readline() if form == "jsonl" else f.read())
    except (ValueError, UnicodeDecodeError):
        return f"{'a first line' if form == 'jsonl' else 'text'} that is not JSON"
    return _mark_of(obj, writer, "JSON-lines file whose first row is a" if form == "jsonl" else "JSON")


_NOTED = set()


def _judge(path, key):
    """'new' (absent, a dangling link, or an empty regular file: either may be written) or 'file'; a pipe, socket,
    device or folder is one ConfigError line before it is opened (a named pipe would block for ever)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "new"
    except OSError as e:
        raise ConfigError(f"{key}={path!r} cannot be read ({e.strerror}): choose another path") from None
    is_ = not_regular(path)
    if is_:
        raise ConfigError(f"{key}={path!r} is {is_}, not a regular file: allowed a new path or a file this project "
                          "wrote; choose another path")
    return "new" if st.st_size == 0 else "file"


def _note_once(path, text):
    if os.path.realpath(path) not in _NOTED:  # a script that checks twice says it once
        _NOTED.add(os.path.realpath(path))
        print(text, file=sys.stderr)


def _proven(path, writer, key, verb):
    """_found, with one note when the proof is an earlier commit's (compat.old_writer)."""
    found = _found(path, writer)
    if found == "old":
        _note_once(path, f"note: {key}={path!r} was written by an earlier commit of this project ({writer}, proven by "
                         f"its own content, before today's {MARK!r}): {verb}")
    return None if found == "old" else found


def is_ours(path, writer):
    """owned()'s decision without a word: whether the regular file at path is writer's, today's or an earlier commit's."""
    return os.path.isfile(path) and _found(path, writer) in (None, "old")


def owned(path, writer, key, verb="replaced"):
    """For a file that cannot move (a run's ckpt.pt, its metrics.jsonl): may `writer` (OWNERS) write the file at path,
    given as key=path? True when it carries writer's mark, or proves itself writer's file of an earlier commit
    (compat.old_writer; one note); False when path is new or empty. Anything else is a one-line ConfigError naming
    key, path and what was found: it is never touched."""
    if _judge(path, key) == "new":
        return False
    found = _proven(path, writer, key, verb)
    if found:
        raise ConfigError(f"{key}={path!r} holds {found}: only a file this project wrote for this (its {MARK!r}) is "
                          f"{verb}; left untouched, choose another path")
    return True


def target(path, writer, key):
    """Where `writer` (OWNERS) writes the output asked for at key=path (a JSON result, a row log, a figure, a gate):
    path itself when it is new, empty or provably writer's (owned); otherwise the file there, a user's or an earlier
    commit's unmarked one, is left exactly as it is and the output goes beside it, to the first of stem.1.ext,
    stem.2.ext, ... that is new or writer's, with one note naming both. '' stays '' (no output asked for)."""
    if not path:
        return path
    stem, ext = os.path.splitext(path)
    for n in range(0, 1000):
        here = path if n == 0 else f"{stem}.{n}{ext}"
        if _judge(here, key) == "new" or not _proven(here, writer, key, "replaced or extended"):
            if n:
                _note_once(path, f"note: {key}={path!r} holds {_found(path, writer)}, not a file this project marked: "
                                 f"left as it is; this output goes beside it, to {here!r}")
            return here
    raise ConfigError(f"{key}={path!r} and its 999 numbered siblings are all someone else's files: choose another path")
