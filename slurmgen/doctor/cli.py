"""The `slurmgen doctor` command: pick where the rows come from, print the table, exit 1 on problems.

Where: `--hosts/--hostfile` over SSH; inside a Slurm allocation (an salloc shell or a batch
script, as run_slurm.sh --preflight does) one srun task per node; under `srun slurmgen doctor`
each node's first task, task 0 printing the table; otherwise this machine.
Nothing heavy is imported before the command runs (torch only inside the probe).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from slurmgen.cliopts import identity_option, known_hosts_option, ssh_config_option, ssh_port_option, ssh_user_option
from slurmgen.contract import envvars, exitcodes, ports
from slurmgen.doctor.fabric_verdict import MIN_SHARE
from slurmgen.errors import SlurmgenError
from slurmgen.jobs.cli_shared import RemoteOpt, SetupOpt

if TYPE_CHECKING:
    from slurmgen.doctor.probe import ProbeOptions


def _job_hosts(variable: str = "SLURM_JOB_NODELIST") -> list[str]:
    nodelist = os.environ.get(variable, "")
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    hosts = out.stdout.split()
    if not hosts:
        raise SlurmgenError(
            f"doctor: cannot list the allocation's nodes: 'scontrol show hostnames {nodelist}' "
            f"gave nothing ({out.stderr.strip() or 'no output'})"
        )
    return hosts


def preempt_signal(config: Path | None, given: str | None) -> str:
    """The signal to check: --signal, else the spec's preempt_signal (--config), else the spec's
    default; the job's program is written to catch that one, so that one must arrive."""
    from slurmgen.generate.spec import JobSpec, choices, default

    if given is None:
        if config is None:
            return str(default(JobSpec, "preempt_signal"))
        from slurmgen.generate.specfile import spec_from_sources

        return spec_from_sources(config, {}).preempt_signal
    name = given.upper().removeprefix("SIG")
    if name not in choices(JobSpec, "preempt_signal"):
        raise SlurmgenError(f"signal: expected {' or '.join(choices(JobSpec, 'preempt_signal'))} (got {given!r})")
    return name


