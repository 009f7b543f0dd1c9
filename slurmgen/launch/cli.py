"""`slurmgen launch`: flags (and a YAML spec) -> a launch plan -> every host over SSH, or its dry run.

The flags are checked and turned into a spec, hosts and a plan before any connection (so a typo
costs nothing and `--dry-run` prints exactly what would run); paramiko is imported only for a
real launch (the plan and the dry run read the ssh config without it: ssh/sshconfig.py), so
`slurmgen --help`, `create` and `launch --dry-run` never load it. The launch is
recorded in the run registry (runs/model.py, launch/registry_entry.py) before the first connection, so
`slurmgen jobs` lists it while it runs and with its verdict after.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from slurmgen.cliopts import (
    ORDER_HELP,
    given_flags,
    identity_option,
    known_hosts_option,
    parse_env,
    registry_option,
    ssh_config_option,
    ssh_port_option,
    ssh_user_option,
)
from slurmgen.contract import envvars, ports, warm
from slurmgen.contract.backends import BACKENDS
from slurmgen.contract.node_events import KEEPALIVE_COUNT, KEEPALIVE_INTERVAL
from slurmgen.errors import SlurmgenError

if TYPE_CHECKING:
    from slurmgen.generate.topology import Host
    from slurmgen.launch.plan import LaunchPlan
    from slurmgen.ssh.target import SSHOptions


def launch(
    command: list[str] | None = typer.Argument(
        None, help="The program every process runs (after --). Default: python -m slurmgen.train."
    ),
    hosts: str | None = typer.Option(None, "--hosts", "-H", help="Hosts, a Slurm hostlist: node1,node2 or gpu[01-04]."),
    hostfile: Path | None = typer.Option(None, "--hostfile", help="DeepSpeed host file: 'host slots=N' lines."),
    include: str | None = typer.Option(
        None, "--include", help="Only these hosts/slots, DeepSpeed syntax: node1:0,1@node2."
    ),
    exclude: str | None = typer.Option(
        None, "--exclude", help="Not these hosts/slots, DeepSpeed syntax: node1:0,1@node2."
    ),
    gpus: str | None = typer.Option(
        None, "--gpus", metavar="N", help="Processes per host without slots= (default: 1)."
    ),
    config: Path | None = typer.Option(
        None, "--config", help="YAML job spec (as for create); flags given here override it."
    ),
    name: str | None = typer.Option(
        None,
        "--name",
        "--job-name",
        "-J",
        help="The run's name in `slurmgen jobs` and the runs page (default: the spec's job_name, else slurmgen).",
    ),
    master: str | None = typer.Option(None, "--master", help="The host that runs rank 0 (default: the first given)."),
    order: str = typer.Option("alphabetical", "--order", help=ORDER_HELP),
    master_addr: str | None = typer.Option(
        None, "--master-addr", help="Rendezvous address (default: the master's HostName)."
    ),
    master_port: str | None = typer.Option(
        None, "--master-port", metavar="N", help=f"Rendezvous port (default: {ports.DEFAULT_MASTER_PORT})."
    ),
    backend: str | None = typer.Option(None, "--backend", help=" | ".join(BACKENDS) + "."),
    env: list[str] = typer.Option([], "--env", "-e", help="KEY=VALUE for every process; repeatable."),
    env_file: list[Path] = typer.Option(
        [], "--env-file", help="KEY=VALUE lines (like .deepspeed_env), sent on stdin; repeatable."
    ),
    setup: list[str] = typer.Option(
        [], "--setup", help="Shell line run on each node before launch (venv, modules); repeatable."
    ),
    workdir: str | None = typer.Option(None, "--workdir", help="Directory on every node (default: this directory)."),
    log_dir: str | None = typer.Option(
        None, "--log-dir", help="Per-rank logs on each node, relative to --workdir (default: out/logs)."
    ),
    user: str | None = ssh_user_option(),
    port: int | None = ssh_port_option(),
    identity: list[Path] = identity_option(),
    known_hosts: str | None = known_hosts_option(),
    ssh_config: str | None = ssh_config_option(),
    connect_timeout: float = typer.Option(10.0, "--connect-timeout", help="Seconds to wait for each host."),
    accept_new_host_keys: bool = typer.Option(
        False, "--accept-new-host-keys", help="Trust and record keys of hosts not in known_hosts (never changed keys)."
    ),
    max_restarts: int = typer.Option(
        0, "--max-restarts", help="Start the whole group again after a failure, up to N times."
    ),
    spare_hosts: str | None = typer.Option(
        None,
        "--spare-hosts",
        help="Hot spare hosts, a Slurm hostlist: idle until a host is lost or cannot start; its node "
        "(node rank, ranks) then moves to the first spare with enough slots for the next attempt.",
    ),
    min_nodes: int | None = typer.Option(
        None,
        "--min-nodes",
        help="With --max-restarts: a lost host that no spare host can replace drops out, and the next "
        "attempt runs on the healthy hosts (ranks dense, a smaller world) while at least M are left.",
    ),
    restart_mode: str = typer.Option(
        warm.COLD,
        "--restart-mode",
        help="After a rank's failure: cold starts every process again; warm keeps the healthy ranks' "
        "processes, which wait for the new world and reload the latest checkpoint (the bundled trainer, "
        "or a program using slurmgen.train.warm), and starts only the failed rank anew.",
    ),
    heartbeat_timeout: float | None = typer.Option(
        None,
        "--heartbeat-timeout",
        help="A rank whose heartbeat (written to $SLURMGEN_HEARTBEAT_DIR, as the bundled trainer does) "
        "is older than S seconds counts as failed; ranks that write none are not judged.",
    ),
    keepalive: float = typer.Option(
        KEEPALIVE_INTERVAL,
        "--keepalive",
        help=f"Seconds between SSH keepalives; a host that answers none for {KEEPALIVE_COUNT + 1} intervals is lost.",
    ),
    stop_grace: int = typer.Option(1, "--stop-grace", help="Seconds between TERM and KILL when stopping ranks."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print, per host, exactly what would run; connect to nothing."
    ),
    registry: Path | None = registry_option(
        "Run registry where the launch is recorded (`slurmgen jobs` lists it) "
        "[default: $SLURMGEN_REGISTRY, else ~/.local/state/slurmgen/jobs.sqlite]."
    ),
) -> None:
    """Start the job on every host over SSH; the first failure anywhere stops all of them."""
    import os

    from slurmgen.generate.specfile import spec_from_sources
    from slurmgen.launch.plan import build_plan, select_hosts
    from slurmgen.launch.remote import timeline_file
    from slurmgen.ssh.sshconfig import master_address  # the ssh config only: no paramiko
    from slurmgen.ssh.target import SSHOptions

    _check_flags(hosts, hostfile, port, connect_timeout, keepalive)
    spec = spec_from_sources(
        config,
        given_flags(
            command=command or None,
            job_name=name,
            gpus=gpus,
            master_addr=master_addr,
            master_port=master_port,
            backend=backend,
            env=parse_env(env),
            setup=list(setup),
            log_dir=log_dir,
        ),
    )
    selected = select_hosts(_host_list(hosts, hostfile, spec.gpus), include, exclude)
    stdin_env = _stdin_env(env_file)
    # Every rank's phases and its node's start and exit of it, in one file the run registry names.
    stdin_env.setdefault(
        envvars.TIMELINE_FILE, timeline_file(workdir or os.getcwd(), spec.logs, stdin_env[envvars.LAUNCH_ID])
    )
    opts = SSHOptions(
        user=user,
        port=port,
        identities=tuple(str(p) for p in identity),
        known_hosts=known_hosts,
        ssh_config=ssh_config,
        connect_timeout=connect_timeout,
        accept_new_host_keys=accept_new_host_keys,
    )
    plan = build_plan(
        spec,
        selected,
        master=master,
        order=order,
        master_addr=lambda h: master_address(h, opts),
        workdir=workdir or os.getcwd(),
        env=stdin_env,
        stop_grace=stop_grace,
        heartbeat_timeout=spec.heartbeat_timeout if heartbeat_timeout is None else heartbeat_timeout,
        max_restarts=max_restarts,
        restart_mode=restart_mode,
        spares=_host_list(spare_hosts, None, spec.gpus) if spare_hosts else (),
        min_nodes=min_nodes,
    )
    _start(plan, opts, keepalive, dry_run, (registry, spec.job_name, list(spec.command)))


def _check_flags(
    hosts: str | None, hostfile: Path | None, port: int | None, connect_timeout: float, keepalive: float
) -> None:
    """The flags that need no spec: one source of hosts, and SSH numbers in range."""
    if (hosts is None) == (hostfile is None):
        raise SlurmgenError(f"hosts: give exactly one of --hosts and --hostfile (got {'both' if hosts else 'neither'})")
    # Checked here rather than by typer's min/max, whose message leaves out the bad value
    # (max_restarts, heartbeat_timeout and stop_grace are checked with the plan).
    ssh_problems = [
        f"{name}: must be {rule} (got {value:g})"
        for name, value, ok, rule in (
            ("port", 22 if port is None else port, port is None or 1 <= port <= 65535, "a port number 1-65535"),
            ("connect_timeout", connect_timeout, connect_timeout > 0, "more than 0 seconds"),
            ("keepalive", keepalive, keepalive > 0, "more than 0 seconds"),
        )
        if not ok
    ]
    if ssh_problems:
        raise SlurmgenError(*ssh_problems)


def _host_list(hosts: str | None, hostfile: Path | None, gpus: int) -> list[Host]:
    """The hosts of --hostfile (with their slots) or of the --hosts hostlist, `gpus` slots each."""
    from slurmgen.generate.hostfile import read_hostfile
    from slurmgen.generate.hostlist import expand
    from slurmgen.generate.topology import Host

    return (
        read_hostfile(hostfile, gpus)
        if hostfile is not None
        else [Host.with_count(h, gpus) for h in expand(hosts or "")]
    )


def _stdin_env(env_files: list[Path]) -> dict[str, str]:
    """What travels to every node on stdin: forwarded variables of this shell, the env files, the launch id."""
    import os
    import secrets
    import time

    from slurmgen.launch.plan import forwarded_env, read_env_file

    stdin_env = forwarded_env(os.environ)
    for path in env_files:
        stdin_env.update(read_env_file(path))
    # One id for this launch, on every node and every restart: each rank's run record
    # (slurmgen.tracking) joins the same group without the ranks talking to each other.
    stdin_env.setdefault(envvars.LAUNCH_ID, f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}")
    stdin_env.setdefault(envvars.GROUP, f"launch-{stdin_env[envvars.LAUNCH_ID]}")
    return stdin_env


def _start(
    plan: LaunchPlan, opts: SSHOptions, keepalive: float, dry_run: bool, run: tuple[Path | None, str, list[str]]
) -> None:
    """Print what would run (--dry-run), or record the run (registry, name, command), run it
    and leave with the job's exit code. A registry that cannot be opened stops us first."""
    if dry_run:  # neither paramiko nor the registry: see launch/preview.py
        from slurmgen.launch.preview import dry_run_text

        typer.echo(dry_run_text(plan, opts, keepalive), nl=False)
        return
    from slurmgen.launch.fanout import launch as run_launch
    from slurmgen.launch.registry_entry import LaunchRecord
    from slurmgen.runs.model import Recorder

    recorder = Recorder(run[0])
    recorder.check()
    code = run_launch(plan, opts, keepalive=keepalive, record=LaunchRecord.start(recorder, plan, run[1], run[2]))
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add `launch` to the `slurmgen` app; options stop at the program's name (`-- python train.py --lr 3`)."""
    app.command(context_settings={"allow_interspersed_args": False})(launch)
