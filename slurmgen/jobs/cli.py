"""`slurmgen submit | jobs | status | logs | cancel`: flags in, `commands.py` does the work.

`submit` takes every flag of `create` (its signature is create's plus its own), so the two can
never drift apart: same files, same validation. `--remote LOGIN` works for every command; a
job submitted with --remote remembers its login node, so later commands find it without it.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from slurmgen.cliopts import registry_option, ssh_config_option
from slurmgen.errors import SlurmgenError
from slurmgen.generate.cli import create, spec_from_create_flags, write_rendered

RegistryOpt = registry_option()
RemoteOpt = typer.Option(None, "--remote", help="Run Slurm's commands on this login node (a host of ~/.ssh/config).")
SshConfigOpt = ssh_config_option("ssh config file [default: ~/.ssh/config].")
SetupOpt = typer.Option([], "--remote-setup", help="Shell line run first on the login node (module load slurm); repeatable.")
JsonOpt = typer.Option(False, "--json", help="Print JSON.")

STATE_COLOURS = {"RUNNING": "cyan", "PENDING": "yellow", "COMPLETED": "green", "FAILED": "red", "CANCELLED": "magenta",
                 "TIMEOUT": "red", "NODE_FAIL": "red", "OUT_OF_MEMORY": "red",
                 # the run model's words (launches, groups)
                 "running": "cyan", "starting": "cyan", "pending": "yellow", "succeeded": "green", "failed": "red",
                 "stopped": "magenta", "preempted": "magenta", "lost": "red"}


def _style(text: str, state: str) -> str:
    return typer.style(text, fg=STATE_COLOURS.get(state)) if sys.stdout.isatty() else text


def _echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


class Runners:
    """One runner per place (here, or a login node), opened on first use, all closed at the end."""

    def __init__(self, ssh_config: str | None, setup: list[str], default_remote: str | None = None):
        self.ssh_config, self.setup, self.default = ssh_config, setup, default_remote
        self.open: dict[str | None, Any] = {}

    def __call__(self, where: str | None, setup: list[str] | None = None, ssh_config: str | None = None) -> Any:
        """The runner for `where`; flags given to this command win over what the job remembers."""
        where = self.default or where
        if where not in self.open:
            if where is None:
                from slurmgen.jobs.runner import LocalRunner

                self.open[where] = LocalRunner()
            else:
                from slurmgen.jobs.remote import RemoteRunner

                self.open[where] = RemoteRunner(where, self.ssh_config or ssh_config, self.setup or setup or [])
        return self.open[where]

    def close(self) -> None:
        for runner in self.open.values():
            runner.close()


def _with_job(registry: Path | None, job: str | None, remote: str | None, ssh_config: str | None,
              setup: list[str], work: Callable[..., Any]) -> Any:
    """Open the registry, find JOB (default: the newest), open its runner, run `work`."""
    from slurmgen.jobs.registry import Registry
    from slurmgen.jobs.resolve import find

    def note(text: str) -> None:
        typer.echo(f"slurmgen: note: {text}", err=True)

    with Registry.open(registry) as reg:
        if job is None:
            newest = reg.all(limit=1)
            if not newest:
                raise SlurmgenError(f"job: the registry {str(reg.path)!r} holds no jobs yet")
            record, task = newest[0], None
        else:
            record, task = find(reg, job, note)
        runners = Runners(ssh_config, list(setup), remote)
        try:
            return work(reg, record, task, runners(record.remote, record.info.get("remote_setup"),
                                                   record.info.get("ssh_config")))
        finally:
            runners.close()


def submit(**kw: Any) -> None:
    """Render exactly as `create` does, sbatch it, register the job and print its id."""
    from slurmgen.generate.render import render
    from slurmgen.jobs import commands
    from slurmgen.jobs.registry import Registry

    create_flags = {k: kw.pop(k) for k in list(kw) if k in _CREATE_PARAMS}
    dry_run, force = create_flags.pop("dry_run"), create_flags.pop("force")
    rendered = render(spec_from_create_flags(**create_flags))
    args = commands.sbatch_args(kw["dependency"], kw["hold"])
    if dry_run:
        write_rendered(rendered, dry_run=True, force=force)
        return
    remote, as_json = kw["remote"], kw["as_json"]
    with Registry.open(kw["registry"], create=True) as reg:  # a bad registry stops us before sbatch
        runners = Runners(kw["ssh_config"], list(kw["remote_setup"]))
        try:
            if remote:
                record = _submit_remote(runners(remote), reg, rendered, args, kw)
            else:
                write_rendered(rendered, dry_run=False, force=force, quiet=True)
                record = commands.submit(runners(None), reg, rendered, os.getcwd(), args, None, {})
            if not kw["wait"]:
                _echo_json(record.as_dict()) if as_json else typer.echo(record.job_id)
                return
            if not as_json:
                typer.echo(record.job_id)
            state, code = commands.wait(runners(remote), record)
            reg.remember_states({record.seq: (state, code)})
        finally:
            runners.close()
    if as_json:
        _echo_json({**record.as_dict(), "last_state": state, "last_exit": code})
    else:
        typer.echo(f"job {record.job_id}: {_style(state, state)}, exit code {code}", err=True)
    raise typer.Exit(code)


def _submit_remote(runner: Any, reg: Any, rendered: Any, args: list[str], kw: dict[str, Any]) -> Any:
    from slurmgen.jobs import commands
    from slurmgen.jobs.remote import DEFAULT_REMOTE_DIR, ship
    from slurmgen.jobs.snapshot import take

    snap = take(Path(kw["code"] or "."), whole_dir=kw["code"] is not None)
    facts = {"dir": None, "digest": snap.digest, "files": snap.files, "commit": snap.commit, "dirty": snap.dirty}
    extra = {".slurmgen/snapshot.json": json.dumps(facts, indent=2).encode(), ".slurmgen/diff.patch": snap.diff.encode()}
    job_dir, uploaded = ship(runner, snap, kw["remote_dir"] or DEFAULT_REMOTE_DIR, commands.job_tar(rendered, extra))
    runner.run(["mkdir", "-p", rendered.spec.logs], cwd=job_dir)
    facts.update(dir=job_dir, uploaded=uploaded, diff=snap.diff)
    return commands.submit(runner, reg, rendered, job_dir, args, runner.where,
                           {"snapshot": facts, "remote_setup": list(kw["remote_setup"]),
                            "ssh_config": os.path.abspath(kw["ssh_config"]) if kw["ssh_config"] else None})


def jobs(registry: Path | None = RegistryOpt, limit: int | None = typer.Option(None, "--limit", "-n", help="Only the newest N."),
         kind: list[str] = typer.Option([], "--kind", help="Only runs of this kind: slurm, launch or group; repeatable."),
         state: list[str] = typer.Option([], "--state", help="Only runs in this state (running, failed, succeeded, ...); repeatable."),
         remote: str | None = RemoteOpt, ssh_config: str | None = SshConfigOpt, remote_setup: list[str] = SetupOpt,
         as_json: bool = JsonOpt) -> None:
    """List every run (Slurm jobs, launches, groups), newest first, with its kind and current state."""
    from slurmgen.jobs.listing import list_jobs
    from slurmgen.jobs.registry import Registry
    from slurmgen.jobs.runs import check_kinds, check_states

    if limit is not None and limit < 1:
        raise SlurmgenError(f"limit: must be at least 1 (got {limit})")
    kinds, states = check_kinds(kind), check_states(state)
    with Registry.open(registry) as reg:
        runners = Runners(ssh_config, list(remote_setup))
        try:
            rows = list_jobs(runners, reg, limit, only=remote, kinds=kinds, states=states,
                             note=lambda text: typer.echo(f"slurmgen: warning: {text}; states are the last ones "
                                                          "slurmgen saw", err=True))
        finally:
            runners.close()
    if as_json:
        _echo_json(rows)
        return
    for row in rows:
        typer.echo(_job_line(row))


def _job_line(row: dict[str, Any]) -> str:
    code = "" if row["exit_code"] is None else f" exit {row['exit_code']}"
    tasks = f" ({row['tasks']} tasks)" if row["tasks"] else ""
    where = f" on {row['remote']}" if row["remote"] else ""
    seen = "" if row["live"] else " (last seen; its id now names a later job)" if row["id_reused"] else " (last seen)"
    state = _style(f"{row['state']:<10}", row["state"])
    size = f"  {row['nodes']}x{row['ranks'] // row['nodes']}" if row["nodes"] and row["ranks"] else ""
    return f"{row['kind']:<6} {row['job']:>8}  {state}{code}{seen}  {row['name']}{tasks}{where}{size}  {row['output_dir']}"


def status(job: str | None = typer.Argument(None, help="Job id, ID_N, job name or output dir [default: the newest job]."),
           registry: Path | None = RegistryOpt, remote: str | None = RemoteOpt,
           ssh_config: str | None = SshConfigOpt, remote_setup: list[str] = SetupOpt, as_json: bool = JsonOpt,
           timeline: bool = typer.Option(False, "--timeline", help="Each rank's start-up phases, checkpoints and end, "
                                         "per attempt, with the slowest rank of each phase.")) -> None:
    """One job: state, pending reason, nodes, time, requeues, failing tasks, run record, stragglers, goodput;
    a sweep's grid."""
    from slurmgen.jobs import commands
    from slurmgen.jobs.view import format_view

    view = _run_view(registry, job, timeline)
    if view is None:
        view = _with_job(registry, job, remote, ssh_config, remote_setup,
                         lambda reg, record, task, runner: commands.status(runner, reg, record, task, timeline))
    elif not timeline and not as_json:
        for line in commands.run_lines(view):
            typer.echo(line)
        return
    if timeline:
        _print_timeline(view, as_json)
        return
    if as_json:
        _echo_json(view)
        return
    for line in format_view(view, _style):
        typer.echo(line)


