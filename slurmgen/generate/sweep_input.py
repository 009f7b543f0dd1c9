"""Sweeps as users hand them over: `--sweep KEY=V1,V2` flags and `--sweep-file` JSON Lines.

One clear `SlurmgenError` line per problem (field, value, expected form); the grid they become
is `contract.grid`'s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurmgen.contract.grid import KEY
from slurmgen.errors import SlurmgenError


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
        except json.JSONDecodeError as exc:
            raise SlurmgenError(f"sweep_file: {path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not row:
            raise SlurmgenError(
                f"sweep_file: {path}:{number}: expected a JSON object of parameters (got {line.strip()[:60]!r})"
            )
        rows.append(row)
    if not rows:
        raise SlurmgenError(f"sweep_file: {path} holds no points")
    return rows
