"""Writing a render to disk: all files or none, never a half-written set.

Everything is rendered in memory first (`render.py`); here each file goes to a temporary
name in the target directory and is renamed into place, so an interrupted `create` leaves
either the old file or the new one, never a truncated script.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Mapping

from slurmgen.errors import SlurmgenError

EXECUTABLE_SUFFIX = ".sh"


def existing(directory: Path, names: list[str]) -> list[Path]:
    return [directory / n for n in names if (directory / n).exists()]


def write_files(directory: Path, files: Mapping[str, str], *, force: bool, extra_dirs: list[Path]) -> list[Path]:
    """Write `files` into `directory` (created if needed); refuse to overwrite without force."""
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
        except BaseException:
            for _, tmp in staged:
                tmp.unlink(missing_ok=True)
            raise
        for name, tmp in staged:
            os.replace(tmp, directory / name)
        for extra in extra_dirs:
            extra.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SlurmgenError(f"output_dir: cannot write to {directory}: {exc.strerror or exc}", exit_code=1) from None
    return [directory / n for n in files]
