"""`slurmgen jobs | status | logs | cancel` (and `submit`, in submit_cli.py): flags in,
`commands.py` does the work; `cancel` is a run's control, as the page's buttons are (control.py).

`--remote LOGIN` works for every command; a job submitted with --remote remembers its login
node, so later commands find it without it. The options, runners and job lookup these
commands share are in cli_shared.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from slurmgen.contract.states import State
from slurmgen.errors import SlurmgenError
from slurmgen.jobs import submit_cli
from slurmgen.jobs.cli_shared import (
    JsonOpt,
    RegistryOpt,
    RemoteOpt,
    Runners,
    SetupOpt,
    SshConfigOpt,
    echo_json,
    note,
    style,
    with_job,
)

if TYPE_CHECKING:
    from slurmgen.jobs.control import Run
    from slurmgen.runs.model import RunRow
    from slurmgen.runs.registry import Registry


def jobs(
    registry: Path | None = RegistryOpt,
    limit: int | None = typer.Option(None, "--limit", "-n", help="Only the newest N."),
    kind: list[str] = typer.Option([], "--kind", help="Only runs of this kind: slurm, launch or group; repeatable."),
    state: list[str] = typer.Option(
        [], "--state", help="Only runs in this state (running, failed, succeeded, ...); repeatable."
    ),
    remote: str | None = RemoteOpt,
    ssh_config: str | None = SshConfigOpt,
    remote_setup: list[str] = SetupOpt,
    as_json: bool = JsonOpt,
) -> None:
    """List every run (Slurm jobs, launches, groups), newest first, with its kind and current state."""
    from slurmgen.jobs.listing import list_jobs
    from slurmgen.runs.model import check_kinds, check_states
    from slurmgen.runs.registry import Registry

    if limit is not None and limit < 1:
        raise SlurmgenError(f"limit: must be at least 1 (got {limit})")
    kinds, states = check_kinds(kind), check_states(state)
    with Registry.open(registry) as reg:
        runners = Runners(ssh_config, list(remote_setup))
        try:
            rows = list_jobs(
                runners,
                reg,
                limit,
                only=remote,
                kinds=kinds,
                states=states,
                note=lambda text: typer.echo(
                    f"slurmgen: warning: {text}; states are the last ones slurmgen saw", err=True
                ),
            )
        finally:
            runners.close()
    if as_json:
        echo_json(rows)
        return
    for row in rows:
        typer.echo(_job_line(row))


def _job_line(row: dict[str, Any]) -> str:
    from slurmgen.runs.model import size

    code = "" if row["exit_code"] is None else f" exit {row['exit_code']}"
    tasks = f" ({row['tasks']} tasks)" if row["tasks"] else ""
    tasks += f" ({row['chain']})" if row.get("chain") else ""
    where = f" on {row['remote']}" if row["remote"] else ""
    seen = "" if row["live"] else " (last seen; its id now names a later job)" if row["id_reused"] else " (last seen)"
    # Slurm says FAILED of a job that exited with the preemption code (checkpoint and stop): say what it means.
    preempted = (
        row["kind"] == "slurm"
        and row["run_state"] == State.PREEMPTED.value
        and not row["state"].startswith("PREEMPTED")
    )
    code += " (preempted: checkpointed, resumable)" if preempted else ""
    state = style(f"{row['state']:<10}", State.PREEMPTED.value if preempted else row["state"])
    shape = f"  {sized}" if (sized := size(row["nodes"], row["ranks"])) else ""
    again = f" attempt {row['attempts']}" if (row["attempts"] or 0) > 1 else ""  # restarted or requeued
    return (
        f"{row['kind']:<6} {row['job']:>8}  {state}{code}{again}{seen}  "
        f"{row['name']}{tasks}{where}{shape}  {row['output_dir']}"
    )


def status(
    job: str | None = typer.Argument(
        None,
        help="Job id, ID_N, job name or output dir [default: the newest job]; "
        "with --timeline also a timeline file (launch_multi_node.sh run by hand).",
    ),
    registry: Path | None = RegistryOpt,
    remote: str | None = RemoteOpt,
    ssh_config: str | None = SshConfigOpt,
    remote_setup: list[str] = SetupOpt,
    as_json: bool = JsonOpt,
    timeline: bool = typer.Option(
        False,
        "--timeline",
        help="Each rank's start-up phases, checkpoints and end, per attempt, with the slowest rank of each phase.",
    ),
) -> None:
    """One job: state, pending reason, nodes, time, requeues, failing tasks, run record, stragglers, goodput;
    a sweep's grid."""
    from slurmgen.jobs import commands
    from slurmgen.jobs.view import format_view

    if timeline and job is not None and Path(job).is_file():
        _print_timeline(commands.file_status(Path(job)), as_json)
        return
    view = _run_view(registry, job, timeline)
    if view is None:
        view = with_job(
            registry,
            job,
            remote,
            ssh_config,
            remote_setup,
            lambda reg, record, task, runner: _slurm_status(runner, reg, record, task, timeline),
        )
    elif not timeline and not as_json:
        for line in commands.run_lines(view):
            typer.echo(line)
        return
    if timeline:
        _print_timeline(view, as_json)
        return
    if as_json:
        echo_json(view)
        return
    for line in format_view(view, style):
        typer.echo(line)
    if view.get("chain"):
        from slurmgen.jobs.chain import lines

        for line in lines(view["chain"]):
            typer.echo(line)


