"""JOB on the command line -> a registered job (and an array task): by id, ID_N, name or dir.

A bare word is a job name first and a directory second: a folder that happens to share a
job's name (`./bt/` beside job "bt") must not hide the job. A path with a slash (`./bt`) is
a directory only. A reused id means its newest job; `note` names the older ones."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from slurmgen.errors import SlurmgenError
from slurmgen.jobs.slurm import valid_job_id
from slurmgen.runs.registry import JobRecord, Registry

_ID_LIKE = re.compile(r"^[0-9_.\-+]+$")


def _quiet(_: str) -> None:
    pass


def find(registry: Registry, ref: str, note: Callable[[str], None] = _quiet) -> tuple[JobRecord, str | None]:
    """The newest registered job `ref` names, and the array task index if it names one."""
    if _ID_LIKE.match(ref):
        if not valid_job_id(ref):
            raise SlurmgenError(
                f"job: {ref!r} is not a job id (expected a number like 1234, or 1234_5 for an array task)"
            )
        job_id, _, task = ref.partition("_")
        found = registry.with_id(job_id)
        if not found:
            raise SlurmgenError(
                f"job: {ref} is not in the registry {str(registry.path)!r}",
                hint="`slurmgen jobs` lists the registered jobs",
            )
        record = found[0]
        if task and not record.info.get("array"):
            raise SlurmgenError(f"job: {job_id} is not an array job, so {ref!r} names no task of it")
        if len(found) > 1:
            note(
                f"{len(found)} registered jobs have the id {job_id}; this is the newest, {describe(record)}; "
                f"older: {'; '.join(describe(r) for r in found[1:])}"
            )
        return record, task or None
    named = [] if os.sep in ref else registry.by_name(ref)
    if named:
        if Path(ref).is_dir():
            note(
                f"{ref!r} is the name of job {named[0].job_id}, which is meant; for a job submitted from "
                f"the directory {ref!r}, give it as .{os.sep}{ref}"
            )
        return named[0], None
    if Path(ref).is_dir():
        return _by_dir(registry, ref), None
    raise SlurmgenError(
        f"job: no registered job has the id, name or output dir {ref!r}",
        hint="`slurmgen jobs` lists the registered jobs",
    )


def _by_dir(registry: Registry, ref: str) -> JobRecord:
    """The newest job submitted from output directory `ref` (no job has `ref` for its name)."""
    from slurmgen.generate.render import SPEC_FILE  # only here: a lookup by id stays free of jinja2 and the spec

    nameless = "" if os.sep in ref else f"no registered job is named {ref!r}, and "
    if not (Path(ref) / SPEC_FILE).is_file():
        raise SlurmgenError(
            f"job: {nameless}directory {ref!r} holds no {SPEC_FILE}; it is not a slurmgen output dir",
            hint="`slurmgen jobs` lists the registered jobs",
        )
    found = registry.by_output_dir(str(Path(ref).resolve()))
    if not found:
        raise SlurmgenError(
            f"job: {nameless}no job was submitted from directory {ref!r}",
            hint="`slurmgen jobs` lists the registered jobs",
        )
    return found[0]


def reused_note(registry: Registry, record: JobRecord) -> str | None:
    """Why Slurm cannot be asked about `record`: its cluster gave its id to a later job (else None)."""
    newer = registry.superseded().get(record.seq) if record.seq is not None else None
    later = registry.by_seq(newer) if newer is not None else None
    if later is None:
        return None
    return (
        f"the id {record.job_id} now names a later job, {describe(later)}: what Slurm says "
        f"of {record.job_id} is about that one, so this is the last state seen of {describe(record)}"
    )


def describe(record: JobRecord) -> str:
    """One job among several with the same id: its name, submit time, cluster and output dir."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.submitted))
    where = f" on {record.cluster}" if record.cluster else ""
    return f"{record.name!r} submitted {when}{where} into {record.output_dir}"
