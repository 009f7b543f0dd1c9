"""Command-line flags declared on the dataclass fields they fill: help, form, choices and default once.

`TrainConfig` and `LaunchFlags` declare a knob as `x_y: int = flag(8, "help", type=count(1))`;
the CLI turns every such field into flag `--x-y` (`add_flag`). The default --help shows is the
dataclass default, the choices argparse enforces are the tuple `validate()` checks, and a new
knob is one line next to the field it fills, where it cannot drift from a second list.

A default may come from the environment (`env=from_env(name)`): a launcher that exports
SLURMGEN_BACKEND sets the default of --backend, and a flag on the command line still wins.
Only argparse, no torch: this runs on every rank before the heavy imports.
"""

from __future__ import annotations

import argparse
from dataclasses import Field, dataclass, field
from typing import Any, Callable, Mapping, Sequence

FLAG = "slurmgen.flag"  # the key of a field's metadata that makes it a flag


@dataclass(frozen=True)
class Flag:
    """How one field is given on the command line."""

    help: str
    type: Callable[[str], Any] | None = None  # parses (and bounds) the text; None: a string
    choices: Sequence[str] | None = None
    metavar: str | None = None
    action: str | None = None  # "store_true", or "on_off" for a --x/--no-x pair
    env: Callable[[Mapping[str, str]], Any] | None = None  # environment -> default (None: the field's)


def flag(default: Any, help: str, **spec: Any) -> Any:
    """A dataclass field with `default` that is also a command-line flag (see `Flag`)."""
    return field(default=default, metadata={FLAG: Flag(help, **spec)})


def add_flag(group: Any, f: Field, environ: Mapping[str, str]) -> None:
    """Add field `f` as flag --x-y to an argparse group, its default from `environ` if it says so."""
    spec: Flag = f.metadata[FLAG]
    default = spec.env(environ) if spec.env else None
    kwargs: dict[str, Any] = {"default": f.default if default is None else default, "help": spec.help}
    if spec.action:
        kwargs["action"] = argparse.BooleanOptionalAction if spec.action == "on_off" else spec.action
    kwargs.update({k: v for k, v in (("type", spec.type), ("choices", spec.choices), ("metavar", spec.metavar)) if v})
    group.add_argument("--" + f.name.replace("_", "-"), **kwargs)


def from_env(name: str, parse: Callable[[str], Any] = str) -> Callable[[Mapping[str, str]], Any]:
    """A default read from environment variable `name`, through `parse`; unset or empty: none."""

    def default(environ: Mapping[str, str]) -> Any:
        value = environ.get(name)
        return parse(value) if value else None

    return default


def count(low: int) -> Callable[[str], int]:
    """The `type` of an integer flag of at least `low`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def number(low: float) -> Callable[[str], float]:
    """The `type` of a real-valued flag of at least `low` (NaN is refused: it is not >= low)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value >= low:
            raise argparse.ArgumentTypeError(f"must be at least {low:g}, got {text}")
        return value

    return parse


def truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def either(choices: Sequence[str]) -> str:
    """`a, b or c`: choices in a sentence."""
    return f"{', '.join(choices[:-1])} or {choices[-1]}" if len(choices) > 1 else "".join(choices)