def _run_view(registry: Path | None, job: str | None, with_timeline: bool) -> dict[str, Any] | None:
    """A run of `slurmgen launch` or a coordinator group named by its launch id, key (GROUP.N)
    or run id, when no Slurm job answers to JOB; None otherwise."""
    from slurmgen.jobs import commands
    from slurmgen.jobs.registry import Registry
    from slurmgen.jobs.resolve import find
    from slurmgen.jobs.runs import find_by_ref

    if job is None:
        return None
    with Registry.open(registry) as reg:
        try:
            find(reg, job)
            return None
        except SlurmgenError:
            row = find_by_ref(reg, job)
            if row is None:
                raise
        return commands.run_status(reg, row, with_timeline)


def _print_timeline(view: dict, as_json: bool) -> None:
    from slurmgen.observe.timeline import format_timeline

    found = view.get("timeline") or {"attempts": []}
    if as_json:
        _echo_json({"job": view["job"], **found, "stragglers": view.get("stragglers", []), "goodput": view.get("goodput")})
        return
    for line in format_timeline(found):
        typer.echo(line)


def logs(job: str = typer.Argument(..., help="Job id, ID_N, job name or output dir."),
         rank: int | None = typer.Option(None, "--rank", "-r", help="Only this rank's lines."),
         node: str | None = typer.Option(None, "--node", help="Only the ranks on this node (index or name)."),
         follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
         tail: int | None = typer.Option(None, "--tail", "-n", help="Only the last N lines."),
         registry: Path | None = RegistryOpt, remote: str | None = RemoteOpt,
         ssh_config: str | None = SshConfigOpt, remote_setup: list[str] = SetupOpt, as_json: bool = JsonOpt) -> None:
    """The job's output, split by rank from srun's --label prefixes."""
    if rank is not None and node is not None:
        raise SlurmgenError("logs: give --rank or --node, not both")
    if tail is not None and tail < 0:
        raise SlurmgenError(f"tail: must be 0 or more (got {tail})")
    if rank is not None and rank < 0:
        raise SlurmgenError(f"rank: must be 0 or more (got {rank})")
    _with_job(registry, job, remote, ssh_config, remote_setup,
              lambda reg, record, task, runner: _print_logs(runner, record, task, rank, node, follow, tail, as_json))


