"""The files of a run directory, and how each is written so a crash leaves it readable.

    <root>/<group>/<key>/
      run.json          who, what, where, status, attempts (rewritten atomically)
      hparams.yaml      the flattened hyperparameters (rewritten atomically)
      metrics.jsonl     one line per `log` call: {"type", "step", "epoch", "time", "metrics"}
      artifacts.jsonl   one line per marked artifact: {"role", "name", "type", "step", "files"}

Why these formats: a person reads run.json and hparams.yaml with `cat`, the JSONL files grow by
appending a line, so a metrics record costs one small write and a kill -9 can at worst cut the
last line, which every reader here skips. Files that are replaced whole (run.json,
hparams.yaml, a metrics file cut back on resume) go through a temporary file in the same
directory, fsync and rename: readers see the old or the new file, never half of one. A
temporary file left by a writer killed before its rename is removed when the run is next
opened (`remove_stale_temporaries`).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

from slurmgen.jsonl import objects

RUN_FILE = "run.json"
HPARAMS_FILE = "hparams.yaml"
METRICS_FILE = "metrics.jsonl"
ARTIFACTS_FILE = "artifacts.jsonl"
# Beside a rank's heartbeat ($SLURMGEN_HEARTBEAT_DIR): which run record the rank writes, so the
# launcher watching it (the coordinator's agent) can say so without searching for it.
ANNOUNCE_FILE = "run-record-{rank}.json"
FORMAT = 1


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file, fsync, rename (see module docstring)."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# A temporary file of write_text_atomic for one of the files above: `.run.json.tmp.<pid>` etc.
_TEMP_NAME = re.compile(r"\.(%s)\.tmp\.([1-9][0-9]*)" % "|".join(map(re.escape, (RUN_FILE, HPARAMS_FILE, METRICS_FILE))))
STALE_TEMP_AGE = 60.0  # seconds; a real write takes well under a second


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's process, or not a pid we can ask about: leave its file alone
    return True


def remove_stale_temporaries(run_dir: Path, min_age: float = STALE_TEMP_AGE) -> list[Path]:
    """Delete what a writer killed between write and rename left behind; return what went.

    Why: after a kill -9 inside write_text_atomic, its `.run.json.tmp.<pid>` (or hparams.yaml's,
    metrics.jsonl's) would stay in the run directory for good; nothing else removes it. This
    runs when a run is opened, new or resumed, and touches only the store's own temporary
    names, and only those nobody can still be writing: older than `min_age` seconds AND named
    with a pid that is not a live process on this host. Both, since each alone can be wrong
    while another process writes the same directory (a second process given the same id):
    a writer on this host that is stopped mid-write (job suspended) has an old file but a live
    pid; a writer on another host (run directory on a shared file system) has a pid that means
    nothing here, but a fresh file. Errors are ignored: tidying up must not stop a run.
    """
    removed: list[Path] = []
    try:
        names = os.listdir(run_dir)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        match = _TEMP_NAME.fullmatch(name)
        if not match:
            continue
        path = run_dir / name
        try:
            if now - path.lstat().st_mtime < min_age or _pid_alive(int(match.group(2))):
                continue
            path.unlink()
        except OSError:  # renamed or removed meanwhile, or not ours to delete
            continue
        removed.append(path)
    return removed


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def iter_jsonl(path: Path) -> Iterator[dict]:
    """The complete records of a JSONL file; a line cut by a crash (or any junk) is skipped."""
    try:
        f = open(path, encoding="utf-8")
    except FileNotFoundError:
        return
    with f:
        # A last line without its newline is a killed writer's: it ends the file.
        yield from objects(itertools.takewhile(lambda line: line.endswith("\n"), f))


def rewrite_jsonl(path: Path, records: Iterable[dict]) -> None:
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in records))


class JsonlAppender:
    """An append-only JSONL file kept open; each record is one write of one whole line, flushed,
    so a reader (`slurmgen runs` while training) sees complete lines."""

    def __init__(self, path: Path):
        self.path = path
        self._file = None

    def append(self, record: dict) -> None:
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _yaml_key(key: str) -> str:
    plain = key and (key[0].isalpha() or key[0] == "_") and all(c.isalnum() or c in "._-/" for c in key) and key.lower() not in (
        "true", "false", "null", "yes", "no", "on", "off", "y", "n", "~")
    return key if plain else json.dumps(key)


def hparams_yaml(flat: dict[str, Any]) -> str:
    """A flat mapping as YAML, one `key: value` a line. Values are written as JSON, which YAML
    reads back exactly (a JSON document is YAML), so no YAML library is needed on the ranks."""
    lines = ["# Hyperparameters of this run, flattened (written by slurmgen.tracking)."]
    lines += [f"{_yaml_key(k)}: {json.dumps(v)}" for k, v in flat.items()]
    return "\n".join(lines) + "\n"


def read_hparams(path: Path) -> dict[str, Any]:
    """hparams.yaml as written above (JSON values), without a YAML library."""
    out: dict[str, Any] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith('"'):
            key, rest = json.JSONDecoder().raw_decode(line)
            value_text = line[rest:].lstrip(": ")
        else:
            key, _, value_text = line.partition(": ")
        try:
            out[key] = json.loads(value_text)
        except ValueError:
            out[key] = value_text
    return out
