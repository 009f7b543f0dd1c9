"""The `slurmgen` command line's composition root: the app, its commands, the one error boundary.

Each package owns its commands in its own `cli.py` (`generate`, `launch`, `tracking`, `jobs`,
`doctor`, `coordinator`; `train/command.py` for the trainer's pass-through) and adds them
with `register(app)`; flags that several of them share live in `cliopts.py`. This module only
composes them, in the order `slurmgen --help` lists them, and decides exit codes in `main`:
0 success, 1 a run failed, 2 bad input. Expected errors print one line each, no traceback
(`--verbose` shows it). Commands import heavy modules (torch, paramiko, the web stack) inside
themselves, never at start-up. Nothing imports this module but `__main__` and the entry point.
"""

from __future__ import annotations

import copy
import re
import sys

import typer

from slurmgen import __version__
from slurmgen.contract.exitcodes import INTERRUPTED
from slurmgen.coordinator import cli as coordinator_cli
from slurmgen.doctor import cli as doctor_cli
from slurmgen.errors import SlurmgenError
from slurmgen.generate import cli as generate_cli
from slurmgen.jobs import cli as jobs_cli
from slurmgen.launch import cli as launch_cli
from slurmgen.tracking import cli as tracking_cli
from slurmgen.train import ckpt_command
from slurmgen.train import command as train_command

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


# The order `slurmgen --help` lists them in: make the scripts, run, look at runs; then Slurm's jobs,
# the preflight check and the coordinator.
generate_cli.register(app)          # create, ranks
launch_cli.register(app)            # launch
train_command.register(app)         # train
ckpt_command.register(app)          # ckpt info, ckpt consolidate
tracking_cli.register(app)          # runs, plot
generate_cli.register_schema(app)   # schema
jobs_cli.register(app)              # submit, jobs, status, logs, cancel
doctor_cli.register(app)            # doctor
coordinator_cli.register(app)       # serve, agent, workers, group ...


_RICH_TAG = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")  # what Rich reads as a style tag (rich.markup.escape)


def _named_only(args: list[str]) -> typer.Typer:
    """`app`, or, when `args` name one of its commands or groups right after the root's own
    --verbose, an app of that one alone: Typer reads the signature of every command it builds,
    and building all of them took 15-30 ms of every start-up for a command that runs one. The
    root's help, --version, an unknown name (its "did you mean") and no command get all."""
    name = next((arg for arg in args if arg not in ("-v", "--verbose")), None)
    if name is None or name.startswith("-"):
        return app
    commands = [c for c in app.registered_commands
                if (c.name or typer.main.get_command_name(c.callback.__name__)) == name]
    groups = [g for g in app.registered_groups if g.name == name]
    if not commands and not groups:
        return app
    alone = copy.copy(app)
    alone.registered_commands, alone.registered_groups = commands, groups
    return alone


def command_tree(args: list[str] | None = None):
    """`app` as the Click command Typer builds (only the command `args` name, see `_named_only`),
    with every help text escaped as Rich markup.

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

    tree = typer.main.get_command(app if args is None else _named_only(args))
    whole(tree)
    return tree


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; the single place that turns errors into exit codes and one-line messages."""
    args = sys.argv[1:] if argv is None else argv
    try:
        code = command_tree(args)(args=args, prog_name="slurmgen", standalone_mode=False)
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
        sys.exit(INTERRUPTED)
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