def _print_logs(runner: Any, record: Any, task: str | None, rank: int | None, node: str | None,
                follow: bool, tail: int | None, as_json: bool) -> None:
    from slurmgen.jobs import commands
    from slurmgen.jobs.logs import check_rank, format_line, last, log_path, select_lines
    from slurmgen.jobs.logs import follow as follow_lines
    from slurmgen.jobs.logs import tail as tail_lines

    if record.info.get("array") and task is None:
        raise SlurmgenError(f"job: {record.job_id} is an array; name one task as {record.job_id}_N")
    if rank is not None:
        check_rank(record, rank)
    torchrun = record.info.get("launcher") == "torchrun"
    tasks = commands.node_tasks(runner, record, task, node) if node is not None else None
    ranks = {rank} if rank is not None else None
    path = log_path(record, task)
    colour = sys.stdout.isatty() and not as_json

    def emit(selected: list[Any]) -> None:
        for line in selected:
            typer.echo(json.dumps({"rank": line.rank, "task": line.task, "line": line.text}) if as_json
                       else format_line(line, colour))

    data = runner.read(path)
    if follow:
        def ended() -> bool:
            jobs = commands.all_tasks(commands.ask(runner, [record.job_id], accounting=False), record)
            mine = [j for j in jobs if task is None or j.array_task == task]
            return not mine or all(j.ended for j in mine)
        # Like `tail -n N -f`: the last N lines already there (without --tail: all), then what follows.
        selected, offset = tail_lines(data, tasks, tail, ranks, torchrun)
        emit(selected)
        for line in follow_lines(lambda at: runner.read(path, at), ended, offset=offset):
            emit(select_lines([line], tasks, ranks, torchrun))
        return
    if data is None:
        raise SlurmgenError(f"logs: no log yet at {path}" + (f" on {record.remote}" if record.remote else ""),
                            hint="a pending job has written nothing; `slurmgen status` says why it waits", exit_code=1)
    emit(last(select_lines(data.decode(errors="replace").splitlines(), tasks, ranks, torchrun), tail))