def doctor(
    hosts: str | None = typer.Option(
        None, "--hosts", "-H", help="Check these hosts over SSH (a Slurm hostlist: node[1-4])."
    ),
    hostfile: Path | None = typer.Option(None, "--hostfile", help="Check the hosts of a DeepSpeed host file over SSH."),
    files: list[str] = typer.Option(
        [], "--files", help="Hash these files or directories (default: the git-tracked files here); repeatable."
    ),
    directory: str = typer.Option(".", "--dir", help="The output directory whose free disk is checked."),
    min_free_gb: float = typer.Option(1.0, "--min-free-gb", help="Less free disk than this in --dir fails."),
    master_addr: str | None = typer.Option(
        None,
        "--master-addr",
        help="Rendezvous host to check (default: $MASTER_ADDR, the allocation's first node, or the first host).",
    ),
    master_port: int | None = typer.Option(
        None,
        "--master-port",
        help="Rendezvous port to check (default: $MASTER_PORT, "
        f"run_slurm.sh's port for the job ({ports.JOB_PORT_RULE}), or {ports.DEFAULT_MASTER_PORT}).",
    ),
    port_timeout: float = typer.Option(
        10.0,
        "--port-timeout",
        envvar=envvars.DOCTOR_PORT_TIMEOUT,
        help="Seconds every node has to reach MASTER_PORT.",
    ),
    python: str | None = typer.Option(
        None,
        "--python",
        help="The Python on the SSH hosts, with slurmgen (default: this one's path, as on a shared file system).",
    ),
    workdir: str | None = typer.Option(None, "--workdir", help="Directory on the SSH hosts (default: this directory)."),
    user: str | None = ssh_user_option("SSH user."),
    port: int | None = ssh_port_option("SSH port."),
    identity: list[Path] = identity_option(),
    known_hosts: str | None = known_hosts_option("known_hosts file."),
    ssh_config: str | None = ssh_config_option("ssh config file."),
    config: Path | None = typer.Option(
        None, "--config", help="The job's YAML spec: check the preemption signal it uses (preempt_signal)."
    ),
    signal: str | None = typer.Option(
        None, "--signal", help="The preemption signal to check (default: the spec's with --config, else USR2)."
    ),
    fabric: bool = typer.Option(
        False,
        "--fabric",
        help="Also check the network: the address each hostname resolves to, the route to the master, "
        "NCCL_*/GLOO_* agreement, InfiniBand/EFA, and a gloo all-reduce against raw TCP between the same nodes "
        "(uses MASTER_PORT+1).",
    ),
    fabric_mb: float = typer.Option(
        8.0, "--fabric-mb", help="Size of the --fabric all-reduce in MB (raw TCP sends 4 times as much per link)."
    ),
    min_share: float = typer.Option(
        MIN_SHARE,
        "--min-collective-share",
        help="--fabric fails when the all-reduce's bus bandwidth is less than this share of the slowest raw TCP link.",
    ),
    slurm: bool = typer.Option(
        False,
        "--slurm",
        help="Only compare the job of --config with what the Slurm cluster has (partitions, nodes, GPUs, memory, "
        "features, time limit, accounts), as `submit` does before submitting; nothing is submitted.",
    ),
    remote: str | None = RemoteOpt,
    remote_setup: list[str] = SetupOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the rows and problems as JSON."),
) -> None:
    """Check every node: same Python, torch, CUDA, NCCL, GPUs and files; MASTER_ADDR/PORT reachable;
    the preemption signal delivered; free disk; with --fabric the network."""
    from slurmgen.doctor import nodes

    if slurm:
        _slurm_check(config, remote, ssh_config, remote_setup)
        return
    if remote is not None:
        raise SlurmgenError(f"remote: --remote {remote} asks Slurm there, with --slurm; nodes are checked with --hosts")
    if hosts is not None and hostfile is not None:
        raise SlurmgenError("hosts: give one of --hosts and --hostfile (got both)")
    opts = _probe_options(files, directory, min_free_gb, master_addr, master_port, port_timeout, config, signal)
    if fabric:
        opts = _with_fabric(opts, fabric_mb, min_share)
    if hosts is not None or hostfile is not None:
        from slurmgen.generate.hostfile import read_hostfile
        from slurmgen.generate.hostlist import expand
        from slurmgen.ssh.connect import SSHOptions, master_address

        names = [h.name for h in read_hostfile(hostfile, 1)] if hostfile else expand(hosts or "")
        ssh = SSHOptions(
            user=user,
            port=port,
            identities=tuple(str(p) for p in identity),
            known_hosts=known_hosts,
            ssh_config=ssh_config,
        )
        opts = replace(
            opts,
            master_addr=master_addr or master_address(names[0], ssh),
            master_port=master_port or ports.DEFAULT_MASTER_PORT,
        )
        rows = nodes.ssh_rows(opts, names, ssh, python or sys.executable, workdir or os.getcwd())
    elif os.environ.get("SLURM_JOB_ID"):
        found = _allocation_rows(opts)
        if found is None:
            return  # `srun slurmgen doctor`: task 0 prints the table for all
        rows = found
    else:
        rows = nodes.local_rows(opts)
    _report(rows, as_json, min_share)


def _slurm_check(config: Path | None, remote: str | None, ssh_config: str | None, setup: list[str]) -> None:
    """`doctor --slurm`: the check `submit` makes before submitting (jobs/request_check.py), of the
    job of --config as `create --config` renders it, asked of this machine's Slurm or, with
    --remote, of the login node's over the SSH connection `submit --remote` uses."""
    from slurmgen.generate.render import SLURM_SCRIPT, render
    from slurmgen.generate.specfile import spec_from_sources
    from slurmgen.jobs import request_check
    from slurmgen.jobs.cli_shared import Runners

    rendered = render(spec_from_sources(config, {}))
    runners = Runners(ssh_config, list(setup))
    try:
        runner = runners(remote)
        facts = request_check.ask(runner, rendered.files[SLURM_SCRIPT], os.getcwd() if remote is None else None)
    except ValueError as exc:
        raise SlurmgenError(f"doctor: slurm: the cluster did not answer: {exc}", exit_code=exitcodes.FAILED) from None
    finally:
        runners.close()
    found = request_check.problems(rendered.spec, facts)
    if found:
        raise SlurmgenError(*[f"doctor: {p}" for p in found], exit_code=exitcodes.FAILED)
    spec, start = rendered.spec, facts.estimate.start
    typer.echo(
        f"slurm: the request fits ({spec.nodes} node(s) x {spec.gpus}, partition {facts.estimate.partition}); "
        f"Slurm expects it to start at {start.isoformat(sep=' ') if start else 'an unknown time'}"
    )


