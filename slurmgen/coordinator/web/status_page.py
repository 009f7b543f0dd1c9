"""status.html: a group's final state, rank table, causes and curves in one static file
next to its run records, so the record of an attempt outlives the server.

`watch(app)` adds a task to the app's lifespan that notices each attempt that ended
(succeeded, failed, stopped) and writes the file once; `chart` turns curves into inline SVG
(no script, no other file), which the template draws with everything escaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from slurmgen.contract.states import ENDED_WORDS
from slurmgen.coordinator.group_runs import run_key
from slurmgen.errors import SlurmgenError
from slurmgen.runs import model as run_model
from slurmgen.runs.registry import Registry
from slurmgen.tracking.store import write_text_atomic

from . import api, attempt_records, views
from .render import environment
from .runs_page import registry_path
from .timeline_svg import time_report

POLL_SECONDS = 1.0
WIDTH, HEIGHT, PAD = 560, 200, 36
COLOURS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")
log = logging.getLogger(__name__)


def chart(curves: Mapping[str, tuple[list[int], list[float]]]) -> dict[str, Any]:
    """Polylines in a WIDTH x HEIGHT box for one metric's series (label -> (steps, values))."""
    xs = [x for steps, _ in curves.values() for x in steps]
    ys = [y for _, values in curves.values() for y in values]
    if not xs:
        return {"lines": [], "width": WIDTH, "height": HEIGHT}
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    sx = (WIDTH - 2 * PAD) / ((x1 - x0) or 1)
    sy = (HEIGHT - 2 * PAD) / ((y1 - y0) or 1)
    lines = []
    for i, (label, (steps, values)) in enumerate(curves.items()):
        points = " ".join(
            f"{PAD + (x - x0) * sx:.1f},{HEIGHT - PAD - (y - y0) * sy:.1f}" for x, y in zip(steps, values)
        )
        lines.append({"label": label, "points": points, "colour": COLOURS[i % len(COLOURS)]})
    return {
        "lines": lines,
        "width": WIDTH,
        "height": HEIGHT,
        "pad": PAD,
        "x_range": (x0, x1),
        "y_range": (f"{y0:.4g}", f"{y1:.4g}"),
    }


def render_status(
    detail: Mapping[str, Any],
    ranks: list[Mapping[str, Any]],
    curves: Mapping[str, Any],
    time_view: Mapping[str, Any] | None = None,
) -> str:
    """The file; `time_view` is observe/report.analyse's (timeline, stragglers, goodput) when the
    group's ranks wrote a timeline, drawn by the run page's own block (time_report.html)."""
    group = detail["group"]
    by_worker = {w["name"]: w for w in detail["workers"]}
    return environment.get_template("status.html").render(
        group=group,
        state=views.group_view(group, list(by_worker))["state"],
        rows=views.rank_rows(ranks, by_worker),
        attempts=views.attempts_view(detail["attempts"]),
        charts={metric: chart(series) for metric, series in curves.items()},
        written=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        report=time_report(time_view or {}),
    )


def group_time(registry: Path | None, group: Mapping[str, Any]) -> dict[str, Any]:
    """The time report of the group's run that just ended (GROUP.N: group_runs.run_key of its
    current attempt) as that run's page gives it (runs/model.time_report): the run's timeline file
    read with its attempts, so a hung rank's peers, which only waited for it, are judged up to its
    last beat and named no stragglers; {} without such a run (or registry) or a timeline file."""
    if not group.get("attempt"):
        return {}
    key = run_key(group["name"], group["attempt"], group.get("restarts") or 0)
    try:
        with Registry.open(registry) as reg:
            seq = run_model.find_run(reg, "group", key)
            row = run_model.get_row(reg, seq) if seq is not None else None
            timeline = row["info"].get("timeline") if row is not None else None
            return run_model.time_report(reg, row["seq"], timeline, time.time()) if row and timeline else {}
    except SlurmgenError:  # no registry here: the coordinator records no runs
        return {}


async def write_for(app: FastAPI, name: str) -> Path:
    detail = await api.get(app, f"/api/groups/{name}")
    reply = await api.call(app, "GET", f"/api/groups/{name}/ranks")
    root = attempt_records.search_root(detail["group"]["config"])

    def write() -> Path:
        runs = attempt_records.attempt_runs(attempt_records.current_attempt(detail))
        state_dir = app.state.coordinator.store.path.parent
        target = attempt_records.status_dir(name, root, runs, state_dir) / "status.html"
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(
            target,
            render_status(
                detail,
                reply.body if reply.ok else [],
                attempt_records.curves_of(runs),
                group_time(registry_path(app), detail["group"]),
            ),
        )
        return target

    return await asyncio.to_thread(write)


async def _watch_loop(app: FastAPI) -> None:
    done: set[tuple[str, int]] = set()
    while True:
        await asyncio.sleep(POLL_SECONDS)
        try:
            for g in await api.get(app, "/api/groups"):
                key = (g["name"], g.get("attempt") or 0)
                if g["state"] in ENDED_WORDS and key[1] and key not in done:
                    done.add(key)
                    log.info("wrote %s", await write_for(app, g["name"]))
        except Exception:  # the page's extra must never take the coordinator down
            log.exception("status.html: could not write")


def watch(app: FastAPI) -> None:
    """Run the status.html writer for as long as the app's lifespan (around the app's own)."""
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: FastAPI):
        async with inner(a) as state:
            task = asyncio.create_task(_watch_loop(a))
            try:
                yield state
            finally:
                task.cancel()

    app.router.lifespan_context = lifespan
