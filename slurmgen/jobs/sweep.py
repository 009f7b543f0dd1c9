"""Sweeps: a grid (or a list of points) of parameters -> one row per Slurm array task. Pure.

Row N of `points(spec)` is what array task N runs with; `task_words` turns a row into the
words appended to the command (`--key value` by default, or any per-parameter template such
as `{key}={value}` for Hydra-style overrides). Words are substituted one by one, never
re-split, so a value with spaces or quotes reaches the program as one argument.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

from slurmgen.errors import SlurmgenError

Scalar = Union[str, int, float, bool]
SWEEP_FILE = "sweep.jsonl"
DEFAULT_ARGS = "--{key} {value}"
KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
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


def task_words(point: Mapping[str, Scalar], template: str = DEFAULT_ARGS) -> list[str]:
    """The command-line words of one point: the template applied to each parameter in order."""
    out: list[str] = []
    for key, value in point.items():
        text = json.dumps(value) if isinstance(value, bool) else str(value)
        out += [w.replace("{key}", key).replace("{value}", text) for w in template.split()]
    return out


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


def parse_flag(values: Sequence[str]) -> dict[str, list[str]]:
    """`--sweep lr=1e-3,3e-4` (repeatable) -> {"lr": ["1e-3", "3e-4"]}."""
    grid: dict[str, list[str]] = {}
    for item in values:
        key, sep, rest = item.partition("=")
        choices = [v for v in rest.split(",")] if sep else []
        if not sep or not KEY.match(key) or not rest or "" in choices:
            raise SlurmgenError(f"sweep: expected KEY=V1,V2,... with a name like lr or model.depth (got {item!r})")
        if key in grid:
            raise SlurmgenError(f"sweep: {key} is given twice (got {item!r})")
        grid[key] = choices
    return grid


def read_file(path: Path) -> list[dict[str, Any]]:
    """`--sweep-file params.jsonl`: one JSON object per line, each a point (blank lines skipped)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise SlurmgenError(f"sweep_file: cannot read {str(path)!r}: {exc.strerror}") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise SlurmgenError(f"sweep_file: {path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not row:
            raise SlurmgenError(f"sweep_file: {path}:{number}: expected a JSON object of parameters (got {line.strip()[:60]!r})")
        rows.append(row)
    if not rows:
        raise SlurmgenError(f"sweep_file: {path} holds no points")
    return rows
