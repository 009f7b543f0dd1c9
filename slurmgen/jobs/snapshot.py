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
class Snapshot:
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


def pack(code: Path, extra: dict[str, bytes] | None = None) -> tuple[bytes, int]:
    """A deterministic tar of `code`'s files (plus `extra` files given by name), and the file count."""
    names, _ = _files(code)
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
        for name, data in sorted((extra or {}).items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), len(names) + len(extra or {})


def take(code: Path) -> Snapshot:
    """Snapshot `code`: tar, digest and the git facts (None/False/'' outside git)."""
    if not code.is_dir():
        raise SlurmgenError(f"code: {str(code)!r} is not a directory")
    tar, count = pack(code)
    commit, dirty, diff = None, False, ""
    head = _git(code, "rev-parse", "HEAD") if _files(code)[1] else None
    if head is not None and head.returncode == 0:
        commit = head.stdout.decode().strip()
        status = _git(code, "status", "--porcelain", "--untracked-files=normal")
        dirty = bool(status.stdout.strip())
        diff = _git(code, "diff", "HEAD", "--binary").stdout.decode(errors="replace")[:MAX_DIFF]
    return Snapshot(hashlib.sha256(tar).hexdigest()[:20], tar, count, commit, dirty, diff)
