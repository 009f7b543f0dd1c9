"""The sweep grid: parameters -> one row per Slurm array task. Pure, and part of the contract:
the spec validates it, the renderer writes it, run records read their row back.

Row N of `points(spec)` is what array task N runs with; `task_words` turns a row into the
words appended to the command (`--key value` by default, or any per-parameter template such
as `{key}={value}` for Hydra-style overrides). Words are substituted one by one, never
re-split, so a value with spaces or quotes reaches the program as one argument.

The command itself may name `{task}` (the array task's index) and `{sweep.KEY}` (its value of
parameter KEY), e.g. `--out-dir runs/x/{task}`: `fill` gives each task its own words, so tasks
need not share an output directory. Filled at render time, each word then quoted whole.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

Scalar = str | int | float | bool
SWEEP_FILE = "sweep.jsonl"
DEFAULT_ARGS = "--{key} {value}"
KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
# `{task}` or `{sweep.KEY}` inside a word of the command.
PLACEHOLDER = re.compile(r"\{(task|sweep\.([^{}]*))\}")
LIMIT = re.compile(r"^%([1-9][0-9]*)$")
# sbatch's --array grammar: indices, ranges with an optional :step, and one %limit at the end.
ARRAY = re.compile(r"^[0-9]+(-[0-9]+(:[0-9]+)?)?(,[0-9]+(-[0-9]+(:[0-9]+)?)?)*(%[1-9][0-9]*)?$")


def points(sweep: Mapping[str, Sequence[Scalar]] | Sequence[Mapping[str, Scalar]] | None) -> list[dict[str, Scalar]]:
    """A grid mapping expands to its cartesian product (first key varies slowest); a list is kept."""
    if not sweep:
        return []
    if isinstance(sweep, Mapping):
        keys = list(sweep)
        return [dict(zip(keys, combo)) for combo in itertools.product(*(sweep[k] for k in keys))]
    return [dict(p) for p in sweep]


def _text(value: Scalar) -> str:
    """A value as the program reads it: true/false for booleans, as written otherwise."""
    return json.dumps(value) if isinstance(value, bool) else str(value)


def task_words(point: Mapping[str, Scalar], template: str = DEFAULT_ARGS) -> list[str]:
    """The command-line words of one point: the template applied to each parameter in order."""
    out: list[str] = []
    for key, value in point.items():
        out += [w.replace("{key}", key).replace("{value}", _text(value)) for w in template.split()]
    return out


def has_placeholders(command: Sequence[str]) -> bool:
    return any(PLACEHOLDER.search(word) for word in command)


def fill(command: Sequence[str], point: Mapping[str, Scalar], task: int) -> list[str]:
    """The command of array task `task`: each `{task}` and `{sweep.KEY}` replaced by its value
    (in one pass: a value that holds a placeholder is not filled again)."""

    def value(m: re.Match[str]) -> str:
        return str(task) if m.group(2) is None else _text(point[m.group(2)])

    return [PLACEHOLDER.sub(value, word) for word in command]


def placeholder_problem(command: Sequence[str], rows: Sequence[Mapping[str, Scalar]]) -> str | None:
    """Why `command`'s placeholders cannot be filled for `rows` (the sweep's points), or None."""
    found = [m for word in command for m in PLACEHOLDER.finditer(word)]
    if found and not rows:
        return (
            f"command: {found[0].group(0)} is filled per task of a sweep, and this job has no sweep "
            "(give --sweep or --sweep-file, or read SLURM_ARRAY_TASK_ID in the program)"
        )
    for m in found:
        missing = [i for i, row in enumerate(rows) if m.group(2) is not None and m.group(2) not in row]
        if missing:
            names = ", ".join(dict.fromkeys(k for row in rows for k in row))
            return (
                f"command: {m.group(0)} names no parameter of sweep point {missing[0]} "
                f"(expected {{task}} or {{sweep.KEY}} with KEY one of: {names})"
            )
    return None


def array_option(n_points: int, array: str | None) -> str:
    """`--array` for a sweep of n points: 0-(n-1), with the %limit given in `array` if any."""
    return f"0-{n_points - 1}" + (array or "")


def grid_jsonl(rows: Sequence[Mapping[str, Scalar]]) -> str:
    """The grid file written beside the script: line N = the parameters of array task N."""
    return "".join(json.dumps({"task": i, "params": dict(row)}) + "\n" for i, row in enumerate(rows))


def parse_grid(text: str) -> dict[int, dict[str, Any]]:
    """The grid file's rows back (task -> parameters); a line that is not one of ours is skipped."""
    rows: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        try:
            row = json.loads(line)
            task, params = int(row["task"]), row["params"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(params, dict):
            rows[task] = params
    return rows
