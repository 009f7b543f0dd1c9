"""Flags that several packages' commands share, each spelled once: SSH, `--env`, coordinator
access; and the colour of a state in a terminal.

Every package owns its commands (`generate/cli.py`, `launch/cli.py`, `jobs/cli.py`, ...) and
takes from here what more than one of them offers, so `--env K=V` is parsed by one rule and
`--ssh-config` is `-F` everywhere. Where commands word a shared flag's help differently (launch
documents the SSH defaults, doctor does not), the help is an argument and the spelling stays
here. Imports typer and nothing of slurmgen's packages: each package's `cli.py` imports this,
never the other way round.
"""

from __future__ import annotations

from typing import Any

import typer

from slurmgen.contract import envvars, ports
from slurmgen.contract.states import State, from_run_record, from_slurm
from slurmgen.errors import SlurmgenError

ORDER_HELP = (
    "Node order after the master: alphabetical (gn39 before gn7, the product brief's rule) | "
    "natural (gn7 before gn39, Slurm's order, which run_slurm.sh always uses)."
)

# --server and --token-file of every command that talks to the coordinator.
SERVER = typer.Option(
    None,
    "--server",
    envvar=envvars.SERVER,
    help=f"Coordinator URL [default: http://127.0.0.1:{ports.COORDINATOR_PORT}].",
)
TOKEN_FILE = typer.Option(
    None, "--token-file", help="Token file [default: $SLURMGEN_TOKEN, else ~/.config/slurmgen/token]."
)


# --registry of every command that reads or writes the run registry (runs/registry.py).
REGISTRY_HELP = "Run registry file [default: $SLURMGEN_REGISTRY, else ~/.local/state/slurmgen/jobs.sqlite]."


def registry_option(help: str = REGISTRY_HELP) -> Any:
    return typer.Option(None, "--registry", help=help)


STATE_COLOURS = {
    State.PENDING: "yellow",
    State.STARTING: "cyan",
    State.RUNNING: "cyan",
    State.SUCCEEDED: "green",
    State.FAILED: "red",
    State.LOST: "red",
    State.STOPPING: "magenta",
    State.STOPPED: "magenta",
    State.PREEMPTED: "magenta",
}
_RUN_WORDS = {s.value: s for s in State}


def colour(state: str) -> str | None:
    """The terminal colour of what `state` means, whoever said it: a run's word ('stopped'), a run
    record's ('finished') or Slurm's ('CANCELLED' is stopped too, 'TIMEOUT' failed), through the
    contract's mappings: `slurmgen jobs`, `status` and `runs` colour a state alike."""
    meaning = _RUN_WORDS.get(state) or from_run_record(state) or from_slurm(state)
    return STATE_COLOURS.get(meaning) if meaning else None


def parse_env(pairs: list[str]) -> dict[str, str]:
    """`--env KEY=VALUE` flags as a mapping; the value may hold '=' and may be empty, the key may not."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SlurmgenError(f"env: expected KEY=VALUE (got {pair!r})")
        env[key] = value
    return env


def given_flags(**flags: object) -> dict[str, object]:
    """The CLI flags that were given, as spec fields (None and empty lists mean 'not given')."""
    return {k: v for k, v in flags.items() if v is not None and v != [] and v != {}}


def ssh_user_option(help: str = "SSH user (default: ~/.ssh/config, else you).") -> Any:
    return typer.Option(None, "--user", "-l", help=help)


def ssh_port_option(help: str = "SSH port (default: ~/.ssh/config, else 22).") -> Any:
    return typer.Option(None, "--port", "-p", help=help)


def identity_option(help: str = "Private key file; repeatable.") -> Any:
    return typer.Option([], "--identity", "-i", help=help)


def known_hosts_option(help: str = "known_hosts file (default: ~/.ssh/known_hosts).") -> Any:
    return typer.Option(None, "--known-hosts", help=help)


def ssh_config_option(help: str = "ssh config file (default: ~/.ssh/config).") -> Any:
    return typer.Option(None, "--ssh-config", "-F", help=help)
