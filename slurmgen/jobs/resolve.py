"""JOB on the command line -> a registered job (and an array task): by id, ID_N, name or dir."""

from __future__ import annotations

import re
from pathlib import Path

from slurmgen.errors import SlurmgenError
from slurmgen.jobs.registry import JobRecord, Registry
from slurmgen.jobs.slurm import valid_job_id

_ID_LIKE = re.compile(r"^[0-9_.\-+]+$")


def find(registry: Registry, ref: str) -> tuple[JobRecord, str | None]:
    """The newest registered job `ref` names, and the array task index if it names one."""
    if _ID_LIKE.match(ref):
        if not valid_job_id(ref):
            raise SlurmgenError(f"job: {ref!r} is not a job id (expected a number like 1234, or 1234_5 for an array task)")
        job_id, _, task = ref.partition("_")
        record = registry.get(job_id)
        if record is None:
            raise SlurmgenError(f"job: {ref} is not in the registry {str(registry.path)!r}",
                                hint="`slurmgen jobs` lists the registered jobs")
        if task and not record.info.get("array"):
            raise SlurmgenError(f"job: {job_id} is not an array job, so {ref!r} names no task of it")
        return record, task or None
    path = Path(ref)
    if path.is_dir():
        from slurmgen.render import SPEC_FILE  # only here: a lookup by id stays free of jinja2 and pydantic

        if not (path / SPEC_FILE).is_file():
            raise SlurmgenError(f"job: directory {ref!r} holds no {SPEC_FILE}; it is not a slurmgen output dir")
        found = registry.by_output_dir(str(path.resolve()))
        if not found:
            raise SlurmgenError(f"job: no job was submitted from {ref!r}", hint="`slurmgen jobs` lists the registered jobs")
        return found[0], None
    found = registry.by_name(ref)
    if not found:
        raise SlurmgenError(f"job: no registered job has the id, name or output dir {ref!r}",
                            hint="`slurmgen jobs` lists the registered jobs")
    return found[0], None
