"""The doctor's table: one row per node, one column per check, a mark in every cell."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from slurmgen.doctor.compare import BAD, OK, Comparison

_STYLE = {OK: ("✓", "green"), BAD: ("✗", "bold red"), "n/a": ("", "dim")}


def table(verdict: Comparison) -> Table:
    out = Table("node", *verdict.checks, box=None, header_style="bold")
    for node in verdict.nodes:
        cells = []
        for check in verdict.checks:
            mark = verdict.marks[node][check]
            sign, style = _STYLE[mark.state]
            cells.append(Text(f"{sign} {mark.text}".strip(), style=style))
        out.add_row(node, *cells)
    return out
