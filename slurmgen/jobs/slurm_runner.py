"""Where Slurm commands run: here (subprocess) or on a login node (one SSH connection).

Both runners take argv lists, never a shell string built from names; the remote one quotes
each word itself. `setup` lines (e.g. `module load slurm`) run first on the login node, since
a non-interactive SSH session may not have Slurm on its PATH.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Protocol

from slurmgen.contract.exitcodes import FAILED
from slurmgen.errors import SlurmgenError


class Unanswered(SlurmgenError):
    """A command gave no answer within its time-out (a Slurm controller that is down makes every
    client command retry for MessageTimeout and longer). Raised, not returned, so that a caller
    that does not expect it still stops with this one line; `query.ask` catches it."""

    def __init__(self, argv: Sequence[str], timeout: float, where: str = ""):
        self.argv, self.timeout = list(argv), timeout
        super().__init__(f"slurm: {shlex.join(argv)}{where} did not answer within {timeout:g}s", exit_code=FAILED)


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


class Runner(Protocol):
    where: str

    def run(
        self, argv: Sequence[str], *, cwd: str | None = None, stdin: bytes = b"", timeout: float = 60
    ) -> Result: ...

    def read(self, path: str, offset: int = 0) -> bytes | None: ...

    def close(self) -> None: ...


def shell_line(argv: Sequence[str], cwd: str | None, setup: Sequence[str]) -> str:
    """One sh command line: the setup lines, then cd, then argv, each word quoted."""
    parts = [*setup]
    if cwd:
        parts.append(f"cd {shlex.quote(cwd)}")
    parts.append(shlex.join(argv))
    return " && ".join(parts)


class LocalRunner:
    where = "local"

    def run(self, argv: Sequence[str], *, cwd: str | None = None, stdin: bytes = b"", timeout: float = 60) -> Result:
        try:
            proc = subprocess.run(list(argv), cwd=cwd, input=stdin, capture_output=True, timeout=timeout)
        except FileNotFoundError:
            raise SlurmgenError(
                f"slurm: {argv[0]} is not installed here",
                hint="run on a login node, or use --remote LOGIN",
                exit_code=FAILED,
            ) from None
        except subprocess.TimeoutExpired:
            raise Unanswered(argv, timeout) from None
        return Result(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"))

    def read(self, path: str, offset: int = 0) -> bytes | None:
        return read_from(open, path, offset, "")

    def close(self) -> None:
        pass


def read_from(opener: Callable[[str, str], IO[bytes]], path: str, offset: int, where: str) -> bytes | None:
    """The file's bytes from `offset` on (a log being followed), or None if it does not exist yet."""
    try:
        with opener(path, "rb") as fh:
            fh.seek(offset)
            return fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SlurmgenError(f"logs: cannot read {path!r}{where}: {exc.strerror or exc}", exit_code=FAILED) from None
