"""Atomic file replacement, the one way slurmgen rewrites a file that others read while it runs.

A file is written under a temporary name in its own directory (`.NAME.tmp.PID`: same file
system, so the rename is atomic; hidden; the pid says which writer it was), optionally
fsynced, then renamed over NAME: a reader sees the old file or the new one, never half of one.

Why a single helper: the run record (tracking), the heartbeats and the checkpoints each had
their own copy, and two of them left their temporary file behind when the write failed (a full
disk left 0-byte `.rank-00000.json.tmp.PID` and `.run.json.tmp.PID` files for good). Here a
failed write always removes its temporary file, and `remove_stale()` removes those of writers
that were killed between write and rename. Stdlib only: every rank imports it.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

# A temporary name of `temporary()`: `.NAME.tmp.PID`.
_TEMP_NAME = re.compile(r"\.(.+)\.tmp\.([1-9][0-9]*)")
STALE_AGE = 60.0  # seconds; a real write takes well under a second


def temporary(path: Path) -> Path:
    """The temporary name this process writes `path` under."""
    return path.with_name(f".{path.name}.tmp.{os.getpid()}")


def fsync_path(path: Path) -> None:
    """Flush the file or directory `path` to the disk (a directory: the names in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename inside directory `path` survive a crash."""
    fsync_path(path)


def replace(
    path: Path,
    write: Callable[[Path], None],
    fsync: bool = True,
    fsync_dir_after: bool = False,
    before_rename: Callable[[], None] | None = None,
) -> None:
    """Have `write(tmp)` create the temporary file by name, fsync it (if `fsync`), rename it over
    `path` (then fsync the directory if `fsync_dir_after`). On any failure, the temporary file
    is removed before the error goes on: a full disk must not leave files behind.

    `write` gets a path, not a file object, so that torch.save can use its own (faster) writer."""
    tmp = temporary(path)
    try:
        write(tmp)
        if fsync:
            fsync_path(tmp)
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync_dir_after:
        fsync_dir(path.parent)


def write_text(
    path: Path, text: str, fsync: bool = True, in_place_when_full: bool = False, mode: int | None = None
) -> None:
    """Replace `path` with `text` atomically (see `replace`), created with permissions `mode`
    (None: the umask's), which the file has from its first byte.

    `in_place_when_full`: when the disk is full (ENOSPC), overwrite the existing file in place
    instead, if `text` fits in the blocks it already has (no new block is needed then). Not
    atomic, so only for a write that matters more than the risk of a torn file: a failed run's
    record saying "failed" on the disk that failed it, instead of "running" for good."""

    def write(tmp: Path) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 if mode is None else mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)

    try:
        replace(path, write, fsync=fsync)
    except OSError as exc:
        if not (in_place_when_full and exc.errno == errno.ENOSPC and _overwrite_in_own_blocks(path, text.encode())):
            raise


def _overwrite_in_own_blocks(path: Path, data: bytes) -> bool:
    """Write `data` over `path` in place if it fits the blocks `path` holds; False if not done."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        if len(data) > os.fstat(fd).st_blocks * 512:
            return False
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's process, or not a pid we can ask about: leave its file alone
    return True


def remove_stale(directory: Path, names: Iterable[str], min_age: float = STALE_AGE) -> list[Path]:
    """Delete the temporary files of `names` in `directory` that a killed writer left; return them.

    Only files nobody can still be writing go: older than `min_age` seconds AND named with a pid
    that is not a live process on this host. Both, since each alone can be wrong while another
    process writes the same directory: a writer on this host stopped mid-write (job suspended)
    has an old file but a live pid; a writer on another host (a shared file system) has a pid
    that means nothing here, but a fresh file. Errors are ignored: tidying up must not stop a run.
    """
    wanted, removed = set(names), list[Path]()
    try:
        found = os.listdir(directory)
    except OSError:
        return removed
    now = time.time()
    for name in found:
        match = _TEMP_NAME.fullmatch(name)
        if not match or match.group(1) not in wanted:
            continue
        path = directory / name
        try:
            if now - path.lstat().st_mtime < min_age or _pid_alive(int(match.group(2))):
                continue
            path.unlink()
        except OSError:  # renamed or removed meanwhile, or not ours to delete
            continue
        removed.append(path)
    return removed
