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
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional

import typer

from slurmgen.cliopts import (identity_option, known_hosts_option, ssh_config_option, ssh_port_option,
                              ssh_user_option)
from slurmgen.contract import exitcodes, ports
from slurmgen.errors import SlurmgenError

if TYPE_CHECKING:
    from slurmgen.doctor.probe import ProbeOptions


def _job_hosts(variable: str = "SLURM_JOB_NODELIST") -> list[str]:
    nodelist = os.environ.get(variable, "")
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    hosts = out.stdout.split()
    if not hosts:
        raise SlurmgenError(f"doctor: cannot list the allocation's nodes: 'scontrol show hostnames {nodelist}' "
                            f"gave nothing ({out.stderr.strip() or 'no output'})")
    return hosts


def preempt_signal(config: Optional[Path], given: Optional[str]) -> str:
    """The signal to check: --signal, else the spec's preempt_signal (--config), else the spec's
    default; the job's program is written to catch that one, so that one must arrive."""
    from typing import get_args

    from slurmgen.generate.spec import JobSpec

    field = JobSpec.model_fields["preempt_signal"]
    if given is None:
        if config is None:
            return str(field.default)
        from slurmgen.generate.specfile import spec_from_sources
        return spec_from_sources(config, {}).preempt_signal
    name = given.upper().removeprefix("SIG")
    if name not in get_args(field.annotation):
        raise SlurmgenError(f"signal: expected {' or '.join(get_args(field.annotation))} (got {given!r})")
    return name


def doctor(
    hosts: Optional[str] = typer.Option(None, "--hosts", "-H", help="Check these hosts over SSH (a Slurm hostlist: node[1-4])."),
    hostfile: Optional[Path] = typer.Option(None, "--hostfile", help="Check the hosts of a DeepSpeed host file over SSH."),
    files: List[str] = typer.Option([], "--files", help="Hash these files or directories (default: the git-tracked files here); repeatable."),
    directory: str = typer.Option(".", "--dir", help="The output directory whose free disk is checked."),
    min_free_gb: float = typer.Option(1.0, "--min-free-gb", help="Less free disk than this in --dir fails."),
    master_addr: Optional[str] = typer.Option(None, "--master-addr", help="Rendezvous host to check (default: $MASTER_ADDR, the allocation's first node, or the first host)."),
    master_port: Optional[int] = typer.Option(None, "--master-port", help=f"Rendezvous port to check (default: $MASTER_PORT, run_slurm.sh's port for the job ({ports.JOB_PORT_RULE}), or {ports.DEFAULT_MASTER_PORT})."),
    port_timeout: float = typer.Option(10.0, "--port-timeout", envvar="SLURMGEN_DOCTOR_PORT_TIMEOUT", help="Seconds every node has to reach MASTER_PORT."),
    python: Optional[str] = typer.Option(None, "--python", help="The Python on the SSH hosts, with slurmgen (default: this one's path, as on a shared file system)."),
    workdir: Optional[str] = typer.Option(None, "--workdir", help="Directory on the SSH hosts (default: this directory)."),
    user: Optional[str] = ssh_user_option("SSH user."),
    port: Optional[int] = ssh_port_option("SSH port."),
    identity: List[Path] = identity_option(),
    known_hosts: Optional[str] = known_hosts_option("known_hosts file."),
    ssh_config: Optional[str] = ssh_config_option("ssh config file."),
    config: Optional[Path] = typer.Option(None, "--config", help="The job's YAML spec: check the preemption signal it uses (preempt_signal)."),
    signal: Optional[str] = typer.Option(None, "--signal", help="The preemption signal to check (default: the spec's with --config, else USR2)."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows and problems as JSON."),
) -> None:
    """Check every node: same Python, torch, CUDA, NCCL, GPUs and files; MASTER_ADDR/PORT reachable; the preemption signal delivered; free disk."""
    from slurmgen.doctor import nodes
    from slurmgen.doctor.probe import ProbeOptions

    if hosts is not None and hostfile is not None:
        raise SlurmgenError("hosts: give one of --hosts and --hostfile (got both)")
    if master_port is not None and not 1 <= master_port <= 65535:
        raise SlurmgenError(f"master_port: must be a port number 1-65535 (got {master_port})")
    if port_timeout <= 0:
        raise SlurmgenError(f"port_timeout: must be more than 0 seconds (got {port_timeout:g})")
    env_port = os.environ.get("MASTER_PORT", "")
    opts = ProbeOptions(files=tuple(files), out_dir=directory, min_free_gb=min_free_gb,
                        master_addr=master_addr or os.environ.get("MASTER_ADDR") or None,
                        master_port=master_port or (int(env_port) if env_port.isdigit() else None),
                        port_timeout=port_timeout, signal=preempt_signal(config, signal))
    if hosts is not None or hostfile is not None:
        from slurmgen.generate.hostfile import read_hostfile
        from slurmgen.generate.hostlist import expand
        from slurmgen.launch.ssh.connect import SSHOptions, master_address

        names = [h.name for h in read_hostfile(hostfile, 1)] if hostfile else expand(hosts or "")
        ssh = SSHOptions(user=user, port=port, identities=tuple(str(p) for p in identity),
                         known_hosts=known_hosts, ssh_config=ssh_config)
        opts = ProbeOptions(**{**opts.__dict__, "master_addr": master_addr or master_address(names[0], ssh),
                               "master_port": master_port or ports.DEFAULT_MASTER_PORT})
        rows = nodes.ssh_rows(opts, names, ssh, python or sys.executable, workdir or os.getcwd())
    elif os.environ.get("SLURM_JOB_ID"):
        found = _allocation_rows(opts)
        if found is None:
            return  # `srun slurmgen doctor`: task 0 prints the table for all
        rows = found
    else:
        rows = nodes.local_rows(opts)
    _report(rows, as_json)


def _allocation_rows(opts: ProbeOptions) -> Optional[list[dict[str, Any]]]:
    """Rows of every node of this Slurm allocation (or job step), checked against run_slurm.sh's
    master and port; None on every task but 0 under `srun slurmgen doctor`."""
    from slurmgen.doctor import nodes
    from slurmgen.doctor.probe import ProbeOptions

    in_step = bool(os.environ.get("SLURM_STEP_ID"))
    names = _job_hosts("SLURM_STEP_NODELIST" if in_step else "SLURM_JOB_NODELIST")
    job = int(os.environ["SLURM_JOB_ID"])
    opts = ProbeOptions(**{**opts.__dict__, "master_addr": opts.master_addr or names[0],
                           "master_port": opts.master_port or ports.job_port(job)})
    return nodes.step_rows(opts, names) if in_step else nodes.allocation_rows(opts, names)


def _report(rows: list[dict[str, Any]], as_json: bool) -> None:
    """Print the table (or JSON) of every node; exit 1 when the nodes disagree or a check failed."""
    from rich.console import Console

    from slurmgen.doctor.compare import compare
    from slurmgen.doctor.table import table

    verdict = compare(rows)
    if as_json:
        typer.echo(json.dumps({"rows": rows, "problems": verdict.problems}, indent=2))
    else:
        # Piped (a batch log): no terminal width to fit, so no cell is cut.
        Console(soft_wrap=True, width=None if sys.stdout.isatty() else 400).print(table(verdict))
    if verdict.problems:
        raise SlurmgenError(*[f"doctor: {p}" for p in verdict.problems], exit_code=exitcodes.FAILED)


def register(app: typer.Typer) -> None:
    """Add `doctor` to the `slurmgen` app."""
    app.command()(doctor)
