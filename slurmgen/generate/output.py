"""Writing a render to disk: all files or none, never a half-written set.

Everything is rendered in memory first (`render.py`); here each file goes to a temporary
name in the target directory and is renamed into place, so an interrupted `create` leaves
either the old file or the new one, never a truncated script.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from slurmgen.errors import SlurmgenError

EXECUTABLE_SUFFIX = ".sh"


def existing(directory: Path, names: list[str]) -> list[Path]:
    return [directory / n for n in names if (directory / n).exists()]


def directory_problem(field: str, path: Path) -> str | None:
    """Why `path` cannot be (or become) a directory we write in, or None if it can."""
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            return f"{field}: {str(path)!r} is a file, not a directory"
        usable = os.access(path, os.W_OK | os.X_OK)
        return None if usable else f"{field}: {str(path)!r} is not writable (permission denied)"
    ancestor = path.parent
    while not (ancestor.exists() or ancestor.is_symlink()) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{field}: cannot create {str(path)!r}: {str(ancestor)!r} is a file, not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{field}: cannot create {str(path)!r}: {str(ancestor)!r} is not writable (permission denied)"
    return None


def write_files(directory: Path, files: Mapping[str, str], *, force: bool, extra_dirs: list[Path]) -> list[Path]:
    """Write `files` into `directory` (created if needed); refuse to overwrite without force.

    `extra_dirs` (the log directory) are created too. Every path is checked before anything
    is written, so a bad one (a file where a directory should be) leaves nothing behind.
    """
    problems = [directory_problem("output_dir", directory)]
    if not problems[0]:  # else the log directory below it is the same problem again
        problems = [directory_problem("log_dir", d) for d in extra_dirs]
    if any(problems):
        raise SlurmgenError(*[p for p in problems if p])
    clashes = existing(directory, list(files))
    if clashes and not force:
        raise SlurmgenError(
            f"output_dir: {clashes[0]} already exists",
            hint="pass --force to overwrite, or choose another --output-dir",
        )
    try:
        directory.mkdir(parents=True, exist_ok=True)
        staged: list[tuple[str, Path]] = []
        try:
            for name, text in files.items():
                fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
                staged.append((name, Path(tmp)))
                with os.fdopen(fd, "w") as fh:
                    fh.write(text)
                os.chmod(tmp, 0o755 if name.endswith(EXECUTABLE_SUFFIX) else 0o644)
            for extra in extra_dirs:  # before any file is in place: a failure leaves none
                extra.mkdir(parents=True, exist_ok=True)
        except BaseException:
            for _, staged_path in staged:
                staged_path.unlink(missing_ok=True)
            raise
        for name, staged_path in staged:
            os.replace(staged_path, directory / name)
    except OSError as exc:
        where = exc.filename or directory
        raise SlurmgenError(f"output_dir: cannot write {str(where)!r}: {exc.strerror or exc}", exit_code=1) from None
    return [directory / n for n in files]