def cancel(job: str = typer.Argument(..., help="Job id, ID_N, job name or output dir."),
           signal: str | None = typer.Option(None, "--signal", "-s", help="Send this signal instead (USR2, the preempt_signal default: the trainer checkpoints and stops)."),
           registry: Path | None = RegistryOpt, remote: str | None = RemoteOpt,
           ssh_config: str | None = SshConfigOpt, remote_setup: list[str] = SetupOpt, as_json: bool = JsonOpt) -> None:
    """Cancel the job (scancel) and wait until Slurm says it ended; or only send it a signal."""
    import re

    from slurmgen.contract.exitcodes import FAILED
    from slurmgen.jobs import commands
    from slurmgen.jobs.resolve import reused_note

    if signal is not None and not re.match(r"^(SIG)?[A-Z0-9]+$|^[0-9]+$", signal):
        raise SlurmgenError(f"signal: expected a signal name or number, e.g. USR1 or 10 (got {signal!r})")
    def work(reg: Any, record: Any, task: str | None, runner: Any) -> dict:
        reused = reused_note(reg, record)
        if reused:  # scancel ID would hit the later job that has the id now
            raise SlurmgenError(f"cancel: {reused}; nothing was cancelled")
        warning = commands.signal_warning(record, signal) if signal else None
        if warning:
            typer.echo(f"slurmgen: warning: {warning}", err=True)
        return commands.cancel(runner, reg, record, task, signal)

    result = _with_job(registry, job, remote, ssh_config, remote_setup, work)
    if as_json:
        _echo_json({"signal": signal, "state": None, **result})
    elif signal or result.get("already_ended") or not result["ended"]:
        typer.echo(result["said"])
    else:
        typer.echo(f"job {result['job']}: {_style(result['state'], result['state'])}")
    if not result.get("ended", True):
        raise typer.Exit(FAILED)


def _submit_signature() -> inspect.Signature:
    """create's parameters followed by submit's own: one definition of the shared flags."""
    own = [
        ("registry", Path | None, RegistryOpt),
        ("dependency", str | None, typer.Option(None, "--dependency", "-d", help="sbatch --dependency, e.g. afterok:1234.")),
        ("hold", bool, typer.Option(False, "--hold", help="Submit held; `scontrol release ID` starts it.")),
        ("wait", bool, typer.Option(False, "--wait", "-W", help="Block until the job ends; exit with its code.")),
        ("remote", str | None, RemoteOpt),
        ("remote_dir", str | None, typer.Option(None, "--remote-dir", help="Where snapshots and job dirs live on the login node [default: ~/.slurmgen].")),
        ("code", Path | None, typer.Option(None, "--code", help="Ship this directory instead of the working tree (with --remote).")),
        ("ssh_config", str | None, SshConfigOpt),
        ("remote_setup", list[str], SetupOpt),
        ("as_json", bool, JsonOpt),
    ]
    hints = typing.get_type_hints(create)
    params = [p.replace(annotation=hints[p.name]) for p in inspect.signature(create).parameters.values()]
    return inspect.Signature([*params, *(inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=a)
                                         for n, a, d in own)])


_CREATE_PARAMS: set[str] = set()


def register(app: typer.Typer) -> None:
    """Add the job commands to the `slurmgen` app."""
    signature = _submit_signature()
    _CREATE_PARAMS.update(name for name in signature.parameters if name not in
                          {"registry", "dependency", "hold", "wait", "remote", "remote_dir", "code", "ssh_config",
                           "remote_setup", "as_json"})
    submit.__signature__ = signature  # type: ignore[attr-defined]
    submit.__annotations__ = {name: p.annotation for name, p in signature.parameters.items()}
    app.command(context_settings={"allow_interspersed_args": False})(submit)
    for command in (jobs, status, logs, cancel):
        app.command()(command)
