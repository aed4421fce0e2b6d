"""Atomic replacement of an export's file or folder.

A file is written under a hidden temporary name in the same folder, flushed, and renamed over
the destination (`os.replace`). A folder is built under a hidden temporary name and swapped
with the destination in one `renameat2(RENAME_EXCHANGE)`, so the destination always holds
either the old folder or the complete new one; on a file system without the exchange, the old
folder is renamed aside first and back if the new one cannot take its place.

Temporary entries are named `.<name>.<pid>-<random>.tmp` (and `.old`); a writer removes the
ones beside its destination whose process is gone (left by a killed export) before writing.
Everything is created with the modes of ordinary files and folders (the process umask).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

# Temporary entries of unknown owner (no pid in the name) older than this are removed.
STALE_S = 3600.0
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def destination(out: str | Path) -> Path:
    """`out` as a Path whose parent folders exist (created); a parent that is a plain file
    is a one-line `NotADirectoryError` naming it."""
    out = Path(out)
    for parent in [out.parent, *out.parent.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise NotADirectoryError(f"cannot write {out}: {parent} is a file, not a folder")
            break
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def hidden_temp(out: Path, suffix: str) -> Path:
    """A fresh hidden name beside `out` that carries this process's id."""
    return out.parent / f".{out.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}{suffix}"


def remove_stale(out: Path) -> list[Path]:
    """Remove the temporary entries beside `out` that killed writers left; return them."""
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.(?:(\d+)-[0-9a-f]{{8}}|[^/]+?)\.(?:tmp|old)$")
    removed = []
    try:
        entries = list(os.scandir(out.parent))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None:
            continue
        pid = match.group(1)
        if pid is not None:
            if int(pid) == os.getpid() or _alive(int(pid)):
                continue
        else:
            try:
                if time.time() - entry.stat(follow_symlinks=False).st_mtime < STALE_S:
                    continue
            except OSError:
                continue
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(out: Path, write: Callable[[Path], None]) -> None:
    """Write through `write(tmp)` to a hidden file beside `out`, then rename it over `out`."""
    out = destination(out)
    remove_stale(out)
    tmp = hidden_temp(out, ".tmp")
    try:
        write(tmp)
        fsync(tmp)
        os.replace(tmp, out)
        fsync(out.parent)
    finally:
        tmp.unlink(missing_ok=True)


def exchange(a: Path, b: Path) -> bool:
    """Swap the entries `a` and `b` atomically (Linux renameat2); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, f"cannot swap {a} and {b}: {os.strerror(code)}")


def replace_folder(out: Path, build: Callable[[Path], None]) -> None:
    """Build a folder through `build(tmp)` under a hidden name beside `out`, then swap it in
    (module doc); the old folder is removed afterwards."""
    out = destination(out)
    remove_stale(out)
    tmp = hidden_temp(out, ".tmp")
    tmp.mkdir()
    old = None
    try:
        build(tmp)
        for path in tmp.rglob("*"):
            if path.is_file():
                fsync(path)
        if out.exists() and exchange(tmp, out):
            old = tmp  # now holds the previous folder
        else:
            if out.exists():
                old = hidden_temp(out, ".old")
                os.rename(out, old)
            os.rename(tmp, out)
        fsync(out.parent)
    except BaseException:
        if old is not None and old != tmp and not out.exists():
            os.rename(old, out)
            old = None
        raise
    finally:
        if old != tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
