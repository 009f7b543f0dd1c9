"""`slurmgen.Job`: a job built from the same validated spec as the commands, rendered, submitted
to Slurm or launched over SSH from Python.

The spec comes from `generate/specfile.py` exactly as `create --config FILE --FLAG ...` builds
it: keyword arguments are the spec's field names (the YAML file's keys), and a misspelt one or a
bad value raises the one-line `SlurmgenError` the commands print, naming the field. `submit()`
is `slurmgen submit` (the command calls `sbatch_here` below too), `launch()` is `slurmgen
launch` itself, run as a process of its own: its fan-out owns SIGINT and SIGTERM and blocks
until the job ends, which a notebook must not. Both answer `Handle`s on the registry row the
command writes.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmgen.api.handle import Handle
from slurmgen.contract import envvars
from slurmgen.errors import SlurmgenError

if TYPE_CHECKING:
    from slurmgen.generate.render import Rendered
    from slurmgen.generate.spec import JobSpec
    from slurmgen.jobs.slurm_runner import Runner
    from slurmgen.runs.registry import JobRecord, Registry

LAUNCH_START = 30.0  # seconds a `slurmgen launch` may take to write its registry row (it does so before connecting)


class Job:
    """A validated job spec. `Job(nodes=2, gpus=4, command=["python", "train.py"], sweep={"lr": [1e-3, 1e-4]})`
    takes the fields of `slurmgen schema` (the keys of a YAML spec); `Job.from_yaml(path, **overrides)`
    reads a spec file with the keywords over it, as `--config FILE` with flags does."""

    def __init__(self, **fields: Any) -> None:
        self.spec: JobSpec = _spec(None, fields)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], **overrides: Any) -> Job:
        """The job of the spec file at `path` with `overrides` (fields) over it, as `--config FILE`
        with flags: one spec, validated once, whichever way its fields came."""
        job = cls.__new__(cls)
        job.spec = _spec(Path(path), overrides)
        return job

    def __repr__(self) -> str:
        return (
            f"Job({self.spec.job_name!r}, nodes={self.spec.nodes}, gpus={self.spec.gpus}, digest={self.spec.digest()})"
        )

    def render(self) -> dict[str, str]:
        """The files `slurmgen create` would write into the spec's output_dir, by name, as text;
        nothing is written."""
        from slurmgen.generate.render import render

        return dict(render(self.spec).files)

    def submit(
        self,
        *,
        registry: str | os.PathLike[str] | None = None,
        dependency: str | None = None,
        hold: bool = False,
        force: bool = False,
        check: bool = True,
    ) -> Handle | list[Handle]:
        """Write the scripts, sbatch them here and register the job, as `slurmgen submit` does; its
        handle, or for a sweep (or an --array job) one handle per array task, in task order.
        `force` overwrites the scripts of an earlier submit from the same output_dir. First the
        request is compared with what the cluster has, as the command does: one it can never meet
        raises SlurmgenError with the command's line and nothing is written; `check=False` skips
        that, as `--no-check` does."""
        from slurmgen.generate.preflight import torchrun_note
        from slurmgen.generate.render import render
        from slurmgen.jobs.commands import sbatch_args
        from slurmgen.jobs.logs import array_tasks
        from slurmgen.jobs.request_check import before_submit
        from slurmgen.jobs.slurm_runner import LocalRunner
        from slurmgen.runs.registry import Registry

        where = Path(registry) if registry is not None else None
        rendered = render(self.spec)
        args = sbatch_args(dependency, hold)
        runner = LocalRunner()
        said = [before_submit(runner, rendered, "check=False") if check else None, torchrun_note(self.spec)]
        for note in filter(None, said):  # the command's `slurmgen: note:` lines, as Python warnings
            warnings.warn(note, stacklevel=2)
        with Registry.open(where, create=True) as reg:
            record = sbatch_here(runner, reg, rendered, args, force=force)
        seq = record.seq if record.seq is not None else 0
        if not record.info.get("array"):
            return Handle(where, seq, "slurm", record.job_id)
        return [Handle(where, seq, "slurm", record.job_id, str(t)) for t in array_tasks(record.info)]

    def launch(
        self,
        hosts: str | Sequence[str],
        *,
        registry: str | os.PathLike[str] | None = None,
        options: Sequence[str] = (),
    ) -> Handle:
        """Start the job on `hosts` (a Slurm hostlist or a list of names) over SSH with `slurmgen
        launch`, in the background; its handle once the launch is in the registry. `options` are
        more of launch's flags (`["--max-restarts", "2", "--user", "me"]`). The launch's own output
        is kept in OUTPUT_DIR/launch-ID.out."""
        from slurmgen.generate.hostlist import expand
        from slurmgen.generate.specfile import dump_yaml

        names = expand(hosts) if isinstance(hosts, str) else list(hosts)
        if self.spec.sweep or self.spec.array:
            raise SlurmgenError("sweep: a launch over SSH runs one job; submit a sweep to Slurm (Job.submit)")
        if not names:
            raise SlurmgenError(f"hosts: expected at least one host (got {hosts!r})")
        if self.spec.nodes not in (1, len(names)):  # 1, the default: the hosts decide, as for `slurmgen launch`
            raise SlurmgenError(
                f"nodes: the job asks for {self.spec.nodes} nodes but hosts names {len(names)} ({', '.join(names)})"
            )
        launch_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        out = Path(self.spec.output_dir).absolute()
        out.mkdir(parents=True, exist_ok=True)
        config, env_file = out / f"launch-{launch_id}.yaml", out / f"launch-{launch_id}.env"
        config.write_text(dump_yaml(self.spec))
        env_file.write_text(f"{envvars.LAUNCH_ID}={launch_id}\n")
        where = Path(registry) if registry is not None else None
        argv = [sys.executable, "-m", "slurmgen", "launch", "--config", str(config), "--hosts", ",".join(names)]
        argv += ["--env-file", str(env_file), *(["--registry", str(where)] if where else []), *options]
        with (out / f"launch-{launch_id}.out").open("wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        return _launched(where, launch_id, proc, out / f"launch-{launch_id}.out")


def _spec(config: Path | None, fields: Mapping[str, Any]) -> JobSpec:
    """The spec of `fields` over `config`, built by the commands' own path (generate/specfile.py),
    with `create`'s refusal of a warm restart its program cannot take part in (generate/preflight.py)."""
    from slurmgen.generate.preflight import job_warm_refusal
    from slurmgen.generate.specfile import spec_from_sources

    spec = spec_from_sources(config, {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()})
    refused = job_warm_refusal(spec)
    if refused:
        raise SlurmgenError(refused)
    return spec


