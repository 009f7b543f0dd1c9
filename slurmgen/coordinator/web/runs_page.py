"""The runs list (/ui/runs): every run of the serving machine's registry (runs/model.py), whatever
started it: Slurm jobs (`submit`), SSH launches (`launch`) and this server's groups, newest first.

The registry answers in one SELECT (runs.list_rows); the page shows each run as its launcher last
recorded it, but for a Slurm job not known to have ended: before the SELECT every such job of the
registry is refreshed from Slurm (jobs/refresh.py: one batched query per login node, at most every
few seconds, waited for at most a second, so a controller that is down never holds the page), and
a state no refresh could renew is shown with its age ("running, as of 2 min ago").
Filters are query parameters (`state`, `kind`, each repeatable), rendered by the server; the
page's script refreshes it the way it refreshes the groups (live.py): a JSON snapshot with a
`shape` (the page is redrawn when the rows change) and live values (elapsed time).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from slurmgen.contract.states import ENDED_WORDS, RUN_STATES, State, shown
from slurmgen.errors import SlurmgenError
from slurmgen.jobs.refresh import Refresher, stale_for
from slurmgen.runs import outcome as run_outcome
from slurmgen.runs.model import KINDS, RunRow, chain_label, check_kinds, check_states, count_rows, list_rows, size
from slurmgen.runs.registry import Registry

from .auth import guarded
from .render import render
from .run_records import last_loss
from .views import clock, digest

router = APIRouter()
# Rows a page of the list shows, newest first; older ones are on the next pages (`slurmgen jobs`
# lists them all). 1,000 rows took 0.6 s to render on two busy cores (benchmarks/bench_page.py);
# a page of 100 stays well within the 200 ms the list is allowed.
PAGE = 100


def registry_path(app: Any) -> Any:
    """The registry `slurmgen serve --registry` records groups into (None: the default one)."""
    runs = getattr(app.state.coordinator, "runs", None)
    return runs.recorder.path if runs is not None else None


def _runners() -> Any:
    from slurmgen.jobs.cli_shared import Runners

    return Runners(None, [])


# One per server process: the page's polls of every open tab share its refreshes.
REFRESHER = Refresher(_runners)


def ago(seconds: float) -> str:
    """ "45 s ago", "2 min ago", "3 h ago": how old a state is."""
    s = int(seconds)
    return f"{s} s ago" if s < 60 else f"{s // 60} min ago" if s < 3600 else f"{s // 3600} h ago"


def elapsed(started: float | None, ended: float | None, now: float) -> str:
    """ "1 h 02 min", "3 min 05 s", "12 s": how long the run ran (ran so far, if not ended)."""
    if started is None:
        return "—"
    seconds = int(max(0.0, (ended if ended is not None else now) - started))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def run_elapsed(r: RunRow, now: float, unknown_end: bool) -> str:
    """How long the run ran; a Slurm job with a time limit: its current attempt's time beside the
    limit, which is per attempt ("12 min 05 s / 1 h 00 min"): the run's own, from its submission,
    counts the queue and every attempt, and would be held to one attempt's limit."""
    from slurmgen.generate.slurm_values import time_limit_seconds

    if unknown_end:
        return "—"
    limit = (r.get("info") or {}).get("time_limit")
    try:
        seconds = time_limit_seconds(limit) if limit else None
    except ValueError:
        seconds = None
    began = r.get("attempt_started")
    if seconds and began is not None:
        return f"{elapsed(began, r.get('ended'), now)} / {elapsed(0, seconds, 0)}"
    return elapsed(r.get("started"), r.get("ended"), now)


def outcome(r: RunRow) -> str:
    """The row's "Exit / first failure" cell, by the one rule (runs/outcome.py): a person's stop
    reads "stopped by you", its code beside it, not as a failure."""
    return run_outcome.outcome(r.get("state") or r.get("last_state"), r.get("last_exit"), r.get("failure"))


# A run's row that will not change: one that ended, or a launch whose launcher is gone (lost: jobs/listing.py).
ENDED = ENDED_WORDS | {State.LOST.value}


