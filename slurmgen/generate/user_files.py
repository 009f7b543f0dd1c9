"""Reading files users hand us (specs, host files, env files): one clear line when we cannot.

A file that is missing, a directory, binary or not UTF-8 is named in a `SlurmgenError`
(with the line of the first bad byte) instead of ending in a decoder traceback.
"""

from __future__ import annotations

from pathlib import Path

from slurmgen.errors import SlurmgenError, show


def read_text(path: Path, what: str) -> str:
    """A user's text file, or one line saying why it cannot be used (`what: file: reason`)."""
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise SlurmgenError(f"{what}: {show(str(path))} is a directory, not a file") from None
    except OSError as exc:
        raise SlurmgenError(f"{what}: cannot read {show(str(path))}: {exc.strerror or exc}") from None
    if b"\0" in data:
        raise SlurmgenError(f"{what}: {show(str(path))} is a binary file, not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SlurmgenError(
            f"{what}: {path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x})", hint="save the file as UTF-8"
        ) from None
