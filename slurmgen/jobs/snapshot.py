"""The code a remote job runs from: a content-addressed tarball of the working tree.

Files: git's tracked and not-ignored ones (`git ls-files --cached --others --exclude-standard`)
when the directory is in a git work tree, else every file under it (without .git). The tar is
deterministic (sorted names, zero times and owners), so its sha256 names the snapshot and an
identical tree is never uploaded twice. The commit, whether the tree was dirty and the diff
against HEAD go into the job record.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from slurmgen.errors import SlurmgenError

MAX_DIFF = 1_000_000  # bytes of `git diff` kept in the job record


@dataclass(frozen=True)
class CodeSnapshot:
    digest: str
    tar: bytes
    files: int
    commit: str | None
    dirty: bool
    diff: str


def _git(code: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(code), *args], capture_output=True, timeout=60)


def _files(code: Path) -> tuple[list[str], bool]:
    try:
        listed = _git(code, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    except FileNotFoundError:  # no git installed: take the whole directory
        listed = None
    if listed is not None and listed.returncode == 0:
        names = [n for n in listed.stdout.decode().split("\0") if n]
        return sorted(n for n in set(names) if (code / n).is_file() or (code / n).is_symlink()), True
    names = []
    for root, dirs, files in os.walk(code):
        dirs[:] = [d for d in dirs if d != ".git"]
        names += [os.path.relpath(os.path.join(root, f), code) for f in files]
    return sorted(names), False


def pack(code: Path, names: list[str]) -> bytes:
    """A deterministic tar of these files of `code` (same tree, same bytes, same digest)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            info = tar.gettarinfo(str(code / name), arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if info.isreg():
                with open(code / name, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return buf.getvalue()


def take(code: Path, *, whole_dir: bool) -> CodeSnapshot:
    """Snapshot `code`: tar, digest and the git facts (None/False/'' outside git).

    Outside a git work tree every file under `code` is taken, which only `--code DIR` asks
    for (`whole_dir`): the working directory of a laptop may be a whole home directory.
    """
    if not code.is_dir():
        raise SlurmgenError(f"code: {str(code)!r} is not a directory")
    names, in_git = _files(code)
    if not in_git and not whole_dir:
        raise SlurmgenError(
            f"code: {str(code.resolve())!r} is not in a git work tree, so what to ship is unclear",
            hint="pass --code DIR to ship everything under DIR",
        )
    tar = pack(code, names)
    commit, dirty, diff = None, False, ""
    head = _git(code, "rev-parse", "HEAD") if in_git else None
    if head is not None and head.returncode == 0:
        commit = head.stdout.decode().strip()
        status = _git(code, "status", "--porcelain", "--untracked-files=normal")
        dirty = bool(status.stdout.strip())
        diff = _git(code, "diff", "HEAD", "--binary").stdout.decode(errors="replace")[:MAX_DIFF]
    return CodeSnapshot(hashlib.sha256(tar).hexdigest()[:20], tar, len(names), commit, dirty, diff)
