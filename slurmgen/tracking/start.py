"""`init()`: the one way to get a run, new or continued (see run.py for what a run is).

    run = init("runs/exp", config=hparams, mode="rank0")     # rank 0 records, others no-op
    run = init("runs/exp", mode="per-process")                # every process its own run, one group

Names come from the arguments, else the environment (`SLURMGEN_GROUP`, `SLURMGEN_JOB_TYPE`,
`SLURMGEN_RUN_NAME`, `SLURMGEN_DESCRIPTION`, `SLURMGEN_TRACKERS`), else the defaults of
identity.py, so a launcher can name every rank's run without touching the training code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from . import store, system
from .adapters import create as create_adapter, parse_trackers
from .errors import TrackingError
from .identity import Place, check_mode, default_group, job_type_for, place_from_env, run_key, slug
from .run import NoOpRun, Run, forget_open, now_iso, register
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


def init(dir: str | os.PathLike[str] = "runs", *, name: str | None = None, group: str | None = None,
         job_type: str | None = None, description: str | None = None, tags: Iterable[str] | str | None = None,
         config: object = None, mode: str = "rank0", id: str | None = None, resume_step: int | None = None,
         trackers: str | Iterable[str] | None = None, place: Place | Mapping[str, Any] | None = None,
         hosts: Iterable[str] | None = None, environ: Mapping[str, str] | None = None) -> Run | NoOpRun:
    """Start (or continue) this process's run under `dir` and return it.

    mode: "rank0" (only rank 0 records; other ranks get a NoOpRun) or "per-process".
    config: the hyperparameters (dict, dataclass or Namespace), stored flattened.
    resume_step: when continuing a run, the step training resumes from (the checkpoint's);
      its records after that step are dropped, the resumed job logs them again.
    trackers: adapters to mirror to, e.g. "tensorboard,wandb" (default: $SLURMGEN_TRACKERS).
    place: rank, local_rank, node_rank, world_size, ... (default: from the environment).
    """
    environ = os.environ if environ is None else environ
    mode = check_mode(mode)
    where = _place(place, environ)
    names = parse_trackers(trackers if trackers is not None else environ.get("SLURMGEN_TRACKERS"))
    resume_step = check_step("resume_step", resume_step)
    tag_list = _tags(tags)
    flat = flatten(config) if config is not None else None
    group = _text("group", group, environ.get("SLURMGEN_GROUP"))
    template = _text("job_type", job_type, environ.get("SLURMGEN_JOB_TYPE"))
    name = _text("name", name, environ.get("SLURMGEN_RUN_NAME"))
    description = _text("description", description, environ.get("SLURMGEN_DESCRIPTION"))
    if id is not None:
        check_name("id", id)
    if mode == "rank0" and where.rank != 0:
        return NoOpRun()

    host, pid = system.hostname(), os.getpid()
    group = group or default_group(environ, where, host, pid)
    job_type_value, is_default = job_type_for(mode, where, template)
    root = Path(dir)
    run_dir = root / slug(group) / (slug(id) if id else run_key(mode, job_type_value, is_default, where.rank))
    run_dir.mkdir(parents=True, exist_ok=True)
    forget_open(run_dir)
    store.remove_stale_temporaries(run_dir)
    meta_path = run_dir / store.RUN_FILE
    existing = meta_path.is_file()
    start = now_iso()
    slurm = system.slurm_info(environ)
    attempt = {"attempt": 1, "start": start, "end": None, "status": "running", "host": host, "pid": pid}
    if slurm.get("job_id"):
        attempt["slurm_job_id"] = slurm["job_id"]
    if environ.get("SLURMGEN_LAUNCH_ID"):
        attempt["launch_id"] = environ["SLURMGEN_LAUNCH_ID"]
    if resume_step is not None:
        attempt["resumed_at_step"] = resume_step

    if existing:
        meta = _previous(meta_path)
        records = [r for r in store.iter_jsonl(run_dir / store.METRICS_FILE)
                   if resume_step is None or _step(r) <= resume_step]
        attempt["attempt"] = len(meta["attempts"]) + 1
        meta["attempts"].append(attempt)
        meta["restart_count"] = len(meta["attempts"]) - 1
        for key, value in (("name", name), ("description", description)):
            if value is not None:
                meta[key] = value
        if tag_list:
            meta["tags"] = tag_list
    else:
        records = []
        meta = {
            "format": store.FORMAT, "id": f"{slug(group)}/{run_dir.name}", "name": name or _default_name(environ, group),
            "description": description or "", "group": group, "job_type": job_type_value, "tags": tag_list,
            "mode": mode, "status": "running", "start": start, "end": None, "updated": start, "restart_count": 0,
            "attempts": [attempt],
        }
    floor: dict[str, int] = {}
    summary: dict[str, dict[str, Any]] = {}
    for r in records:
        floor[r["type"]] = max(floor.get(r["type"], -1), _step(r))
        summary.setdefault(r["type"], {}).update(r.get("metrics") or {})
    last_step = max(floor.values(), default=-1)
    meta.update(
        status="running", end=None, steps=last_step if last_step >= 0 else None, summary=summary,
        world={k: v for k, v in where.as_dict().items() if v is not None},
        hosts=sorted(set(hosts)) if hosts else [host], slurm=slurm, git=system.git_info(),
        versions=system.versions(), command=system.command(),
    )
    sweep = system.sweep_info(environ)
    if sweep:
        meta["sweep"] = sweep
    meta.pop("exit_code", None)
    meta.setdefault("artifacts", {})
    meta.setdefault("adapters", {})

    adapters = [create_adapter(n, run_dir, root) for n in names]
    hparams = flat if flat is not None else store.read_hparams(run_dir / store.HPARAMS_FILE)
    for adapter in adapters:  # before any file changes: a tracker that cannot start leaves the record as it was
        try:
            state = adapter.start(meta, hparams, meta["adapters"].get(adapter.name))
        except TrackingError:
            raise
        except Exception as exc:
            first_line = (str(exc).strip().splitlines() or [""])[0][:300]
            raise TrackingError("tracker", f"{adapter.name} could not start: {type(exc).__name__}: {first_line}",
                                adapter.name) from exc
        if state:
            meta["adapters"][adapter.name] = state
    if existing:
        store.rewrite_jsonl(run_dir / store.METRICS_FILE, records)  # drops steps to redo and a cut last line
    if flat is not None:
        store.write_text_atomic(run_dir / store.HPARAMS_FILE, store.hparams_yaml(flat))
    store.write_json_atomic(meta_path, meta)
    run = Run(run_dir, root, meta, floor, last_step, adapters)
    register(run)
    return run


def _step(record: Mapping[str, Any]) -> int:
    step = record.get("step")
    return step if isinstance(step, int) else -1


def _previous(path: Path) -> dict[str, Any]:
    """The run.json of an earlier attempt; an attempt that never finished is marked lost."""
    try:
        meta = store.read_json(path)
    except ValueError as exc:
        raise TrackingError("run.json", f"cannot continue the run in {path.parent}: not valid JSON ({exc})",
                            str(path), has_value=False) from None
    attempts = meta.setdefault("attempts", [])
    if attempts and attempts[-1].get("status") == "running":
        attempts[-1].update(status="lost", end=meta.get("updated"))
    return meta


def _default_name(environ: Mapping[str, str], group: str) -> str:
    job_name = (environ.get("SLURM_JOB_NAME") or "").strip()
    return job_name if job_name and job_name not in ("bash", "sh", "interactive") else group
