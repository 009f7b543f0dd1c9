"""Artifacts: named, typed sets of files recorded with their sha256 and size.

    ckpt = create_artifact("ckpt-000100", "checkpoint")
    ckpt.add_file("runs/x/checkpoints/ckpt-000000100.pt")
    run.mark_output(ckpt)          # and run.mark_input(dataset) for what the run read

The hash is taken when the file is added, so the record says which bytes the run produced or
read, even if the file is later pruned or overwritten; a later `sha256sum` tells whether a file
on disk is still the one the run made. Files are referenced, never copied: checkpoints are
large and already where they belong.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

from .errors import ArtifactFileError, TrackingError
from .values import ARTIFACT_TYPES, check_choice, check_name

CHUNK = 1 << 20


def sha256_of(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class Artifact:
    """A named, typed set of files. `add_file` hashes at once; marking it records it in a run."""

    def __init__(
        self,
        name: str,
        type: str,
        description: str | None = None,
        metadata: dict | None = None,
        *,
        hash_files: bool = True,
    ):
        self.name = check_name("artifact name", name)
        self.type = check_choice("artifact type", type, ARTIFACT_TYPES)
        if description is not None and not isinstance(description, str):
            raise TrackingError("artifact description", "must be a string", description)
        if metadata is not None and not isinstance(metadata, dict):
            raise TrackingError("artifact metadata", "must be a dict", metadata)
        self.description, self.metadata = description, dict(metadata or {})
        self.files: list[dict[str, Any]] = []
        self._hash = hash_files  # False on a no-op run: other ranks may not even see the file

    def add_file(self, path: str | os.PathLike[str], name: str | None = None) -> Artifact:
        """Add a regular file (recorded with its absolute path, sha256 and size); returns self."""
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise ArtifactFileError("add_file path", "must be a file path", path)
        p = Path(path)
        entry: dict[str, Any] = {"name": name or p.name, "path": str(p.absolute())}
        if self._hash:
            if not p.exists():
                raise ArtifactFileError("add_file path", "no such file", str(path))
            if not p.is_file():
                raise ArtifactFileError("add_file path", "is not a regular file", str(path))
            entry["size"] = p.stat().st_size
            entry["sha256"] = sha256_of(p)
        if any(f["name"] == entry["name"] for f in self.files):
            raise TrackingError("add_file name", f"already in artifact {self.name!r}", entry["name"])
        self.files.append(entry)
        return self

    def record(self, role: str, step: int | None) -> dict[str, Any]:
        """The line written to artifacts.jsonl when the artifact is marked."""
        if not self.files:
            raise TrackingError("artifact", "has no files: call add_file() before marking it", self.name)
        out: dict[str, Any] = {"role": role, "name": self.name, "type": self.type, "step": step, "time": time.time()}
        if self.description:
            out["description"] = self.description
        if self.metadata:
            out["metadata"] = self.metadata
        out["files"] = list(self.files)
        return out

    def __repr__(self) -> str:
        return f"Artifact({self.name!r}, {self.type!r}, files={len(self.files)})"


def create_artifact(name: str, type: str, description: str | None = None, metadata: dict | None = None) -> Artifact:
    """A new artifact, not yet part of any run: add files, then `run.mark_output` / `mark_input`."""
    return Artifact(name, type, description, metadata)
