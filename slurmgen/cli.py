"""The `slurmgen` command line: a thin Typer layer and the one error boundary.

Commands parse flags into plain values and hand them to pure functions (config -> spec ->
render / topology); only this module prints, and only `main` decides exit codes:
0 success, 1 a run failed, 2 bad input. Expected errors print one line each, no traceback
(`--verbose` shows it). Heavy modules (torch, paramiko) are imported inside the commands
that need them, never at start-up.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import List, Optional

import typer

from slurmgen import __version__
from slurmgen.errors import SlurmgenError

app = typer.Typer(
    name="slurmgen",
    help="Multi-node PyTorch launching made boring and correct: sbatch scripts, a bare-metal launcher, a rank table.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
_state = {"verbose": False}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"slurmgen {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks for errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    _state["verbose"] = verbose


ORDER_HELP = ("Node order after the master: alphabetical (gn39 before gn7, the product brief's rule) | "
              "natural (gn7 before gn39, Slurm's order, which run_slurm.sh always uses).")


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SlurmgenError(f"env: expected KEY=VALUE (got {pair!r})")
        env[key] = value
    return env


def _overrides(**flags: object) -> dict[str, object]:
    """The CLI flags that were given, as spec fields (None and empty lists mean 'not given')."""
    return {k: v for k, v in flags.items() if v is not None and v != [] and v != {}}


@app.command()
def create(
    command: Optional[List[str]] = typer.Argument(None, help="The program every process runs (after --). Default: python -m slurmgen.train."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML job spec; flags given here override it."),
    output_dir: Optional[str] = typer.Option(None, "--output-dir", "-o", help="Where to write the scripts [default: out]."),
    nodes: Optional[str] = typer.Option(None, "--nodes", "-N", metavar="N", help="Number of nodes [default: 1]."),
    gpus: Optional[str] = typer.Option(None, "--gpus", metavar="N", help="Processes (GPUs) per node [default: 1]."),
    gpu_request: Optional[str] = typer.Option(None, "--gpu-request", help="auto | gpus-per-node | gres | none."),
    time: Optional[str] = typer.Option(None, "--time", "-t", help="Time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."),
    partition: Optional[str] = typer.Option(None, "--partition", "-p"),
    account: Optional[str] = typer.Option(None, "--account", "-A"),
    qos: Optional[str] = typer.Option(None, "--qos", "-q"),
    constraint: Optional[str] = typer.Option(None, "--constraint", "-C"),
    exclusive: Optional[bool] = typer.Option(None, "--exclusive/--no-exclusive", help="Whole nodes."),
    cpus_per_task: Optional[str] = typer.Option(None, "--cpus-per-task", "-c", metavar="N", help="CPUs per process."),
    mem: Optional[str] = typer.Option(None, "--mem", help="Memory per node, e.g. 64G."),
    job_name: Optional[str] = typer.Option(None, "--job-name", "-J"),
    master_addr: Optional[str] = typer.Option(None, "--master-addr", help="Rendezvous host [default: first node]."),
    master_port: Optional[str] = typer.Option(None, "--master-port", metavar="N", help="Rendezvous port [default: from the job id]."),
    backend: Optional[str] = typer.Option(None, "--backend", help="nccl | gloo | auto."),
    launcher: Optional[str] = typer.Option(None, "--launcher", help="srun (a task per process) | torchrun (a task per node); run_slurm.sh only: launch_multi_node.sh starts every process itself."),
    env: List[str] = typer.Option([], "--env", "-e", help="KEY=VALUE for every process; repeatable."),
    setup: List[str] = typer.Option([], "--setup", help="Shell line run before launch (module load, venv); repeatable."),
    sbatch: List[str] = typer.Option([], "--sbatch", help="Extra #SBATCH option, e.g. --mail-type=END; repeatable."),
    container_image: Optional[str] = typer.Option(None, "--container-image", help="Run inside this container image."),
    container_runtime: Optional[str] = typer.Option(None, "--container-runtime", help="pyxis | apptainer."),
    container_mount: List[str] = typer.Option([], "--container-mount", help="SRC:DST[:FLAGS]; repeatable."),
    log_dir: Optional[str] = typer.Option(None, "--log-dir", help="Job logs [default: OUTPUT_DIR/logs]."),
    requeue: Optional[bool] = typer.Option(None, "--requeue/--no-requeue", help="Checkpoint and requeue on preempt_signal (spec field, default USR2) before the time limit."),
    signal_lead: Optional[str] = typer.Option(None, "--signal-lead", metavar="N", help="Seconds before the limit that preempt_signal arrives [default: 120]."),
    array: Optional[str] = typer.Option(None, "--array", "-a", help="sbatch --array (0-15%4); with a sweep only %N, the most tasks at once."),
    sweep: List[str] = typer.Option([], "--sweep", help="KEY=V1,V2,...: one array task per point of the grid; repeatable."),
    sweep_file: Optional[Path] = typer.Option(None, "--sweep-file", help="JSON lines, one object of parameters per array task."),
    sweep_args: Optional[str] = typer.Option(None, "--sweep-args", help="How each parameter reaches the command [default: '--{key} {value}']."),
    heartbeat_timeout: Optional[str] = typer.Option(None, "--heartbeat-timeout", metavar="S", help="Stop the job step when a rank's heartbeat file is S seconds old (ranks that write none are not judged)."),
    retries: Optional[str] = typer.Option(None, "--retries", metavar="N", help="Requeue the job after a failure with a --retry-on code, up to N times."),
    retry_on: Optional[str] = typer.Option(None, "--retry-on", metavar="CODES", help="Exit codes that requeue the job, e.g. 1,124,143."),
    exclude_failed_node: Optional[bool] = typer.Option(None, "--exclude-failed-node/--no-exclude-failed-node", help="Exclude the node where the failure started before requeueing."),
    preflight: Optional[bool] = typer.Option(None, "--preflight/--no-preflight", help="Run `slurmgen doctor` on every node before the job step."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the files instead of writing them."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
) -> None:
    """Write OUTPUT_DIR/run_slurm.sh, OUTPUT_DIR/launch_multi_node.sh and the resolved OUTPUT_DIR/job.yaml."""
    flags = dict(locals())
    from slurmgen.generate.render import render

    rendered = render(spec_from_create_flags(**{k: v for k, v in flags.items() if k not in ("dry_run", "force")}))
    write_rendered(rendered, dry_run=dry_run, force=force)


def spec_from_create_flags(*, command, config, env, setup, sbatch, container_image, container_runtime, container_mount,
                           sweep, sweep_file, **fields):
    """The spec `create` (and `submit`, which shares its flags) works on: --config with the flags over it.

    Flags named like a spec field (`nodes`, `time`, `array`, ...) arrive in `fields` as they are.
    """
    from slurmgen.generate.specfile import spec_from_sources
    from slurmgen.jobs import sweep as sweeps

    if sweep and sweep_file is not None:
        raise SlurmgenError("sweep: give --sweep or --sweep-file, not both")
    points = sweeps.read_file(sweep_file) if sweep_file is not None else sweeps.parse_flag(sweep) or None
    container = _overrides(image=container_image, runtime=container_runtime, mounts=list(container_mount))
    return spec_from_sources(config, _overrides(
        command=command or None, env=_parse_env(env), setup=list(setup), sbatch_extra=list(sbatch),
        container=container or None, sweep=points, **fields,
    ))


def write_rendered(rendered, *, dry_run: bool, force: bool, quiet: bool = False) -> None:
    """Print (--dry-run) or write the rendered files, all or none, and say what to do next."""
    from slurmgen.generate.output import write_files
    from slurmgen.generate.render import LAUNCH_SCRIPT, SLURM_SCRIPT
    from slurmgen.generate.topology import summary, uniform_table

    spec = rendered.spec
    table = uniform_table(spec.nodes, spec.gpus)
    out = Path(spec.output_dir)
    if dry_run:
        for name, text in rendered.files.items():
            typer.echo(f"# ===== {out / name} =====")
            typer.echo(text, nl=False)
        return
    written = write_files(out, rendered.files, force=force, extra_dirs=[Path(spec.logs)])
    if quiet:
        return
    for path in written:
        typer.echo(f"wrote {path}")
    from slurmgen.generate.preflight import torchrun_note

    if note := torchrun_note(spec):
        typer.echo(f"slurmgen: note: {note}", err=True)
    typer.echo(f"ranks: {spec.nodes} node(s) x {spec.gpus}: {summary(table)}")
    typer.echo("next:")
    typer.echo(f"  sbatch {out / SLURM_SCRIPT}")
    typer.echo(f"  or, without Slurm, on every node: {out / LAUNCH_SCRIPT} <master_addr> {spec.nodes} {spec.gpus} <node_rank>")


@app.command()
def ranks(
    hosts: Optional[str] = typer.Option(None, "--hosts", help="Host names, a Slurm hostlist: gn6,gn7 or gpu[01-04]."),
    hostfile: Optional[Path] = typer.Option(None, "--hostfile", help="DeepSpeed-style host file: 'host slots=N' lines."),
    nodes: Optional[int] = typer.Option(None, "--nodes", "-N", help="Anonymous nodes, when no names are given."),
    gpus: int = typer.Option(1, "--gpus", help="Processes per host (hosts without slots= in a host file)."),
    master: Optional[str] = typer.Option(None, "--master", help="The master host [default: the first given]."),
    world_size: Optional[int] = typer.Option(None, "--world-size", help="Use only this many processes."),
    order: str = typer.Option("alphabetical", "--order", help=ORDER_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table."),
) -> None:
    """Print the rank table: which host runs which RANK, LOCAL_RANK and NODE_RANK."""
    from slurmgen.generate.hostfile import read_hostfile
    from slurmgen.generate.hostlist import expand
    from slurmgen.generate.topology import Host, anonymous_hosts, order_hosts, rank_table

    given = [name for name, v in (("--hosts", hosts), ("--hostfile", hostfile), ("--nodes", nodes)) if v is not None]
    if len(given) != 1:
        raise SlurmgenError(f"hosts: give exactly one of --hosts, --hostfile, --nodes (got {len(given)}: {', '.join(given) or 'none'})")
    if gpus < 1:
        raise SlurmgenError(f"gpus: must be at least 1 (got {gpus})")
    if nodes is not None:
        if master is not None:
            raise SlurmgenError("master: --master needs named hosts (--hosts or --hostfile)")
        table = rank_table(anonymous_hosts(nodes, gpus), world_size)
    else:
        host_list = (read_hostfile(hostfile, gpus) if hostfile is not None
                     else [Host.with_count(h, gpus) for h in expand(hosts or "")])
        table = rank_table(order_hosts(host_list, master, order), world_size)
    if as_json:
        typer.echo(json.dumps([{k: v for k, v in e.as_dict().items() if k != "slot"} for e in table], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    out = Table("host", "rank", "local_rank", "node_rank", "local_world_size", "world_size", box=None)
    for e in table:
        out.add_row(e.host, *(str(v) for v in (e.rank, e.local_rank, e.node_rank, e.local_world_size, e.world_size)))
    Console(soft_wrap=True).print(out)


@app.command(context_settings={"allow_interspersed_args": False})
def launch(
    command: Optional[List[str]] = typer.Argument(None, help="The program every process runs (after --). Default: python -m slurmgen.train."),
    hosts: Optional[str] = typer.Option(None, "--hosts", "-H", help="Hosts, a Slurm hostlist: node1,node2 or gpu[01-04]."),
    hostfile: Optional[Path] = typer.Option(None, "--hostfile", help="DeepSpeed host file: 'host slots=N' lines."),
    include: Optional[str] = typer.Option(None, "--include", help="Only these hosts/slots, DeepSpeed syntax: node1:0,1@node2."),
    exclude: Optional[str] = typer.Option(None, "--exclude", help="Not these hosts/slots, DeepSpeed syntax: node1:0,1@node2."),
    gpus: Optional[str] = typer.Option(None, "--gpus", metavar="N", help="Processes per host without slots= (default: 1)."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML job spec (as for create); flags given here override it."),
    master: Optional[str] = typer.Option(None, "--master", help="The host that runs rank 0 (default: the first given)."),
    order: str = typer.Option("alphabetical", "--order", help=ORDER_HELP),
    master_addr: Optional[str] = typer.Option(None, "--master-addr", help="Rendezvous address (default: the master's HostName)."),
    master_port: Optional[str] = typer.Option(None, "--master-port", metavar="N", help="Rendezvous port (default: 29500)."),
    backend: Optional[str] = typer.Option(None, "--backend", help="nccl | gloo | auto."),
    env: List[str] = typer.Option([], "--env", "-e", help="KEY=VALUE for every process; repeatable."),
    env_file: List[Path] = typer.Option([], "--env-file", help="KEY=VALUE lines (like .deepspeed_env), sent on stdin; repeatable."),
    setup: List[str] = typer.Option([], "--setup", help="Shell line run on each node before launch (venv, modules); repeatable."),
    workdir: Optional[str] = typer.Option(None, "--workdir", help="Directory on every node (default: this directory)."),
    log_dir: Optional[str] = typer.Option(None, "--log-dir", help="Per-rank logs on each node, relative to --workdir (default: out/logs)."),
    user: Optional[str] = typer.Option(None, "--user", "-l", help="SSH user (default: ~/.ssh/config, else you)."),
    port: Optional[int] = typer.Option(None, "--port", "-p", help="SSH port (default: ~/.ssh/config, else 22)."),
    identity: List[Path] = typer.Option([], "--identity", "-i", help="Private key file; repeatable."),
    known_hosts: Optional[str] = typer.Option(None, "--known-hosts", help="known_hosts file (default: ~/.ssh/known_hosts)."),
    ssh_config: Optional[str] = typer.Option(None, "--ssh-config", "-F", help="ssh config file (default: ~/.ssh/config)."),
    connect_timeout: float = typer.Option(10.0, "--connect-timeout", help="Seconds to wait for each host."),
    accept_new_host_keys: bool = typer.Option(False, "--accept-new-host-keys", help="Trust and record keys of hosts not in known_hosts (never changed keys)."),
    max_restarts: int = typer.Option(0, "--max-restarts", help="Start the whole group again after a failure, up to N times."),
    heartbeat_timeout: Optional[float] = typer.Option(None, "--heartbeat-timeout", help="A rank whose heartbeat (written to $SLURMGEN_HEARTBEAT_DIR, as the bundled trainer does) is older than S seconds counts as failed; ranks that write none are not judged."),
    keepalive: float = typer.Option(5.0, "--keepalive", help="Seconds between SSH keepalives; a host that answers none for 4 intervals is lost."),
    stop_grace: int = typer.Option(1, "--stop-grace", help="Seconds between TERM and KILL when stopping ranks."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print, per host, exactly what would run; connect to nothing."),
) -> None:
    """Start the job on every host over SSH; the first failure anywhere stops all of them."""
    import os

    from slurmgen.generate.specfile import spec_from_sources
    from slurmgen.generate.hostfile import read_hostfile
    from slurmgen.generate.hostlist import expand
    from slurmgen.launch.plan import build_plan, forwarded_env, read_env_file, select_hosts
    from slurmgen.generate.topology import Host

    if (hosts is None) == (hostfile is None):
        raise SlurmgenError(f"hosts: give exactly one of --hosts and --hostfile (got {'both' if hosts else 'neither'})")
    # Checked here rather than by typer's min/max, whose message leaves out the bad value
    # (max_restarts, heartbeat_timeout and stop_grace are checked with the plan).
    ssh_problems = [f"{name}: must be {rule} (got {value:g})" for name, value, ok, rule in (
        ("port", 22 if port is None else port, port is None or 1 <= port <= 65535, "a port number 1-65535"),
        ("connect_timeout", connect_timeout, connect_timeout > 0, "more than 0 seconds"),
        ("keepalive", keepalive, keepalive > 0, "more than 0 seconds"),
    ) if not ok]
    if ssh_problems:
        raise SlurmgenError(*ssh_problems)
    spec = spec_from_sources(config, _overrides(
        command=command or None, gpus=gpus, master_addr=master_addr, master_port=master_port, backend=backend,
        env=_parse_env(env), setup=list(setup), log_dir=log_dir,
    ))
    host_list = (read_hostfile(hostfile, spec.gpus) if hostfile is not None
                 else [Host.with_count(h, spec.gpus) for h in expand(hosts or "")])
    selected = select_hosts(host_list, include, exclude)
    stdin_env = forwarded_env(os.environ)
    for path in env_file:
        stdin_env.update(read_env_file(path))
    # One id for this launch, on every node and every restart: each rank's run record
    # (slurmgen.tracking) joins the same group without the ranks talking to each other.
    import secrets
    import time as _time

    stdin_env.setdefault("SLURMGEN_LAUNCH_ID", f"{_time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}")
    stdin_env.setdefault("SLURMGEN_GROUP", f"launch-{stdin_env['SLURMGEN_LAUNCH_ID']}")
    from slurmgen.launch.ssh.connect import SSHOptions, master_address  # paramiko: only for launch

    opts = SSHOptions(user=user, port=port, identities=tuple(str(p) for p in identity), known_hosts=known_hosts,
                      ssh_config=ssh_config, connect_timeout=connect_timeout, accept_new_host_keys=accept_new_host_keys)
    plan = build_plan(spec, selected, master=master, order=order, master_addr=lambda h: master_address(h, opts),
                      workdir=workdir or os.getcwd(), env=stdin_env, stop_grace=stop_grace,
                      heartbeat_timeout=spec.heartbeat_timeout if heartbeat_timeout is None else heartbeat_timeout,
                      max_restarts=max_restarts)
    from slurmgen.launch.runner import dry_run_text, launch as run_launch

    if dry_run:
        typer.echo(dry_run_text(plan, opts, keepalive), nl=False)
        return
    code = run_launch(plan, opts, keepalive=keepalive)
    if code:
        raise typer.Exit(code)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def train(ctx: typer.Context) -> None:
    """Run the bundled DDP trainer: the same flags as `python -m slurmgen.train` (see `slurmgen train --help`)."""
    from slurmgen.train.cli import main as train_main

    raise typer.Exit(train_main(list(ctx.args)))


@app.command()
def runs(
    directory: Path = typer.Argument(Path("runs"), metavar="[DIR]", help="Where to look for run records (searched recursively)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table."),
) -> None:
    """List the run records under DIR: name, group, status, steps, last loss, duration.

    The tasks of a sweep are listed together as one group (the array job, slurm-<id>), one row per
    task with its parameters; `slurmgen plot slurm-<id>` draws them into one figure."""
    from slurmgen.tracking.records import find_runs, format_duration, sweeps_together

    if not directory.is_dir():
        raise SlurmgenError(f"runs: no such directory: {str(directory)!r}", hint="pass the directory that holds the runs, e.g. runs/")
    damaged: list[str] = []
    found = sweeps_together(list(find_runs(directory, damaged)))
    for problem in damaged:  # what can be read is listed all the same
        typer.echo(f"slurmgen: warning: skipped a damaged run record: {problem}", err=True)
    rows = [{"id": r.get("id"), "name": r.get("name"), "group": r.get("group"), "job_type": r.get("job_type"),
             "status": r.get("status"), "steps": r.steps, "last_loss": r.last("loss"), "duration": r.duration(),
             "restarts": r.get("restart_count", 0), "sweep": r.sweep, "dir": str(r.dir)} for r in found]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo(f"no runs under {directory}")
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    colours = {"running": "cyan", "finished": "green", "failed": "red", "preempted": "yellow"}
    sweeps = any(row["sweep"] for row in rows)  # the task and params columns only when there is a sweep
    table = Table("name", "group", *(("task", "params") if sweeps else ()), "job type", "status", "steps", "last loss",
                  "duration", "restarts", box=None)
    for row in rows:
        loss = row["last_loss"]
        status = str(row["status"])
        sweep = row["sweep"] or {}
        params = " ".join(f"{k}={v}" for k, v in (sweep.get("params") or {}).items())
        table.add_row(str(row["name"]), sweep.get("id") or str(row["group"]),
                      *((str(sweep.get("task", "")), escape(params)) if sweeps else ()), str(row["job_type"]),
                      f"[{colours.get(status, 'white')}]{status}[/]", "-" if row["steps"] is None else str(row["steps"]),
                      "-" if not isinstance(loss, (int, float)) else f"{loss:.4g}", format_duration(row["duration"]),
                      str(row["restarts"] or ""))
    # Piped or captured: no terminal width to fit, so never cut a group name to fit 80 columns.
    Console(soft_wrap=True, width=None if sys.stdout.isatty() else 400).print(table)


@app.command()
def plot(
    run: str = typer.Argument(..., help="The run: its directory, or its id, name or group under --dir; or a sweep's id."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="PNG file to write [default: RUN_DIR/metrics.png]."),
    directory: Path = typer.Option(Path("runs"), "--dir", help="Where to look up RUN by id, name, group or sweep."),
    metric: List[str] = typer.Option([], "--metric", "-m", help="Only this metric; repeatable [default: all]."),
) -> None:
    """Draw a run's metric curves (train and val per metric) into a PNG; for a sweep (RUN is its
    id, slurm-<array id>, as `slurmgen runs` shows it) every task's curves in one figure."""
    try:
        import matplotlib  # noqa: F401  (only to say clearly that it is missing)
    except ImportError:
        raise SlurmgenError("plot: needs matplotlib, which is not installed", hint="pip install 'slurmgen[plot]'") from None
    import os

    from slurmgen.tracking.plot import plot_run, plot_sweep
    from slurmgen.tracking.records import resolve_runs

    damaged: list[str] = []
    try:
        found = resolve_runs(run, directory, damaged)
        if len(found) > 1:  # a sweep's runs
            where = Path(os.path.commonpath([str(r.dir) for r in found]))
            path = plot_sweep(found, output or where / f"{run}.png", metrics=list(metric) or None)
        else:
            path = plot_run(found[0], output or found[0].dir / "metrics.png", metrics=list(metric) or None)
    except (LookupError, ValueError, OSError) as exc:
        raise SlurmgenError(f"plot: {exc}") from None
    finally:
        for problem in damaged:
            typer.echo(f"slurmgen: warning: skipped a damaged run record: {problem}", err=True)
    typer.echo(f"wrote {path}")