def run_view(r: RunRow, now: float) -> dict[str, Any]:
    """A row as the list shows it. A run that ended without an end time (a Slurm job: the registry
    keeps the state Slurm last gave, not when it ended) shows no elapsed time rather than a growing one."""
    state = r.get("state") or r.get("last_state") or "unknown"
    unknown_end = r.get("ended") is None and state in ENDED
    stale = stale_for(dict(r), now)
    return {
        "seq": r["seq"],
        "kind": r["kind"],
        "key": r["job_id"],
        "name": r["name"] + (f" ({label})" if (label := chain_label(r.get("info") or {})) else ""),
        "state": state,
        "state_text": shown(state),  # as people read it: a stop on request is "stopped by you"
        "as_of": ago(stale) if stale is not None else None,  # Slurm's word not renewed: how old it is
        "shape": size(r["nodes"], r["ranks"]) or "—",
        "started": clock(r.get("started")) or "—",
        "elapsed": run_elapsed(r, now, unknown_end),
        # A running job is on its first attempt at least, whether or not Slurm's count was kept yet.
        "attempts": max(r.get("attempts") or 0, 1 if state == State.RUNNING.value else 0),
        "outcome": outcome(r),
        "ended": r.get("ended") is not None,
    }


def read_runs(
    path: Any, kinds: list[str], states: list[str], page: int = 1
) -> tuple[list[RunRow], dict[str, int], str | None]:
    """(rows of the page, {"total", "active"}, None), or ([], zeros, why) when the registry
    cannot be read (none yet: an empty list)."""
    try:
        with Registry.open(path) as reg:
            total, active = count_rows(reg, kinds, states)
            return (
                list_rows(reg, kinds, states, PAGE, offset=(page - 1) * PAGE),
                {"total": total, "active": active},
                None,
            )
    except SlurmgenError as exc:
        return [], {"total": 0, "active": 0}, str(exc)


def shape(rows: list[dict[str, Any]]) -> str:
    """Changes when a row appears, goes, or changes state, attempts or outcome: then the page is redrawn."""
    return digest(f"{r['seq']} {r['state']} {r['as_of'] is not None} {r['attempts']} {r['outcome']}" for r in rows)


def filters(request: Request) -> tuple[list[str], list[str], str | None]:
    """The `kind` and `state` query parameters, checked (a bad one is shown, the filter ignored)."""
    q = request.query_params
    kinds, states = [k for k in q.getlist("kind") if k], [s for s in q.getlist("state") if s]
    try:
        return check_kinds(kinds), check_states(states), None
    except SlurmgenError as exc:
        return [], [], str(exc)


def page_of(request: Request) -> int:
    """The `page` query parameter (1 when missing or not a number from 1)."""
    text = request.query_params.get("page", "1")
    return int(text) if text.isdigit() and int(text) >= 1 else 1


def pager(request: Request, page: int, counts: dict[str, int]) -> dict[str, Any]:
    """ "Runs 101-200 of 1,001" and the links to the newer and older pages (the filter kept)."""

    def link(n: int) -> str:
        return str(request.url.include_query_params(page=n).query)

    first = (page - 1) * PAGE + 1
    last = min(counts["total"], page * PAGE)
    return {
        "first": first,
        "last": last,
        **counts,
        "newer": link(page - 1) if page > 1 else None,
        "older": link(page + 1) if last < counts["total"] else None,
    }


async def runs_data(request: Request) -> dict[str, Any]:
    kinds, states, bad = filters(request)
    page = page_of(request)
    slurm_notes = await asyncio.to_thread(REFRESHER.refresh, registry_path(request.app))
    rows, counts, error = await asyncio.to_thread(read_runs, registry_path(request.app), kinds, states, page)
    now = time.time()
    losses = await asyncio.to_thread(lambda: [last_loss(r) for r in rows])  # files: off the event loop
    views = [{**run_view(r, now), "loss": loss} for r, loss in zip(rows, losses)]
    return {
        "runs": views,
        "shape": shape(views),
        "kinds": kinds,
        "states": states,
        "error": bad or error,
        "slurm_notes": slurm_notes,
        "all_kinds": KINDS,
        "all_states": [s.value for s in RUN_STATES],
        "query": str(request.url.query),
        "pager": pager(request, page, counts),
    }


@router.get("/ui/runs", name="web_runs")
@guarded("page")
async def runs_page(request: Request) -> Response:
    return render(request, "runs.html", await runs_data(request))


@router.get("/ui/live/runs", name="web_live_runs")
@guarded("live")
async def live_runs(request: Request) -> Response:
    data = await runs_data(request)
    fields = [[["r", r["seq"], key], r[key], ""] for r in data["runs"] for key in ("elapsed", "loss")]
    return JSONResponse(
        {"shape": data["shape"], "fields": fields, "count": len(data["runs"])}, headers={"cache-control": "no-store"}
    )
