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

import importlib
import re
import sys
from collections.abc import Collection

import typer

from slurmgen import __version__
from slurmgen.contract.exitcodes import INTERRUPTED
from slurmgen.errors import SlurmgenError

_state = {"verbose": False}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"slurmgen {__version__}")
        raise typer.Exit()


def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks for errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    _state["verbose"] = verbose


# Each package's commands in the order `slurmgen --help` lists them (make the scripts, run, look at
# runs; then Slurm's jobs, the preflight check and the coordinator): the module that owns them, its
# function that adds them to the app, and their names, so that a command starts with its own
# package's module alone (the others, tracking and the coordinator's above all, were ~25 ms of
# every start-up). A test keeps the names equal to what each function adds.
PACKAGES = (
    ("slurmgen.generate.cli", "register", ("create", "ranks")),
    ("slurmgen.launch.cli", "register", ("launch",)),
    ("slurmgen.train.command", "register", ("train",)),
    ("slurmgen.train.checkpoint.command", "register", ("ckpt",)),
    ("slurmgen.tracking.cli", "register", ("runs", "plot")),
    ("slurmgen.generate.cli", "register_schema", ("schema",)),
    ("slurmgen.jobs.cli", "register", ("submit", "jobs", "status", "logs", "cancel")),
    ("slurmgen.doctor.cli", "register", ("doctor",)),
    ("slurmgen.coordinator.cli", "register", ("serve", "agent", "workers", "group")),
)


def build_app(only: str | None = None) -> typer.Typer:
    """The `slurmgen` app: every command, or only the command or group named `only`."""
    built = typer.Typer(
        name="slurmgen",
        help="Multi-node PyTorch launching made boring and correct: "
        "sbatch scripts, a bare-metal launcher, a rank table.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    built.callback()(_root)
    for module, register, names in PACKAGES:
        if only is None or only in names:
            getattr(importlib.import_module(module), register)(built)
    if only is not None:
        built.registered_commands = [c for c in built.registered_commands if _name(c) == only]
        built.registered_groups = [g for g in built.registered_groups if g.name == only]
    return built


def _name(command: typer.models.CommandInfo) -> str:
    if command.name:
        return command.name
    assert command.callback is not None  # for type checkers: every registered command has its function
    return typer.main.get_command_name(command.callback.__name__)


def __getattr__(name: str) -> typer.Typer:
    """`app`, the whole command line (the docs and tests walk it), built when first asked for:
    `main` builds only the command it runs."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()["app"] = whole = build_app()
    return whole


_RICH_TAG = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")  # what Rich reads as a style tag (rich.markup.escape)


def named_command(args: Collection[str]) -> str | None:
    """The command or group `args` run, when they name one right after the root's own --verbose:
    then it alone is built (Typer reads the signature of every command it builds: all of them took
    15-30 ms of every start-up). None for the root's help, --version, no command or an unknown
    name (whose "did you mean" needs them all)."""
    name = next((arg for arg in args if arg not in ("-v", "--verbose")), None)
    known = {n for _, _, names in PACKAGES for n in names}
    return name if name in known else None


def command_tree(args: Collection[str] | None = None):
    """The Click command Typer builds: the whole app, or for `args` only the command they run
    (`named_command`), with every help text escaped as Rich markup.

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

    only = None if args is None else named_command(args)
    tree = typer.main.get_command(build_app(only) if only else sys.modules[__name__].app)
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
