"""`slurmgen create`, `ranks` and `schema`: flags (and a YAML spec) in, scripts or a rank table out.

`spec_from_create_flags`, `write_rendered` and `echo_notes` are also what `slurmgen submit` renders,
writes and notes with (it takes every flag of `create`), so the two commands cannot drift apart. Nothing heavy is
imported before a command runs: the spec (msgspec), the templates (jinja2) and Rich only inside.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from slurmgen.cliopts import ORDER_HELP, given_flags, parse_env
from slurmgen.contract.backends import BACKENDS
from slurmgen.errors import SlurmgenError


def create(
    command: list[str] | None = typer.Argument(
        None, help="The program every process runs (after --). Default: python -m slurmgen.train."
    ),
    config: Path | None = typer.Option(None, "--config", help="YAML job spec; flags given here override it."),
    output_dir: str | None = typer.Option(
        None, "--output-dir", "-o", help="Where to write the scripts [default: out]."
    ),
    nodes: str | None = typer.Option(None, "--nodes", "-N", metavar="N", help="Number of nodes [default: 1]."),
    gpus: str | None = typer.Option(None, "--gpus", metavar="N", help="Processes (GPUs) per node [default: 1]."),
    gpu_request: str | None = typer.Option(None, "--gpu-request", help="auto | gpus-per-node | gres | none."),
    time: str | None = typer.Option(
        None, "--time", "-t", help="Time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."
    ),
    partition: str | None = typer.Option(None, "--partition", "-p"),
    account: str | None = typer.Option(None, "--account", "-A"),
    qos: str | None = typer.Option(None, "--qos", "-q"),
    constraint: str | None = typer.Option(None, "--constraint", "-C"),
    exclusive: bool | None = typer.Option(None, "--exclusive/--no-exclusive", help="Whole nodes."),
    cpus_per_task: str | None = typer.Option(None, "--cpus-per-task", "-c", metavar="N", help="CPUs per process."),
    mem: str | None = typer.Option(None, "--mem", help="Memory per node, e.g. 64G."),
    gpu_type: str | None = typer.Option(
        None, "--gpu-type", metavar="TYPE", help="GPU type, e.g. a100: --gpus-per-node=a100:N or --gres=gpu:a100:N."
    ),
    mem_per_gpu: str | None = typer.Option(None, "--mem-per-gpu", help="Memory per GPU, e.g. 40G (instead of --mem)."),
    time_min: str | None = typer.Option(
        None, "--time-min", help="Shortest acceptable time limit: the job may start sooner with less."
    ),
    reservation: str | None = typer.Option(None, "--reservation", help="Run in these reservations, comma-separated."),
    nodelist: str | None = typer.Option(
        None, "--nodelist", "-w", metavar="HOSTLIST", help="Nodes the job must include, e.g. gpu[01-02]."
    ),
    exclude: str | None = typer.Option(
        None, "--exclude", "-x", metavar="HOSTLIST", help="Nodes the job must not run on, e.g. gpu[07,09]."
    ),
    job_name: str | None = typer.Option(None, "--job-name", "-J"),
    master_addr: str | None = typer.Option(None, "--master-addr", help="Rendezvous host [default: first node]."),
    master_port: str | None = typer.Option(
        None, "--master-port", metavar="N", help="Rendezvous port [default: from the job id]."
    ),
    backend: str | None = typer.Option(None, "--backend", help=" | ".join(BACKENDS) + "."),
    launcher: str | None = typer.Option(
        None,
        "--launcher",
        help="srun (a task per process) | torchrun (a task per node); "
        "run_slurm.sh only: launch_multi_node.sh starts every process itself.",
    ),
    bind: str | None = typer.Option(
        None,
        "--bind",
        help="none | auto | cores | numa: each rank on cores of its own (srun --cpu-bind; "
        "launch_multi_node.sh from the node's topology); each local rank's CPUs are printed [default: none].",
    ),
    env: list[str] = typer.Option([], "--env", "-e", help="KEY=VALUE for every process; repeatable."),
    setup: list[str] = typer.Option(
        [], "--setup", help="Shell line run before launch (module load, venv); repeatable."
    ),
    sbatch: list[str] = typer.Option([], "--sbatch", help="Extra #SBATCH option, e.g. --mail-type=END; repeatable."),
    container_image: str | None = typer.Option(None, "--container-image", help="Run inside this container image."),
    container_runtime: str | None = typer.Option(None, "--container-runtime", help="pyxis | apptainer."),
    container_mount: list[str] = typer.Option([], "--container-mount", help="SRC:DST[:FLAGS]; repeatable."),
    log_dir: str | None = typer.Option(None, "--log-dir", help="Job logs [default: OUTPUT_DIR/logs]."),
    requeue: bool | None = typer.Option(
        None,
        "--requeue/--no-requeue",
        help="Checkpoint and requeue on --preempt-signal before the time limit.",
    ),
    signal_lead: str | None = typer.Option(
        None,
        "--signal-lead",
        metavar="N",
        help="Seconds before the limit that --preempt-signal arrives [default: 120].",
    ),
    preempt_signal: str | None = typer.Option(
        None,
        "--preempt-signal",
        metavar="SIG",
        help="USR2 | USR1: the signal Slurm sends before the time limit; USR1 for a program that requeues on it "
        "itself (Lightning's SLURMEnvironment) [default: USR2, since NCCL may use USR1].",
    ),
    array: str | None = typer.Option(
        None, "--array", "-a", help="sbatch --array (0-15%4); with a sweep only %N, the most tasks at once."
    ),
    sweep: list[str] = typer.Option(
        [], "--sweep", help="KEY=V1,V2,...: one array task per point of the grid; repeatable."
    ),
    sweep_file: Path | None = typer.Option(
        None, "--sweep-file", help="JSON lines, one object of parameters per array task."
    ),
    sweep_args: str | None = typer.Option(
        None, "--sweep-args", help="How each parameter reaches the command [default: '--{key} {value}']."
    ),
    heartbeat_timeout: str | None = typer.Option(
        None,
        "--heartbeat-timeout",
        metavar="S",
        help="Stop the job step when a rank's heartbeat file is S seconds old (ranks that write none are not judged).",
    ),
    hang_factor: str | None = typer.Option(
        None,
        "--hang-factor",
        metavar="K",
        help="With --heartbeat-timeout: a rank is also hung once silent for its heartbeat period "
        "+ max(--hang-floor, K x its p99 step time) [default: 3; 0: the fixed timeout only].",
    ),
    hang_floor: str | None = typer.Option(
        None, "--hang-floor", metavar="S", help="Seconds below which the learned hang timeout never goes [default: 30]."
    ),
    retries: str | None = typer.Option(
        None, "--retries", metavar="N", help="Requeue the job after a failure with a --retry-on code, up to N times."
    ),
    retry_on: str | None = typer.Option(
        None, "--retry-on", metavar="CODES", help="Exit codes worth a requeue or an in-job restart, e.g. 1,124,143."
    ),
    exclude_failed_node: bool | None = typer.Option(
        None,
        "--exclude-failed-node/--no-exclude-failed-node",
        help="Exclude the node where the failure started before requeueing.",
    ),
    restarts: str | None = typer.Option(
        None,
        "--restarts",
        metavar="N",
        help="After a failure worth another attempt, start a new job step in the same allocation within seconds, "
        "up to N times, before any --retries requeue.",
    ),
    spare_nodes: str | None = typer.Option(
        None,
        "--spare-nodes",
        metavar="K",
        help="Ask for --nodes + K nodes (with --no-kill) and run on --nodes: at a --restarts restart a spare takes "
        "the failed node's place.",
    ),
    min_nodes: str | None = typer.Option(
        None,
        "--min-nodes",
        metavar="M",
        help="With --restarts: when a node is lost and no spare is left, restart on the nodes still healthy while "
        "there are at least M of them (a smaller world), instead of a requeue.",
    ),
    restart_mode: str | None = typer.Option(
        None,
        "--restart-mode",
        metavar="MODE",
        help="With --restarts: cold (a new job step of every rank) or warm (the healthy ranks keep their processes "
        "and the failed rank alone starts anew; the bundled trainer or slurmgen.train.warm, --launcher srun).",
    ),
    preflight: bool | None = typer.Option(
        None, "--preflight/--no-preflight", help="Run `slurmgen doctor` on every node before the job step."
    ),
    chain: str | None = typer.Option(
        None,
        "--chain",
        metavar="K",
        help="A run longer than --time: `submit` sbatches K links, each resuming the last one's checkpoint.",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the files instead of writing them."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
) -> None:
    """Write OUTPUT_DIR/run_slurm.sh, OUTPUT_DIR/launch_multi_node.sh and the resolved OUTPUT_DIR/job.yaml."""
    flags = dict(locals())
    from slurmgen.generate.render import render

    rendered = render(spec_from_create_flags(**{k: v for k, v in flags.items() if k not in ("dry_run", "force")}))
    write_rendered(rendered, dry_run=dry_run, force=force)


def spec_from_create_flags(
    *,
    command,
    config,
    env,
    setup,
    sbatch,
    container_image,
    container_runtime,
    container_mount,
    sweep,
    sweep_file,
    **fields,
):
    """The spec `create` (and `submit`, which shares its flags) works on: --config with the flags over it.

    Flags named like a spec field (`nodes`, `time`, `array`, ...) arrive in `fields` as they are.
    A warm restart asked of a program that cannot take part is refused here, before anything is
    written (generate/preflight.py: it reads the script, which the spec's validators do not).
    """
    from slurmgen.generate import sweep_input
    from slurmgen.generate.preflight import job_warm_refusal
    from slurmgen.generate.specfile import spec_from_sources

    if sweep and sweep_file is not None:
        raise SlurmgenError("sweep: give --sweep or --sweep-file, not both")
    points = sweep_input.read_file(sweep_file) if sweep_file is not None else sweep_input.parse_flag(sweep) or None
    container = given_flags(image=container_image, runtime=container_runtime, mounts=list(container_mount))
    spec = spec_from_sources(
        config,
        given_flags(
            command=command or None,
            env=parse_env(env),
            setup=list(setup),
            sbatch_extra=list(sbatch),
            container=container or None,
            sweep=points,
            **fields,
        ),
    )
    refused = job_warm_refusal(spec)
    if refused:
        raise SlurmgenError(refused)
    return spec


def write_rendered(rendered, *, dry_run: bool, force: bool, quiet: bool = False) -> None:
    """Print (--dry-run) or write the rendered files, all or none, and say what to do next."""
    from slurmgen.generate.output import write_files
    from slurmgen.generate.render import LAUNCH_SCRIPT, SLURM_SCRIPT
    from slurmgen.generate.topology import summary, uniform_table

    spec = rendered.spec
    table = uniform_table(spec.nodes, spec.gpus)
    out = Path(spec.output_dir)
    bound = _bind_preview(spec)
    if dry_run:
        if bound:
            typer.echo(f"# {bound}")
        for name, text in rendered.files.items():
            typer.echo(f"# ===== {out / name} =====")
            typer.echo(text, nl=False)
        return
    written = write_files(out, rendered.files, force=force, extra_dirs=[Path(spec.logs)])
    if quiet:
        return
    for path in written:
        typer.echo(f"wrote {path}")
    echo_notes(spec)
    typer.echo(f"ranks: {spec.nodes} node(s) x {spec.gpus}: {summary(table)}")
    if bound:
        typer.echo(bound)
    typer.echo("next:")
    typer.echo(f"  sbatch {out / SLURM_SCRIPT}")
    typer.echo(
        f"  or, without Slurm, on every node: {out / LAUNCH_SCRIPT} <master_addr> {spec.nodes} {spec.gpus} <node_rank>"
    )


def _bind_preview(spec) -> str:
    """Each local rank's CPUs under the spec's bind, on a node like this machine (generate/binding.py:
    the rule of the launcher that binds); '' for bind none."""
    if spec.bind == "none":
        return ""
    from slurmgen.generate.binding import here, preview

    return preview(spec.launcher, spec.bind, spec.gpus, spec.cpus_per_task, here())


def echo_notes(spec) -> None:
    """What this machine can tell about the job's programs (generate/preflight.py), a `slurmgen:
    note:` line each on stderr. `create` says it after writing; `submit` before it submits, since
    the job would otherwise fail on the nodes with `command not found` as its only word."""
    from slurmgen.generate.preflight import torchrun_note

    if note := torchrun_note(spec):
        typer.echo(f"slurmgen: note: {note}", err=True)


def ranks(
    hosts: str | None = typer.Option(None, "--hosts", help="Host names, a Slurm hostlist: gn6,gn7 or gpu[01-04]."),
    hostfile: Path | None = typer.Option(None, "--hostfile", help="DeepSpeed-style host file: 'host slots=N' lines."),
    nodes: int | None = typer.Option(None, "--nodes", "-N", help="Anonymous nodes, when no names are given."),
    gpus: int = typer.Option(1, "--gpus", help="Processes per host (hosts without slots= in a host file)."),
    master: str | None = typer.Option(None, "--master", help="The master host [default: the first given]."),
    world_size: int | None = typer.Option(None, "--world-size", help="Use only this many processes."),
    order: str = typer.Option("alphabetical", "--order", help=ORDER_HELP),
    bind: str = typer.Option(
        "none", "--bind", help="none | auto | cores | numa: also show the CPUs each rank gets (as create's --bind)."
    ),
    lscpu: Path | None = typer.Option(
        None,
        "--lscpu",
        help="With --bind: a node's `lscpu -p=CPU,CORE,SOCKET,NODE` output, the topology the CPUs are planned on "
        "[default: this machine's].",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table."),
) -> None:
    """Print the rank table: which host runs which RANK, LOCAL_RANK and NODE_RANK (and with --bind its CPUs)."""
    from slurmgen.generate.hostfile import read_hostfile
    from slurmgen.generate.hostlist import expand
    from slurmgen.generate.topology import Host, anonymous_hosts, order_hosts, rank_table

    given = [name for name, v in (("--hosts", hosts), ("--hostfile", hostfile), ("--nodes", nodes)) if v is not None]
    if len(given) != 1:
        raise SlurmgenError(
            f"hosts: give exactly one of --hosts, --hostfile, --nodes (got {len(given)}: {', '.join(given) or 'none'})"
        )
    if gpus < 1:
        raise SlurmgenError(f"gpus: must be at least 1 (got {gpus})")
    if nodes is not None:
        if master is not None:
            raise SlurmgenError("master: --master needs named hosts (--hosts or --hostfile)")
        table = rank_table(anonymous_hosts(nodes, gpus), world_size)
    else:
        host_list = (
            read_hostfile(hostfile, gpus)
            if hostfile is not None
            else [Host.with_count(h, gpus) for h in expand(hosts or "")]
        )
        table = rank_table(order_hosts(host_list, master, order), world_size)
    cpus = _bound_cpus(table, bind, lscpu)
    if as_json:
        rows = [
            {k: v for k, v in e.as_dict().items() if k != "slot"} | ({"cpus": cpus[e.rank]} if cpus else {})
            for e in table
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    out = Table("host", "rank", "local_rank", "node_rank", "local_world_size", "world_size", box=None)
    if cpus:
        out.add_column("cpus")
    for e in table:
        row = [str(v) for v in (e.rank, e.local_rank, e.node_rank, e.local_world_size, e.world_size)]
        out.add_row(e.host, *row, *([cpus[e.rank]] if cpus else []))
    Console(soft_wrap=True).print(out)


def _bound_cpus(table, bind: str, lscpu: Path | None) -> dict[int, str]:
    """Each rank's CPUs under `bind` (generate/binding.py: the rule the node applies), on the
    topology of --lscpu or this machine, every host taken to be alike; {} without binding."""
    if bind == "none":
        return {}
    from slurmgen.generate.binding import cpu_list, here, plan, read_lscpu
    from slurmgen.generate.spec import JobSpec, choices
    from slurmgen.generate.user_files import read_text

    if bind not in choices(JobSpec, "bind"):
        raise SlurmgenError(f"bind: expected one of {', '.join(choices(JobSpec, 'bind'))} (got {bind!r})")
    text = read_text(lscpu, "lscpu") if lscpu is not None else here()
    if not text:
        raise SlurmgenError("lscpu: cannot read this machine's topology (lscpu -p): give --lscpu FILE")
    cores, found = read_lscpu(text), {}
    for e in table:
        planned = plan(cores, e.local_world_size, "numa" if bind == "auto" else bind)
        if isinstance(planned, str) and bind != "auto":
            raise SlurmgenError(f"bind: {bind} cannot be given on {e.host}: {planned}")
        found[e.rank] = "unbound" if isinstance(planned, str) else cpu_list(planned[e.local_rank])
    return found


def schema() -> None:
    """Print the JSON schema of the job spec (point your editor's YAML plugin at it)."""
    from slurmgen.generate.spec import json_schema

    typer.echo(json.dumps(json_schema(), indent=2))


def register(app: typer.Typer) -> None:
    """Add `create` and `ranks` to the `slurmgen` app."""
    app.command()(create)
    app.command()(ranks)


def register_schema(app: typer.Typer) -> None:
    """Add `schema`, which `slurmgen --help` lists after the run commands (launch, train, runs, plot)."""
    app.command()(schema)