@app.command()
def schema() -> None:
    """Print the JSON schema of the job spec (point your editor's YAML plugin at it)."""
    from slurmgen.generate.spec import JobSpec

    typer.echo(json.dumps(JobSpec.model_json_schema(), indent=2))


from slurmgen.jobs.cli import register as _register_job_commands  # noqa: E402  (needs `create` above)

_register_job_commands(app)

from slurmgen.doctor.cli import register as _register_doctor  # noqa: E402  (light: typer only)

_register_doctor(app)

from slurmgen.coordinator.cli import register as _register_coordinator  # noqa: E402

_register_coordinator(app)


_RICH_TAG = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")  # what Rich reads as a style tag (rich.markup.escape)


def command_tree():
    """`app` as the Click command Typer builds, with every help text escaped as Rich markup.

    Typer renders help strings as Rich markup, which takes "[default: out]" for a style tag and
    drops it ("Where to write the scripts ."). Help here is plain text, so it is escaped once,
    here, for every command, group and parameter, rather than string by string. (Rich's own
    `escape`, with the same pattern, would cost every start-up 14 ms of imports.)"""
    def whole(command) -> None:
        for holder in (command, *command.params):
            for attr in ("help", "short_help", "epilog"):
                if getattr(holder, attr, None):
                    setattr(holder, attr, _RICH_TAG.sub(lambda m: f"{m[1]}{m[1]}\\{m[2]}", getattr(holder, attr)))
        for sub in getattr(command, "commands", {}).values():
            whole(sub)

    tree = typer.main.get_command(app)
    whole(tree)
    return tree


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; the single place that turns errors into exit codes and one-line messages."""
    args = sys.argv[1:] if argv is None else argv
    try:
        code = command_tree()(args=args, prog_name="slurmgen", standalone_mode=False)
    except SlurmgenError as exc:
        if _state["verbose"]:
            raise
        for line in exc.lines():
            typer.echo(f"slurmgen: error: {line}", err=True)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("slurmgen: aborted", err=True)
        sys.exit(130)
    except Exception as exc:
        # Usage errors of Typer's command-line parser (a Click exception, which Typer
        # vendors in recent versions): recognised by their interface, printed on one line.
        if not (hasattr(exc, "format_message") and hasattr(exc, "exit_code")) or _state["verbose"]:
            raise
        message = exc.format_message()
        if message:  # empty when the parser already printed the help text
            typer.echo(f"slurmgen: error: {message}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
