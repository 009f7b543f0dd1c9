"""What the job commands share: their common options, the colour of a state, JSON output, the
runners (here or on a login node) and finding the job a command names in the registry.

Apart from cli.py so that `submit` (submit_cli.py, which carries every flag of `create`) and
the other job commands use one definition of each.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from slurmgen.cliopts import colour, registry_option, ssh_config_option
from slurmgen.errors import SlurmgenError

RegistryOpt = registry_option()
RemoteOpt = typer.Option(None, "--remote", help="Run Slurm's commands on this login node (a host of ~/.ssh/config).")
SshConfigOpt = ssh_config_option("ssh config file [default: ~/.ssh/config].")
SetupOpt = typer.Option(
    [], "--remote-setup", help="Shell line run first on the login node (module load slurm); repeatable."
)
JsonOpt = typer.Option(False, "--json", help="Print JSON.")


def style(text: str, state: str) -> str:
    return typer.style(text, fg=colour(state)) if sys.stdout.isatty() else text


def echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def note(text: str) -> None:
    """A note on stderr: which of several jobs a reference means."""
    typer.echo(f"slurmgen: note: {text}", err=True)


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
                from slurmgen.jobs.slurm_runner import LocalRunner

                self.open[where] = LocalRunner()
            else:
                from slurmgen.jobs.remote import RemoteRunner

                self.open[where] = RemoteRunner(where, self.ssh_config or ssh_config, self.setup or setup or [])
        return self.open[where]

    def close(self) -> None:
        for runner in self.open.values():
            runner.close()


def with_job(
    registry: Path | None,
    job: str | None,
    remote: str | None,
    ssh_config: str | None,
    setup: list[str],
    work: Callable[..., Any],
) -> Any:
    """Open the registry, find JOB (default: the newest), open its runner, run `work`."""
    from slurmgen.jobs.resolve import find
    from slurmgen.runs.registry import Registry

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
            return work(
                reg,
                record,
                task,
                runners(record.remote, record.info.get("remote_setup"), record.info.get("ssh_config")),
            )
        finally:
            runners.close()