def sbatch_here(runner: Runner, reg: Registry, rendered: Rendered, args: list[str], *, force: bool) -> JobRecord:
    """Write the rendered files (all or none) and sbatch them from this directory, registering the
    job: what `slurmgen submit` and `Job.submit()` both do for a job of this machine's Slurm. A
    chain's links are submitted together (jobs/chain.py): the record of its first link."""
    from slurmgen.generate.output import write_files
    from slurmgen.jobs.chain import submit_job

    spec = rendered.spec
    write_files(Path(spec.output_dir), rendered.files, force=force, extra_dirs=[Path(spec.logs)])
    return submit_job(runner, reg, rendered, os.getcwd(), args, None, {})


def _launched(registry: Path | None, launch_id: str, proc: subprocess.Popen[bytes], out: Path) -> Handle:
    """The handle of the launch `proc` runs, once its row is in the registry (written before it
    connects to any host); its own last line as the error when it ends without one (a bad flag)."""
    from slurmgen.runs.model import find_run
    from slurmgen.runs.registry import Registry

    deadline = time.monotonic() + LAUNCH_START
    while True:
        try:
            with Registry.open(registry) as reg:
                seq = find_run(reg, "launch", launch_id)
        except SlurmgenError:
            seq = None  # the launcher creates the registry
        if seq is not None:
            return Handle(registry, seq, "launch", launch_id, process=proc)
        if proc.poll() is not None or time.monotonic() > deadline:
            said = [line for line in out.read_text(errors="replace").splitlines() if line.strip()]
            raise SlurmgenError(f"launch: {said[-1] if said else f'exit code {proc.poll()}'} (its output: {out})")
        time.sleep(0.05)
