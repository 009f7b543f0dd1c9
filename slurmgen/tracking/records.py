"""Reading run directories back: what `slurmgen runs` lists and `slurmgen plot` draws. Pure I/O.

Readers never trust a run to have ended cleanly: a run.json may say "running" for a process
that was killed, metrics.jsonl may end in a cut line. Everything here reads what is there and
skips what is broken, because the listing is most needed exactly when something went wrong.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from slurmgen.jsonl import objects

from . import store

# Directories that never hold run records and can be huge: not walked into.
SKIP_DIRS = {"checkpoints", "heartbeats", "wandb", "tensorboard", "mlruns", "swanlog", "logs", "__pycache__", ".git"}
MAX_DEPTH = 6


@dataclass
class RunRecord:
    """One run directory as read from disk."""

    dir: Path
    meta: dict[str, Any]
    _metrics: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def metrics(self) -> list[dict[str, Any]]:
        if self._metrics is None:
            self._metrics = list(store.iter_jsonl(self.dir / store.METRICS_FILE))
        return self._metrics

    @property
    def artifacts(self) -> list[dict[str, Any]]:
        return list(store.iter_jsonl(self.dir / store.ARTIFACTS_FILE))

    @property
    def hparams(self) -> dict[str, Any]:
        return store.read_hparams(self.dir / store.HPARAMS_FILE)

    def get(self, key: str, default: Any = None) -> Any:
        return self.meta.get(key, default)

    @property
    def sweep(self) -> dict[str, Any] | None:
        """{"id": "slurm-<array>", "task": N, "params": {...}} for a task of a sweep, else None."""
        sweep = self.meta.get("sweep")
        return sweep if isinstance(sweep, dict) and isinstance(sweep.get("id"), str) else None

    @property
    def steps(self) -> int | None:
        steps = [r["step"] for r in self.metrics if isinstance(r.get("step"), int)]
        return max(steps) if steps else None

    def last(self, metric: str = "loss", types: tuple[str, ...] = ("train", "val", "test")) -> float | None:
        """The latest value of `metric`, preferring the first type in `types` that has one."""
        for kind in types:
            found = _latest(reversed(self.metrics), metric, kind)
            if found is not None:
                return found
        return None

    def last_in_tail(self, metric: str, kind: str, max_bytes: int) -> float | None:
        """The latest value of `metric` of type `kind` among the last `max_bytes` of the metrics file,
        parsed from the end until found: the runs list asks for every run's every few seconds."""
        return _latest(objects(reversed(store.tail_lines(self.dir / store.METRICS_FILE, max_bytes))), metric, kind)

    def duration(self) -> float | None:
        """Seconds spent running, summed over attempts (the time between attempts is not counted)."""
        total, seen = 0.0, False
        for attempt in self.meta.get("attempts") or []:
            start = _time(attempt.get("start"))
            end = _time(attempt.get("end")) or (
                _time(self.meta.get("updated")) if attempt is self.meta["attempts"][-1] else None
            )
            if start is not None and end is not None and end >= start:
                total, seen = total + end - start, True
        return total if seen else None


def _latest(records: Iterable[dict[str, Any]], metric: str, kind: str) -> float | None:
    """The first value of `metric` among `records` of type `kind` (given newest first)."""
    for record in records:
        if record.get("type") == kind and metric in (record.get("metrics") or {}):
            return record["metrics"][metric]
    return None


def format_duration(seconds: float | None) -> str:
    """12s, 3m05s, 2h07m: as long as it needs to be, no longer."""
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def _time(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def read_run(path: str | os.PathLike[str]) -> RunRecord:
    """The run in directory `path` (or of the run.json file `path`). Raises FileNotFoundError/ValueError."""
    p = Path(path)
    if p.is_file():
        p = p.parent
    try:
        meta = store.read_json(p / store.RUN_FILE)
    except UnicodeDecodeError:
        raise ValueError(f"{p / store.RUN_FILE} is damaged (not UTF-8 text)") from None
    except ValueError as exc:
        raise ValueError(f"{p / store.RUN_FILE} is damaged (not valid JSON: {exc})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{p / store.RUN_FILE} does not hold a run record")
    return RunRecord(p, meta)


def find_runs(root: str | os.PathLike[str], damaged: list[str] | None = None) -> Iterator[RunRecord]:
    """Every run under `root` (itself included), in path order.

    Unreadable ones are skipped, so one damaged file does not hide the others; each is
    described in `damaged` (when given), for the caller to warn about.
    """
    root = Path(root)
    base_depth = len(root.parts)
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if store.RUN_FILE in filenames:
            try:
                record = read_run(here)
            except OSError as exc:
                if damaged is not None:
                    damaged.append(f"{here / store.RUN_FILE} cannot be read ({exc.strerror or exc})")
            except ValueError as exc:
                if damaged is not None:
                    damaged.append(str(exc))
            else:
                yield record
            dirnames[:] = []  # a run holds no runs
            continue
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in SKIP_DIRS and not d.startswith(".") and len(here.parts) - base_depth < MAX_DEPTH
        )


def sweeps_together(runs: list[RunRecord]) -> list[RunRecord]:
    """The runs in their order, except that a sweep's tasks come together, in task order, where
    its first task was met (task 10's directory sorts before task 2's)."""
    first: dict[str, int] = {}
    for i, run in enumerate(runs):
        if run.sweep:
            first.setdefault(run.sweep["id"], i)

    def place(item: tuple[int, RunRecord]) -> tuple[int, int, int]:
        i, run = item
        return (first[run.sweep["id"]], _task(run), i) if run.sweep else (i, -1, i)

    return [run for _, run in sorted(enumerate(runs), key=place)]


def sweep_runs(runs: list[RunRecord], sweep_id: str) -> list[RunRecord]:
    """The runs of one sweep (by its id, e.g. slurm-1234), in task order."""
    return sweeps_together([r for r in runs if r.sweep and r.sweep["id"] == sweep_id])


def _task(run: RunRecord) -> int:
    task = (run.sweep or {}).get("task")
    return task if isinstance(task, int) else -1


def resolve_runs(spec: str, root: str | os.PathLike[str] = "runs", damaged: list[str] | None = None) -> list[RunRecord]:
    """The run a person names: its directory, its run.json, or its id / name / group under `root`;
    or, named by its id (slurm-<array id>), the runs of a sweep, in task order. Raises LookupError
    with the candidates when the name is ambiguous or unknown; damaged records met on the way are
    described in `damaged` (see `find_runs`)."""
    p = Path(spec)
    if (p / store.RUN_FILE).is_file() or (p.is_file() and p.name == store.RUN_FILE):
        return [read_run(p)]
    if not Path(root).is_dir():
        raise LookupError(f"no run directory {spec!r} and no {str(root)!r} directory to search for it")
    runs = list(find_runs(root, damaged))
    for key in ("id", "name", "group"):
        hits = [r for r in runs if r.get(key) == spec]
        if len(hits) == 1:
            return hits
        if len(hits) > 1:
            ids = ", ".join(str(r.get("id")) for r in hits[:6])
            sweeps = {r.sweep["id"] if r.sweep else None for r in hits}
            one = (
                f", or the id of their sweep ({sweeps.pop()}) to compare them"
                if len(sweeps) == 1 and None not in sweeps
                else ""
            )
            raise LookupError(f"{spec!r} matches {len(hits)} runs by {key} ({ids}): give a run directory or id{one}")
    tasks = sweep_runs(runs, spec)
    if tasks:
        return tasks
    raise LookupError(f"no run {spec!r}: not a run directory, nor an id, name or group under {str(root)!r}")