def _probe_options(
    files: list[str],
    directory: str,
    min_free_gb: float,
    master_addr: str | None,
    master_port: int | None,
    port_timeout: float,
    config: Path | None,
    signal: str | None,
) -> ProbeOptions:
    """What every node checks, from the flags, else $MASTER_ADDR/$MASTER_PORT; where the rows
    come from may still fill in the rendezvous (SSH: the first host; Slurm: run_slurm.sh's)."""
    from slurmgen.doctor.probe import ProbeOptions

    if master_port is not None and not 1 <= master_port <= 65535:
        raise SlurmgenError(f"master_port: must be a port number 1-65535 (got {master_port})")
    if port_timeout <= 0:
        raise SlurmgenError(f"port_timeout: must be more than 0 seconds (got {port_timeout:g})")
    env_port = os.environ.get("MASTER_PORT", "")
    return ProbeOptions(
        files=tuple(files),
        out_dir=directory,
        min_free_gb=min_free_gb,
        master_addr=master_addr or os.environ.get("MASTER_ADDR") or None,
        master_port=master_port or (int(env_port) if env_port.isdigit() else None),
        port_timeout=port_timeout,
        signal=preempt_signal(config, signal),
    )


def _with_fabric(opts: ProbeOptions, fabric_mb: float, min_share: float) -> ProbeOptions:
    """The network checks of --fabric, with their size; the share is judged by `_report`."""
    if not 0 < min_share <= 1:
        raise SlurmgenError(
            f"min_collective_share: expected a share above 0 and at most 1, e.g. 0.1 (got {min_share:g})"
        )
    if not 0 < fabric_mb <= 1024:
        raise SlurmgenError(f"fabric_mb: expected megabytes above 0 and at most 1024 (got {fabric_mb:g})")
    return replace(opts, fabric_mb=fabric_mb)


def _allocation_rows(opts: ProbeOptions) -> list[dict[str, Any]] | None:
    """Rows of every node of this Slurm allocation (or job step), checked against run_slurm.sh's
    master and port; None on every task but 0 under `srun slurmgen doctor`."""
    from slurmgen.doctor import nodes
    from slurmgen.doctor.probe import ProbeOptions

    in_step = bool(os.environ.get("SLURM_STEP_ID"))
    names = _job_hosts("SLURM_STEP_NODELIST" if in_step else "SLURM_JOB_NODELIST")
    job = int(os.environ["SLURM_JOB_ID"])
    opts = ProbeOptions(
        **{
            **opts.__dict__,
            "master_addr": opts.master_addr or names[0],
            "master_port": opts.master_port or ports.job_port(job),
        }
    )
    return nodes.step_rows(opts, names) if in_step else nodes.allocation_rows(opts, names)


def _report(rows: list[dict], as_json: bool, min_share: float) -> None:
    """Print the table (or JSON), a line per warning, and fail with one line per problem."""
    from rich.console import Console

    from slurmgen.doctor.compare import compare
    from slurmgen.doctor.table import table

    verdict = compare(rows, min_share)
    for warning in verdict.warnings:
        typer.echo(f"slurmgen: warning: doctor: {warning}", err=True)
    if as_json:
        typer.echo(json.dumps({"rows": rows, "problems": verdict.problems, "warnings": verdict.warnings}, indent=2))
    else:
        # Piped (a batch log): no terminal width to fit, so no cell is cut.
        Console(soft_wrap=True, width=None if sys.stdout.isatty() else 400).print(table(verdict))
    if verdict.problems:
        raise SlurmgenError(*[f"doctor: {p}" for p in verdict.problems], exit_code=exitcodes.FAILED)


def register(app: typer.Typer) -> None:
    """Add `doctor` to the `slurmgen` app."""
    app.command()(doctor)
