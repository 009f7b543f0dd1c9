"""`slurmgen runs` and `slurmgen plot`: the run records under a directory, as a table or curves.

The only module of this package that needs typer and the CLI's error type (`slurmgen.errors`):
the `slurmgen` command line imports it, the trainer and user code never do. The record
readers, Rich and matplotlib are imported inside the commands, when they run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from slurmgen.cliopts import colour
from slurmgen.errors import SlurmgenError

if TYPE_CHECKING:
    from rich.table import Table


def _runs_table(rows: list[dict]) -> Table:
    """The rich table of `slurmgen runs` (the task and params columns only when there is a sweep)."""
    from rich.markup import escape
    from rich.table import Table

    from slurmgen.tracking.records import format_duration

    sweeps = any(row["sweep"] for row in rows)  # the task and params columns only when there is a sweep
    table = Table(
        "name",
        "group",
        *(("task", "params") if sweeps else ()),
        "job type",
        "status",
        "steps",
        "last loss",
        "duration",
        "restarts",
        box=None,
    )
    for row in rows:
        loss = row["last_loss"]
        status = str(row["status"])
        sweep = row["sweep"] or {}
        params = " ".join(f"{k}={v}" for k, v in (sweep.get("params") or {}).items())
        table.add_row(
            str(row["name"]),
            sweep.get("id") or str(row["group"]),
            *((str(sweep.get("task", "")), escape(params)) if sweeps else ()),
            str(row["job_type"]),
            f"[{colour(status) or 'white'}]{status}[/]",
            "-" if row["steps"] is None else str(row["steps"]),
            "-" if not isinstance(loss, (int, float)) else f"{loss:.4g}",
            format_duration(row["duration"]),
            str(row["restarts"] or ""),
        )
    return table


def runs(
    directory: Path = typer.Argument(
        Path("runs"), metavar="[DIR]", help="Where to look for run records (searched recursively)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table."),
) -> None:
    """List the run records under DIR: name, group, status, steps, last loss, duration.

    The tasks of a sweep are listed together as one group (the array job, slurm-<id>), one row per
    task with its parameters; `slurmgen plot slurm-<id>` draws them into one figure."""
    from slurmgen.tracking.records import find_runs, sweeps_together

    if not directory.is_dir():
        raise SlurmgenError(
            f"runs: no such directory: {str(directory)!r}", hint="pass the directory that holds the runs, e.g. runs/"
        )
    damaged: list[str] = []
    found = sweeps_together(list(find_runs(directory, damaged)))
    for problem in damaged:  # what can be read is listed all the same
        typer.echo(f"slurmgen: warning: skipped a damaged run record: {problem}", err=True)
    rows = [
        {
            "id": r.get("id"),
            "name": r.get("name"),
            "group": r.get("group"),
            "job_type": r.get("job_type"),
            "status": r.get("status"),
            "steps": r.steps,
            "last_loss": r.last("loss"),
            "duration": r.duration(),
            "restarts": r.get("restart_count", 0),
            "sweep": r.sweep,
            "dir": str(r.dir),
        }
        for r in found
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo(f"no runs under {directory}")
        return
    from rich.console import Console

    table = _runs_table(rows)
    # Piped or captured: no terminal width to fit, so never cut a group name to fit 80 columns.
    Console(soft_wrap=True, width=None if sys.stdout.isatty() else 400).print(table)


def plot(
    run: str = typer.Argument(
        ..., help="The run: its directory, or its id, name or group under --dir; or a sweep's id."
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="PNG file to write [default: RUN_DIR/metrics.png]."
    ),
    directory: Path = typer.Option(Path("runs"), "--dir", help="Where to look up RUN by id, name, group or sweep."),
    metric: list[str] = typer.Option([], "--metric", "-m", help="Only this metric; repeatable [default: all]."),
) -> None:
    """Draw a run's metric curves (train and val per metric) into a PNG; for a sweep (RUN is its
    id, slurm-<array id>, as `slurmgen runs` shows it) every task's curves in one figure."""
    try:
        import matplotlib  # noqa: F401  (only to say clearly that it is missing)
    except ImportError:
        raise SlurmgenError(
            "plot: needs matplotlib, which is not installed", hint="pip install 'slurmgen[plot]'"
        ) from None
    import os

    from slurmgen.tracking.plot import plot_run, plot_sweep
    from slurmgen.tracking.records import resolve_runs

    damaged: list[str] = []
    try:
        found = resolve_runs(run, directory, damaged)
        if len(found) > 1:  # a sweep's runs
            where = Path(os.path.commonpath([str(r.dir) for r in found]))
            path = plot_sweep(found, output or where / f"{run}.png", metrics=list(metric) or None)
        else:
            path = plot_run(found[0], output or found[0].dir / "metrics.png", metrics=list(metric) or None)
    except (LookupError, ValueError, OSError) as exc:
        raise SlurmgenError(f"plot: {exc}") from None
    finally:
        for problem in damaged:
            typer.echo(f"slurmgen: warning: skipped a damaged run record: {problem}", err=True)
    typer.echo(f"wrote {path}")


def register(app: typer.Typer) -> None:
    """Add `runs` and `plot` to the `slurmgen` app."""
    app.command()(runs)
    app.command()(plot)
