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
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from slurmgen import atomic
from slurmgen.jsonl import objects

RUN_FILE = "run.json"
HPARAMS_FILE = "hparams.yaml"
METRICS_FILE = "metrics.jsonl"
ARTIFACTS_FILE = "artifacts.jsonl"
# Beside a rank's heartbeat ($SLURMGEN_HEARTBEAT_DIR): which run record the rank writes, so the
# launcher watching it (the coordinator's agent) can say so without searching for it.
ANNOUNCE_FILE = "run-record-{rank}.json"
FORMAT = 1


def write_text_atomic(path: Path, text: str, in_place_when_full: bool = False) -> None:
    """Write `text` to `path` through a temporary file, fsync, rename (see module docstring);
    a failed write (a full disk) leaves no temporary file. `in_place_when_full`: see
    `atomic.write_text` (for the record of a run that ends on a full disk)."""
    atomic.write_text(path, text, fsync=True, in_place_when_full=in_place_when_full)


STALE_TEMP_AGE = atomic.STALE_AGE


def remove_stale_temporaries(run_dir: Path, min_age: float = STALE_TEMP_AGE) -> list[Path]:
    """Delete what a writer killed between write and rename left behind; return what went.

    Why: after a kill -9 inside write_text_atomic, its `.run.json.tmp.<pid>` (or hparams.yaml's,
    metrics.jsonl's) would stay in the run directory for good; nothing else removes it. This
    runs when a run is opened, new or resumed, and touches only the store's own temporary
    names, and only those nobody can still be writing (`atomic.remove_stale` says how).
    """
    return atomic.remove_stale(run_dir, (RUN_FILE, HPARAMS_FILE, METRICS_FILE), min_age)


def write_json_atomic(path: Path, data: Any, in_place_when_full: bool = False) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n", in_place_when_full)


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def iter_jsonl(path: Path) -> Iterator[dict]:
    """The complete records of a JSONL file; a line cut by a crash (or any junk) is skipped."""
    try:
        f = open(path, encoding="utf-8")  # noqa: SIM115  (closed by the `with f:` below, after the missing-file case)
    except FileNotFoundError:
        return
    with f:
        # A last line without its newline is a killed writer's: it ends the file.
        yield from objects(itertools.takewhile(lambda line: line.endswith("\n"), f))


def tail_lines(path: Path, max_bytes: int) -> list[str]:
    """The complete lines among the last `max_bytes` of a JSONL file, oldest first: a long run's
    latest records without reading all of it (the first line there, likely cut by the start, and
    a last one without its newline are left out); [] when there is no file."""
    try:
        with open(path, "rb") as f:
            start = max(0, f.seek(0, 2) - max_bytes)
            f.seek(start)
            lines = f.read().decode("utf-8", errors="replace").splitlines(keepends=True)
    except FileNotFoundError:
        return []
    return list(itertools.takewhile(lambda line: line.endswith("\n"), lines[1:] if start else lines))


def rewrite_jsonl(path: Path, records: Iterable[dict]) -> None:
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in records))


class JsonlAppender:
    """An append-only JSONL file kept open; each record is one write of one whole line, flushed,
    so a reader (`slurmgen runs` while training) sees complete lines."""

    def __init__(self, path: Path):
        self.path = path
        self._file: IO[str] | None = None

    def append(self, record: dict) -> None:
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115  (held past this line: a child's output or a writer kept open)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _yaml_key(key: str) -> str:
    plain = (
        key
        and (key[0].isalpha() or key[0] == "_")
        and all(c.isalnum() or c in "._-/" for c in key)
        and key.lower() not in ("true", "false", "null", "yes", "no", "on", "off", "y", "n", "~")
    )
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