def _slurm_status(runner: Any, reg: Any, record: Any, task: str | None, timeline: bool) -> dict[str, Any]:
    """`status` of a Slurm job; of a link of a chain, with every link (jobs/chain.py)."""
    from slurmgen.jobs import chain, commands

    view = commands.status(runner, reg, record, task, timeline)
    if chain.links_of(record):
        view["chain"] = chain.view(runner, reg, record)
    return view


def _run_view(registry: Path | None, job: str | None, with_timeline: bool) -> dict[str, Any] | None:
    """A run of `slurmgen launch` or a coordinator group named by its launch id, key (GROUP.N)
    or run id, when no Slurm job answers to JOB; None otherwise."""
    from slurmgen.jobs import commands
    from slurmgen.jobs.resolve import find
    from slurmgen.runs.model import find_by_ref
    from slurmgen.runs.registry import Registry

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
        echo_json(
            {"job": view["job"], **found, "stragglers": view.get("stragglers", []), "goodput": view.get("goodput")}
        )
        return
    for line in format_timeline(found):
        typer.echo(line)


def logs(
    job: str = typer.Argument(
        ..., help="Job id, ID_N, job name or output dir; or the launch id of an SSH launch of this machine."
    ),
    rank: int | None = typer.Option(None, "--rank", "-r", help="Only this rank's lines."),
    node: str | None = typer.Option(None, "--node", help="Only the ranks on this node (index or name)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
    tail: int | None = typer.Option(None, "--tail", "-n", help="Only the last N lines."),
    registry: Path | None = RegistryOpt,
    remote: str | None = RemoteOpt,
    ssh_config: str | None = SshConfigOpt,
    remote_setup: list[str] = SetupOpt,
    as_json: bool = JsonOpt,
) -> None:
    """The job's output, split by rank from srun's --label prefixes (a launch's: as its launcher kept it here)."""
    if rank is not None and node is not None:
        raise SlurmgenError("logs: give --rank or --node, not both")
    if tail is not None and tail < 0:
        raise SlurmgenError(f"tail: must be 0 or more (got {tail})")
    if rank is not None and rank < 0:
        raise SlurmgenError(f"rank: must be 0 or more (got {rank})")
    launch = _launch_row(registry, job)
    if launch is not None:
        _print_launch_log(registry, launch, rank, node, follow, tail, as_json)
        return
    with_job(
        registry,
        job,
        remote,
        ssh_config,
        remote_setup,
        lambda reg, record, task, runner: _print_logs(runner, record, task, rank, node, follow, tail, as_json),
    )


def _launch_row(registry: Path | None, ref: str) -> RunRow | None:
    """The SSH launch of this machine named `ref` (its launch id), when no Slurm job answers to it."""
    from slurmgen.jobs.resolve import find
    from slurmgen.runs.model import find_run, get_row
    from slurmgen.runs.registry import Registry

    try:
        with Registry.open(registry) as reg:
            try:
                find(reg, ref)
                return None
            except SlurmgenError:
                seq = find_run(reg, "launch", ref)
                return get_row(reg, seq) if seq is not None else None
    except SlurmgenError:
        return None  # no registry: the Slurm path says so in its own words


def _print_launch_log(
    registry: Path | None,
    row: RunRow,
    rank: int | None,
    node: str | None,
    follow: bool,
    tail: int | None,
    as_json: bool,
) -> None:
    """A launch's log as its launcher kept it here (launch/registry_entry.py), split by rank as a Slurm job's."""
    from slurmgen.contract.states import ENDED_WORDS
    from slurmgen.jobs.slurm_runner import LocalRunner
    from slurmgen.runs.model import get_row
    from slurmgen.runs.registry import Registry

    if node is not None:
        raise SlurmgenError(f"node: launch {row['job_id']} is read by rank (--rank), not by node")
    if rank is not None and not 0 <= rank < (row["ranks"] or 0):
        raise SlurmgenError(f"rank: launch {row['job_id']} has ranks 0-{(row['ranks'] or 1) - 1} (got {rank})")
    path = (row.get("info") or {}).get("log_file")
    if not path:
        nodes = ", ".join(f"{x['node']}:{x['path']}" for x in row["logs"])
        raise SlurmgenError(
            f"logs: launch {row['job_id']} kept no log on this machine (it started before slurmgen kept one)",
            hint=f"its nodes' logs: {nodes}",
        )

    def ended() -> bool:
        with Registry.open(registry) as reg:
            now = get_row(reg, row["seq"])
        return now is None or now["state"] in ENDED_WORDS

    _emit_log(LocalRunner(), path, ended, None, {rank} if rank is not None else None, False, follow, tail, as_json, "")


def _print_logs(
    runner: Any,
    record: Any,
    task: str | None,
    rank: int | None,
    node: str | None,
    follow: bool,
    tail: int | None,
    as_json: bool,
) -> None:
    from slurmgen.jobs import commands
    from slurmgen.jobs.logs import array_tasks, check_rank, log_path, tasks_text

    if record.info.get("array") and task is None:
        known = array_tasks(record.info)
        which = f" of {len(known)} tasks ({tasks_text(known)})" if known else ""
        raise SlurmgenError(f"job: {record.job_id} is an array{which}; name one task as {record.job_id}_N")
    if rank is not None:
        check_rank(record, rank)
    tasks = commands.node_tasks(runner, record, task, node) if node is not None else None

    def ended() -> bool:
        jobs = commands.all_tasks(commands.ask(runner, [record.job_id], accounting=False), record)
        mine = [j for j in jobs if task is None or j.array_task == task]
        return not mine or all(j.ended for j in mine)

    _emit_log(
        runner,
        log_path(record, task),
        ended,
        tasks,
        {rank} if rank is not None else None,
        record.info.get("launcher") == "torchrun",
        follow,
        tail,
        as_json,
        f" on {record.remote}" if record.remote else "",
    )


def _emit_log(
    runner: Any,
    path: str,
    ended: Any,
    tasks: set[int] | None,
    ranks: set[int] | None,
    torchrun: bool,
    follow: bool,
    tail: int | None,
    as_json: bool,
    where: str,
) -> None:
    """Print a log's lines of `tasks` and `ranks` (None: all): the last `tail`, or with `follow`
    like `tail -n N -f`, the last N already there (without --tail: all), then what follows until
    `ended()`."""
    from slurmgen.jobs.logs import follow as follow_lines
    from slurmgen.jobs.logs import format_line, last, select_lines
    from slurmgen.jobs.logs import tail as tail_lines
    from slurmgen.runs.log_lines import log_lines

    colour = sys.stdout.isatty() and not as_json

    def emit(selected: list[Any]) -> None:
        for line in selected:
            typer.echo(
                json.dumps({"rank": line.rank, "task": line.task, "line": line.text})
                if as_json
                else format_line(line, colour)
            )

    data = runner.read(path)
    if follow:
        selected, offset = tail_lines(data, tasks, tail, ranks, torchrun)
        emit(selected)
        for line in follow_lines(lambda at: runner.read(path, at), ended, offset=offset):
            emit(select_lines([line], tasks, ranks, torchrun))
        return
    if data is None:
        raise SlurmgenError(
            f"logs: no log yet at {path}{where}",
            hint="a pending job has written nothing; `slurmgen status` says why it waits",
            exit_code=1,
        )
    emit(last(select_lines(log_lines(data.decode(errors="replace")), tasks, ranks, torchrun), tail))


def cancel(
    job: str = typer.Argument(
        ...,
        help="Job id, ID_N, job name or output dir; or the launch id of an SSH launch running from this machine, "
        "or the key (GROUP.N) of a coordinator group's run served from this machine.",
    ),
    signal: str | None = typer.Option(
        None,
        "--signal",
        "-s",
        help="Send this signal instead (USR2, the preempt_signal default: the trainer checkpoints and stops).",
    ),
    registry: Path | None = RegistryOpt,
    remote: str | None = RemoteOpt,
    ssh_config: str | None = SshConfigOpt,
    remote_setup: list[str] = SetupOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Cancel the job (scancel) and wait until Slurm says it ended; or only send it a signal. An SSH
    launch of this machine (its launch id) is asked to stop every rank, as Ctrl-C would; a
    coordinator group's run (GROUP.N) is stopped as its group's Stop would."""
    import re

    from slurmgen.contract.exitcodes import FAILED
    from slurmgen.jobs import control
    from slurmgen.runs.registry import Registry

    if signal is not None and not re.match(r"^(SIG)?[A-Z0-9]+$|^[0-9]+$", signal):
        raise SlurmgenError(f"signal: expected a signal name or number, e.g. USR1 or 10 (got {signal!r})")
    with Registry.open(registry) as reg:
        run, task = _cancel_target(reg, job, signal is None)
        runners = Runners(ssh_config, list(remote_setup), remote)
        try:
            what = control.RunControl.STOP if run.kind in control.STOPPABLE else control.RunControl.CANCEL
            done = control.perform(reg, run, what, runners, "with slurmgen cancel", task, signal)
        finally:
            runners.close()
    if done.warning:
        typer.echo(f"slurmgen: warning: {done.warning}", err=True)
    if done.error:
        raise done.error
    if run.kind in control.STOPPABLE:
        if as_json:
            echo_json({"job": job, "kind": run.kind, "stopping": done.done, "said": done.said})
        else:
            typer.echo(done.said)
        if not done.done:
            raise typer.Exit(FAILED)
        return
    result = done.slurm
    if as_json:
        echo_json({"signal": signal, "state": None, **result})
    elif signal or result.get("already_ended") or not result["ended"]:
        typer.echo(result["said"])
    else:
        typer.echo(f"job {result['job']}: {style(result['state'], result['state'])}")
        if result.get("chain_links"):
            typer.echo(f"and the chain's other links: {' '.join(result['chain_links'])}")
    if not result.get("ended", True):
        raise typer.Exit(FAILED)


def _cancel_target(reg: Registry, ref: str, launches: bool) -> tuple[Run, str | None]:
    """The run `cancel REF` means, and the array task it names: an SSH launch of this machine by
    its launch id or a group's run by its key (`launches`: when no signal is given), else a Slurm
    job by id, ID_N, name or output dir."""
    from slurmgen.jobs.control import Run, read
    from slurmgen.jobs.resolve import find
    from slurmgen.runs.model import find_run

    seq = (find_run(reg, "launch", ref) or find_run(reg, "group", ref)) if launches else None
    run = read(reg, seq) if seq is not None else None
    if run is not None:
        return run, None
    record, task = find(reg, ref, note)
    return Run.of_job(record), task


def register(app: typer.Typer) -> None:
    """Add the job commands to the `slurmgen` app."""
    submit_cli.register(app)
    for command in (jobs, status, logs, cancel):
        app.command()(command)
