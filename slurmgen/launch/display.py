"""What `slurmgen launch` shows: prefixed node output and the summary. Pure.

Every line a node sends on its output stream is shown as `[host/RANK] text` (rank output,
which the node script prefixes `[rank R] `) or `[host] text` (the node's own messages), in
one colour per host on a terminal. Nothing shown here is interpreted: node events arrive on
their own channel (contract/node_events.py). A progress bar's line is shown as its last state
(runs/log_lines.py): its "\r" would otherwise carry the terminal back over the tag.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

from slurmgen.runs.log_lines import shown

RANK_LINE = re.compile(r"^\[rank (\d+)\] ?(.*)$", re.DOTALL)
_OWN_PREFIX = re.compile(r"^(launch_multi_node\.sh|slurmgen-launch): ")
# Distinct, readable on dark and light terminals.
COLOURS = (36, 33, 35, 32, 34, 91, 96, 93, 95, 92, 94)


class Prefixer:
    """Turns node lines into display lines."""

    def __init__(self, hosts: list[str], colour: bool):
        self.colour = colour
        self.codes = {h: COLOURS[i % len(COLOURS)] for i, h in enumerate(hosts)}

    def _tag(self, host: str, rank: str | None) -> str:
        tag = f"[{host}/{rank}]" if rank is not None else f"[{host}]"
        return f"\x1b[{self.codes.get(host, 0)}m{tag}\x1b[0m" if self.colour else tag

    def format(self, host: str, line: str) -> str:
        m = RANK_LINE.match(line)
        if m:
            return f"{self._tag(host, m.group(1))} {shown(m.group(2))}"
        return f"{self._tag(host, None)} {shown(_OWN_PREFIX.sub('', line))}"


# A node's own line in the launch's log (log_line), which the page shows under the node's name.
NODE_LINE = re.compile(r"^\[([^\]\s]+)\] (.*)$", re.DOTALL)


def log_line(host: str, line: str) -> str:
    """A node line as the launch's log on the page keeps it: a rank's as srun --label writes it
    (`3: text`, which jobs/logs.py splits by rank), the node's own as `[host] text` (NODE_LINE)."""
    m = RANK_LINE.match(line)
    return f"{m.group(1)}: {m.group(2)}" if m else f"[{host}] {_OWN_PREFIX.sub('', line)}"


class LineSplitter:
    """Bytes in, complete text lines out (a trailing partial line waits for more)."""

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, data: bytes) -> list[str]:
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        return [ln.decode(errors="replace").rstrip("\r") for ln in lines]

    def flush(self) -> list[str]:
        rest, self.buffer = self.buffer, b""
        return [rest.decode(errors="replace").rstrip("\r")] if rest else []


@dataclass(frozen=True)
class NodeResult:
    """One node's outcome in the last attempt, as the summary shows it."""

    host: str
    node_rank: int
    ranks: str
    state: str = "not started"  # running, ok, failed, hung, stopped, lost, error
    code: int | None = None
    started: float | None = None
    ended: float | None = None
    note: str = ""

    @property
    def duration(self) -> str:
        if self.started is None or self.ended is None:
            return "-"
        return f"{self.ended - self.started:.1f}s"


def summary_table(results: list[NodeResult], attempt: int, attempts: int, verdict: str, colour: bool) -> str:
    """The table printed when the launch ends (rendered by rich, which comes with typer)."""
    from rich.console import Console
    from rich.table import Table

    title = f"slurmgen launch: {verdict}" + (f" (attempt {attempt} of {attempts})" if attempts > 1 else "")
    table = Table(
        "host",
        "node",
        "ranks",
        "state",
        "exit code",
        "duration",
        "note",
        title=title,
        title_justify="left",
        box=None,
        pad_edge=False,
    )
    for r in results:
        style = {
            "ok": "green",
            "failed": "bold red",
            "hung": "bold red",
            "lost": "bold red",
            "error": "bold red",
            "stopped": "yellow",
        }.get(r.state, "")
        table.add_row(
            r.host,
            str(r.node_rank),
            r.ranks,
            f"[{style}]{r.state}[/]" if style else r.state,
            "-" if r.code is None else str(r.code),
            r.duration,
            r.note,
        )
    out = io.StringIO()
    Console(file=out, force_terminal=colour, no_color=not colour, width=200, soft_wrap=True).print(table)
    return out.getvalue()
