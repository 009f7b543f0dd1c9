"""`init()`: the one way to get a run, new or continued (see run.py for what a run is).

    run = init("runs/exp", config=hparams, mode="rank0")     # rank 0 records, others no-op
    run = init("runs/exp", mode="per-process")                # every process its own run, one group

Names come from the arguments, else the environment (`SLURMGEN_GROUP`, `SLURMGEN_JOB_TYPE`,
`SLURMGEN_RUN_NAME`, `SLURMGEN_DESCRIPTION`, `SLURMGEN_TRACKERS`), else the defaults of
identity.py, so a launcher can name every rank's run without touching the training code.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmgen.contract import envvars, files
from slurmgen.contract.states import RUN_RECORD_LOST

from . import store, system
from .adapters import create as create_adapter
from .adapters import parse_trackers
from .errors import TrackingError
from .identity import Place, check_mode, default_group, job_type_for, place_from_env, run_key, slug
from .run import RUNNING, NoOpRun, Run, forget_open, now_iso, register
from .values import check_name, check_step, flatten


def _place(place: Place | Mapping[str, Any] | None, environ: Mapping[str, str]) -> Place:
    if place is None:
        return place_from_env(environ)
    if isinstance(place, Place):
        return place
    fields = {k: place[k] for k in Place.__dataclass_fields__ if k in place}
    return Place(**fields)


def _text(field: str, value: object, env_value: str | None) -> str | None:
    if value is None:
        value = (env_value or "").strip() or None
    return None if value is None else check_name(field, value)


def _tags(tags: Iterable[str] | str | None) -> list[str]:
    if tags is None:
        return []
    if isinstance(tags, str):
        tags = [t for t in tags.split(",") if t.strip()]
    return [check_name("tags", t) for t in tags]


def init(
    dir: str | os.PathLike[str] = files.RECORDS_DIR,
    *,
    name: str | None = None,
    group: str | None = None,
    job_type: str | None = None,
    description: str | None = None,
    tags: Iterable[str] | str | None = None,
    config: object = None,
    mode: str = "rank0",
    id: str | None = None,
    resume_step: int | None = None,
    trackers: str | Iterable[str] | None = None,
    place: Place | Mapping[str, Any] | None = None,
    hosts: Iterable[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Run | NoOpRun:
    """Start (or continue) this process's run under `dir` and return it.

    mode: "rank0" (only rank 0 records; other ranks get a NoOpRun) or "per-process".
    config: the hyperparameters (dict, dataclass or Namespace), stored flattened.
    resume_step: when continuing a run, the step training resumes from (the checkpoint's);
      its records after that step are dropped, the resumed job logs them again.
    trackers: adapters to mirror to, e.g. "tensorboard,wandb" (default: $SLURMGEN_TRACKERS).
    place: rank, local_rank, node_rank, world_size, ... (default: from the environment).

    Every argument is checked before anything is written, on every rank alike (a rank that
    records nothing still fails on a bad name); then, in order: who the run is (identity),
    what its run.json says (metadata), the trackers it mirrors to (adapters), and the files.
    """
    environ = os.environ if environ is None else environ
    mode = check_mode(mode)
    where = _place(place, environ)
    names = parse_trackers(trackers if trackers is not None else environ.get(envvars.TRACKERS))
    resume_step = check_step("resume_step", resume_step)
    tag_list = _tags(tags)
    flat = flatten(config) if config is not None else None
    group = _text("group", group, environ.get(envvars.GROUP))
    template = _text("job_type", job_type, environ.get(envvars.JOB_TYPE))
    labels = _Labels(
        _text("name", name, environ.get(envvars.RUN_NAME)),
        _text("description", description, environ.get(envvars.DESCRIPTION)),
        tag_list,
    )
    if id is not None:
        check_name("id", id)
    if mode == "rank0" and where.rank != 0:
        return NoOpRun()

    who = _identity(Path(dir), id, group, template, mode, where, environ)
    _claim(who.run_dir)
    record = _metadata(who, labels, resume_step, environ)
    floor, last_step = _this_attempt(record, who, where, hosts, environ)
    adapters = _start_adapters(names, who, record.meta, flat)
    _write(who.run_dir, record, flat)
    run = Run(who.run_dir, who.root, record.meta, floor, last_step, adapters)
    register(run)
    _announce(who.run_dir, run.id, where.rank, environ)
    return run


def _announce(run_dir: Path, run_id: str, rank: int, environ: Mapping[str, str]) -> None:
    """Tell the launcher watching this rank which run record it writes (a file beside its
    heartbeat): the coordinator's page then draws an attempt's curves from the records its
    own ranks named, never from a search of directories. Best effort: tracking goes on."""
    beside = environ.get(envvars.HEARTBEAT_DIR, "").strip()
    if not beside:
        return
    with contextlib.suppress(OSError):
        store.write_json_atomic(
            Path(beside) / store.ANNOUNCE_FILE.format(rank=rank), {"dir": str(run_dir.resolve()), "id": run_id}
        )


# ---- identity: which run this process writes -----------------------------------------------
@dataclass(frozen=True)
class _Identity:
    """Which run this is: its directory under the root, and the group and job type it files
    under (every rank derives the same answer on its own, see identity.py); and where this
    process runs it (host, pid, the Slurm job)."""

    root: Path
    run_dir: Path
    group: str
    job_type: str
    mode: str
    host: str
    pid: int
    slurm: dict[str, str]


def _identity(
    root: Path,
    id: str | None,
    group: str | None,
    template: str | None,
    mode: str,
    where: Place,
    environ: Mapping[str, str],
) -> _Identity:
    host, pid = system.hostname(), os.getpid()
    group = group or default_group(environ, where, host, pid)
    job_type, is_default = job_type_for(mode, where, template)
    key = slug(id) if id else run_key(mode, job_type, is_default, where.rank)
    return _Identity(root, root / slug(group) / key, group, job_type, mode, host, pid, system.slurm_info(environ))


def _claim(run_dir: Path) -> None:
    """Make the run's directory ours: an older Run of it in this process stops writing, and
    what a killed attempt left half-written goes (before run.json is read)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    forget_open(run_dir)
    store.remove_stale_temporaries(run_dir)


# ---- metadata: what run.json says ----------------------------------------------------------
@dataclass(frozen=True)
class _Labels:
    """What people call the run; each attempt may rename it (None/empty: keep what it had)."""

    name: str | None
    description: str | None
    tags: list[str]


@dataclass
class _Record:
    """run.json as this attempt will write it, and the metric records it keeps."""

    meta: dict[str, Any]
    records: list[dict[str, Any]]
    continued: bool  # an earlier attempt left a run.json


def _metadata(who: _Identity, labels: _Labels, resume_step: int | None, environ: Mapping[str, str]) -> _Record:
    """A continued run gets one more attempt and keeps its records up to `resume_step` (the
    resumed job logs the later ones again); a new run starts with this attempt alone."""
    meta_path = who.run_dir / store.RUN_FILE
    existing = meta_path.is_file()
    start = now_iso()
    attempt = _attempt(start, who, environ, resume_step)
    meta: dict[str, Any]
    if not existing:
        meta = {
            "format": store.FORMAT,
            "id": f"{slug(who.group)}/{who.run_dir.name}",
            "name": labels.name or _default_name(environ, who.group),
            "description": labels.description or "",
            "group": who.group,
            "job_type": who.job_type,
            "tags": labels.tags,
            "mode": who.mode,
            "status": RUNNING,
            "start": start,
            "end": None,
            "updated": start,
            "restart_count": 0,
            "attempts": [attempt],
        }
        return _Record(meta, [], continued=False)
    meta = _previous(meta_path)
    records = [
        r for r in store.iter_jsonl(who.run_dir / store.METRICS_FILE) if resume_step is None or _step(r) <= resume_step
    ]
    attempt["attempt"] = len(meta["attempts"]) + 1
    meta["attempts"].append(attempt)
    meta["restart_count"] = len(meta["attempts"]) - 1
    for key, value in (("name", labels.name), ("description", labels.description)):
        if value is not None:
            meta[key] = value
    if labels.tags:
        meta["tags"] = labels.tags
    return _Record(meta, records, continued=True)


def _attempt(start: str, who: _Identity, environ: Mapping[str, str], resume_step: int | None) -> dict[str, Any]:
    """This attempt's entry in run.json's `attempts`: where it runs and what started it."""
    attempt: dict[str, Any] = {
        "attempt": 1,
        "start": start,
        "end": None,
        "status": RUNNING,
        "host": who.host,
        "pid": who.pid,
    }
    if who.slurm.get("job_id"):
        attempt["slurm_job_id"] = who.slurm["job_id"]
    if environ.get(envvars.LAUNCH_ID):
        attempt["launch_id"] = environ[envvars.LAUNCH_ID]
    if resume_step is not None:
        attempt["resumed_at_step"] = resume_step
    return attempt


def _this_attempt(
    record: _Record, who: _Identity, where: Place, hosts: Iterable[str] | None, environ: Mapping[str, str]
) -> tuple[dict[str, int], int]:
    """Set what is true of the run as this attempt starts (running again, the steps and summary
    its kept records add up to, the world, code and versions it runs with). Returns each record
    type's last step and the last step overall, from which the run refuses to log backwards."""
    floor: dict[str, int] = {}
    summary: dict[str, dict[str, Any]] = {}
    for r in record.records:
        floor[r["type"]] = max(floor.get(r["type"], -1), _step(r))
        summary.setdefault(r["type"], {}).update(r.get("metrics") or {})
    last_step = max(floor.values(), default=-1)
    meta = record.meta
    meta.update(
        status=RUNNING,
        end=None,
        steps=last_step if last_step >= 0 else None,
        summary=summary,
        world={k: v for k, v in where.as_dict().items() if v is not None},
        hosts=sorted(set(hosts)) if hosts else [who.host],
        slurm=who.slurm,
        git=system.git_info(),
        versions=system.versions(),
        command=system.command(),
    )
    sweep = system.sweep_info(environ)
    if sweep:
        meta["sweep"] = sweep
    meta.pop("exit_code", None)
    meta.setdefault("artifacts", {})
    meta.setdefault("adapters", {})
    return floor, last_step


# ---- adapters and writes -------------------------------------------------------------------
def _start_adapters(names: tuple[str, ...], who: _Identity, meta: dict[str, Any], flat: dict[str, Any] | None) -> list:
    """Start each tracker before any file changes: one that cannot start leaves the record as
    it was, and fails with one line naming it (its state from an earlier attempt is passed on)."""
    adapters = [create_adapter(n, who.run_dir, who.root) for n in names]
    hparams = flat if flat is not None else store.read_hparams(who.run_dir / store.HPARAMS_FILE)
    for adapter in adapters:
        try:
            state = adapter.start(meta, hparams, meta["adapters"].get(adapter.name))
        except TrackingError:
            raise
        except Exception as exc:
            first_line = (str(exc).strip().splitlines() or [""])[0][:300]
            raise TrackingError(
                "tracker", f"{adapter.name} could not start: {type(exc).__name__}: {first_line}", adapter.name
            ) from exc
        if state:
            meta["adapters"][adapter.name] = state
    return adapters


def _write(run_dir: Path, record: _Record, flat: dict[str, Any] | None) -> None:
    """The files, run.json last: a continued run's metrics lose the steps to redo and a cut
    last line; new hyperparameters replace the old."""
    if record.continued:
        store.rewrite_jsonl(run_dir / store.METRICS_FILE, record.records)
    if flat is not None:
        store.write_text_atomic(run_dir / store.HPARAMS_FILE, store.hparams_yaml(flat))
    store.write_json_atomic(run_dir / store.RUN_FILE, record.meta)


def _step(record: Mapping[str, Any]) -> int:
    step = record.get("step")
    return step if isinstance(step, int) else -1


def _previous(path: Path) -> dict[str, Any]:
    """The run.json of an earlier attempt; an attempt that never finished is marked lost."""
    try:
        meta = store.read_json(path)
    except ValueError as exc:
        raise TrackingError(
            "run.json", f"cannot continue the run in {path.parent}: not valid JSON ({exc})", str(path), has_value=False
        ) from None
    attempts = meta.setdefault("attempts", [])
    if attempts and attempts[-1].get("status") == RUNNING:
        attempts[-1].update(status=RUN_RECORD_LOST, end=meta.get("updated"))
    return meta


def _default_name(environ: Mapping[str, str], group: str) -> str:
    job_name = (environ.get("SLURM_JOB_NAME") or "").strip()
    return job_name if job_name and job_name not in ("bash", "sh", "interactive") else group
