"""Where a run's time went, shaped for the page and status.html: the per-rank timeline as SVG
geometry, the straggler flags and the goodput figure with its breakdown (pure).

The figures are observe/'s (`slurmgen status --timeline --json` prints the same dict); this
module only places them: one bar per rank, a coloured segment per phase (from the allocation's
start to the process start, imports, rendezvous, first step, then training up to the end), the
checkpoint stalls over it, and the rank each phase waited for named beside the chart. The
template (templates/time_report.html) draws the shapes as inline SVG with every name escaped by
Jinja: no script, no library, so the same block works in a static status.html.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from slurmgen.contract import exitcodes, phases
from slurmgen.contract.attempts import attempt_number
from slurmgen.contract.states import HEARTBEAT_WORD, STOPPED_BY_YOU, State, stopped_after
from slurmgen.observe.goodput import HUNG_PART, LOST_PART

WIDTH, LABEL, RIGHT, TOP, ROW = 900, 120, 24, 34, 18
BAR = 12
# A segment is named by the phase that ends it: "imports" is the time from the process start
# to the imports being done. Before the process start: what the launcher did (Slurm's prolog,
# srun, torchrun, ssh).
SEGMENT = {
    phases.PROCESS: "launch",
    phases.IMPORTS: "imports",
    phases.RENDEZVOUS: "rendezvous",
    phases.FIRST_STEP: "first step",
    phases.END: "training",
}
# ...but a rank that took no step (a program that is not a trainer: no heartbeat, `sleep`, a
# probe) ran from its start to its end; it did not train (segment_name).
RAN = "running"
# Every colour at least 3:1 against the white it is drawn on (WCAG's for graphics; a unit test
# holds it): the 400/500 shades these were (#22c55e green 2.3:1, #f59e0b amber 2.2:1) are not.
COLOUR = {
    "launch": "#64748b",
    "imports": "#d97706",
    "rendezvous": "#8b5cf6",
    "first step": "#0284c7",
    "training": "#16a34a",
    RAN: "#0f766e",
    "hung": "#dc2626",  # a hung rank from its last beat to its end: no training (goodput's "hung")
    "checkpoint": "#1e293b",
}
GOODPUT_PARTS = ("productive", "startup", "checkpoint", LOST_PART, HUNG_PART, "restart", "other")
GOODPUT_COLOUR = {
    "productive": "#16a34a",
    "startup": "#d97706",
    "checkpoint": "#1e293b",
    "lost": "#dc2626",
    "hung": "#b91c1c",
    "restart": "#8b5cf6",
    "other": "#64748b",
}


def _ticks(span: float, width: float) -> list[tuple[float, str]]:
    """(x, label) of round tick values over 0..span seconds, about one per 90 px."""
    raw = span / max(1.0, width / 90)
    unit = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * unit for m in (1, 2, 5, 10) if m * unit >= raw)
    count = int(span / step + 1e-9)
    return [(i * step * width / span, f"{i * step:g}") for i in range(count + 1)]


def segment_name(phase: str, rank: Mapping[str, Any]) -> str:
    """The segment a phase ends for this rank (SEGMENT): up to its end, "training" once it took a
    first step, else RAN."""
    if phase == phases.END and rank.get(phases.FIRST_STEP) is None:
        return RAN
    return SEGMENT[phase]


def _segments(rank: Mapping[str, Any], open_end: float | None, hung: bool = False) -> list[dict[str, Any]]:
    """A rank's phases as [{"name", "from", "to"}] (seconds); a phase not recorded is skipped and
    the next one starts where the last known one ended. A rank still training runs to `open_end`.
    The hung rank (`hung`) trained until its last beat (`last_at`), then hung until its end."""
    out, last = [], 0.0
    for p in phases.PHASES:
        t = rank.get(p)
        if t is None:
            continue
        out.append({"name": segment_name(p, rank), "from": last, "to": max(last, float(t))})
        last = max(last, float(t))
    if rank.get(phases.END) is None and rank.get(phases.FIRST_STEP) is not None and open_end and open_end > last:
        out.append({"name": "training", "from": last, "to": open_end, "open": True})
    beat = rank.get("last_at")
    if hung and out and out[-1]["name"] == "training" and beat is not None and out[-1]["from"] < beat < out[-1]["to"]:
        out.append({**out[-1], "name": "hung", "from": float(beat)})
        out[-2] = {**out[-2], "to": float(beat), "open": False}
    return out


def _span(attempt: Mapping[str, Any], open_end: float | None) -> float:
    times = [float(r[p]) for r in attempt["ranks"] for p in phases.PHASES if r.get(p) is not None]
    times += [
        float(c["at"]) for r in attempt["ranks"] for c in r.get("checkpoint_list") or [] if c.get("at") is not None
    ]
    return max([1.0, *times, *([open_end] if open_end else [])])


def _rank_row(
    r: Mapping[str, Any], y: float, scale: float, open_end: float | None, flag: bool, slowest: bool, hung: bool = False
) -> dict[str, Any]:
    """One rank's row of the chart: its phase segments, then its checkpoint stalls drawn over them."""
    rects = [
        {
            "x": LABEL + s["from"] * scale,
            "y": y,
            "w": max(1.0, (s["to"] - s["from"]) * scale),
            "h": BAR,
            "colour": COLOUR[s["name"]],
            "title": f"rank {r['rank']} {s['name']}: {s['from']:.2f}-{s['to']:.2f} s"
            + (" (still running)" if s.get("open") else ""),
        }
        for s in _segments(r, open_end, hung)
    ]
    rects += [
        {
            "x": LABEL + max(0.0, c["at"] - c["stall"]) * scale,
            "y": y + 2,
            "w": max(2.0, c["stall"] * scale),
            "h": BAR - 4,
            "colour": COLOUR["checkpoint"],
            "title": f"rank {r['rank']} checkpoint at step {c['step']}: {c['stall']:.2f} s stall",
        }
        for c in r.get("checkpoint_list") or []
        if c.get("at") is not None
    ]
    label = f"rank {r['rank']}" + (f" {r['host']}" if r.get("host") else "")
    return {"label": label, "y": y, "text_y": y + BAR - 2, "flag": flag, "slowest": slowest, "rects": rects}


def attempt_chart(attempt: Mapping[str, Any], flagged: set[int], now: float | None = None) -> dict[str, Any]:
    """One attempt's SVG: {"width", "height", "ticks", "rows": [{"label", "y", "flag", "rects"}],
    "slowest": [{"phase", "rank", "at"}]}; x in pixels, every rect with a title for hovering."""
    start, end = attempt.get("start"), attempt.get("end")
    open_end = (end - start) if end and start else (now - start) if now and start else None
    span = _span(attempt, open_end)
    inner = WIDTH - LABEL - RIGHT
    scale = inner / span
    slow = {v["rank"]: p for p, v in (attempt.get("slowest") or {}).items() if p != phases.END}
    rows = [
        _rank_row(
            r,
            TOP + i * ROW,
            scale,
            open_end,
            r["rank"] in flagged,
            r["rank"] in slow,
            r["rank"] == attempt.get("hung_rank"),
        )
        for i, r in enumerate(attempt["ranks"])
    ]
    height = TOP + max(1, len(rows)) * ROW + 8
    by_rank = {r["rank"]: r for r in attempt["ranks"]}
    return {
        "attempt": attempt.get("attempt"),
        "width": WIDTH,
        "height": height,
        "label_x": LABEL - 6,
        "ticks": [{"x": LABEL + x, "label": text} for x, text in _ticks(span, inner)],
        "rows": rows,
        "axis_y": TOP - 8,
        "bottom": height - 6,
        "queued": attempt.get("queued"),
        "slowest": [
            {"phase": segment_name(p, by_rank.get(v["rank"], {})), "rank": v["rank"], "at": v["at"]}
            for p, v in (attempt.get("slowest") or {}).items()
            if p in SEGMENT
        ],
    }


def goodput_view(g: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The goodput figure, its breakdown as rows (seconds, share of wall) and a stacked bar."""
    if not g:
        return None
    wall = float(g.get("wall") or 0) or 1e-9
    breakdown = g.get("breakdown") or {}
    rows, x = [], 0.0
    lost_steps = sum(int(s.get("steps") or 0) for s in g.get("lost_steps") or [])
    for part in GOODPUT_PARTS:
        seconds = float(breakdown.get(part) or 0)
        share = seconds / wall
        rows.append(
            {
                "part": part,
                "seconds": f"{seconds:.1f}",
                "share": f"{100 * share:.1f}%",
                "colour": GOODPUT_COLOUR[part],
                "x": x,
                "w": share * (WIDTH - 2),
                "note": f"{lost_steps} steps done twice" if part == LOST_PART and lost_steps else "",
            }
        )
        x += share * (WIDTH - 2)
    return {
        "figure": f"{100 * float(g['goodput']):.1f}%",
        "wall": f"{wall:.1f}",
        "rows": rows,
        "width": WIDTH,
        "queue": None if g.get("queue") is None else f"{float(g['queue']):.1f}",
    }


def straggler_rows(found: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "rank": s["rank"],
            "attempt": attempt_number(s),
            "ratio": s["ratio"],
            "steps": s["steps"],
            "range": f"{s['from_step']}-{s['to_step']}",
        }
        for s in found
    ]


def rank_status(r: Mapping[str, Any], live: bool, ended_as: str | None = None) -> str:
    """How a rank ended: its word ("done", "preempted"), a failure's code ("failed (exit 3)"), a
    signal's name when one ended it ("terminated": stopped with the others, "killed by signal 9");
    running while its attempt lasts; "—" when nothing says how it ended. In an attempt a person
    stopped (`ended_as` STOPPED), a rank that did not finish was stopped by them, whatever its code
    (the trainer checkpoints and exits 75 on the stop's TERM): never a failure; in a preempted one,
    a rank's preemption code is its checkpoint on the warning, not the failure the launcher calls
    every non-zero exit."""
    code = r.get("code")
    if ended_as == State.STOPPED and r.get("status") != HEARTBEAT_WORD[State.SUCCEEDED] and code != 0:
        return STOPPED_BY_YOU
    if ended_as == State.PREEMPTED and code == exitcodes.PREEMPTED:
        return HEARTBEAT_WORD[State.PREEMPTED]
    if code is not None and code > 128:
        return exitcodes.describe(code)
    if r.get("status") == HEARTBEAT_WORD[State.FAILED] and code:
        return f"failed (exit {code})"
    return r.get("status") or (State.RUNNING.value if live else "—")


def blamed_status(r: Mapping[str, Any], attempt: Mapping[str, Any]) -> str | None:
    """How a rank of an attempt that failed on one rank's account reads (None: no rank is blamed,
    or the attempt did not fail): the hung rank "hung", the rank that failed first "failed (exit
    N)" (the attempt's code when its own is not recorded), every other "stopped (after rank N)":
    it only waited and was stopped, whatever it died of then."""
    hung, first = attempt.get("hung_rank"), attempt.get("rank")
    code = attempt.get("code")
    blamed = hung if hung is not None else first
    if blamed is None or code in (None, exitcodes.OK, exitcodes.PREEMPTED) or attempt.get("state") == State.STOPPED:
        return None
    if r["rank"] == hung:
        return "hung"
    if r["rank"] == blamed:
        own = r.get("code")
        return f"failed (exit {own if own not in (None, 0) else code})"
    return stopped_after(blamed)


def last_step(r: Mapping[str, Any], attempt: Mapping[str, Any]) -> Any:
    """A rank's last step as the table shows it: the hung rank's, beside the step its verdict
    names when it stepped on after it ("63 (hung at 61)": woken by the watcher to give its stack,
    it steps on until it is killed; the verdict's "stopped beating at step 61" is as true)."""
    step, hung_at = r.get("last_step"), attempt.get("hung_step")
    if step is None:
        return "—"
    if r["rank"] == attempt.get("hung_rank") and isinstance(hung_at, int) and step != hung_at:
        return f"{step} (hung at {hung_at})"
    return step


def rank_rows(attempt: Mapping[str, Any], flagged: set[int], live: bool) -> list[dict[str, Any]]:
    """The rank table of an attempt: each rank's node, how it ended (blamed_status, else
    rank_status), its last step (last_step) and checkpoints."""
    return [
        {
            "rank": r["rank"],
            "node": r.get("host") or "—",
            "status": blamed_status(r, attempt) or rank_status(r, live, attempt.get("state")),
            "last_step": last_step(r, attempt),
            "checkpoints": r.get("checkpoints") or 0,
            "straggler": r["rank"] in flagged,
        }
        for r in attempt["ranks"]
    ]


def time_report(view: Mapping[str, Any], now: float | None = None) -> dict[str, Any] | None:
    """What the page shows of a run's `status` time report (observe/report.analyse: timeline,
    stragglers, step_work, goodput); None when the run recorded no timeline."""
    timeline = view.get("timeline") or {}
    if not timeline.get("attempts") and not view.get("goodput"):
        return None
    found = view.get("stragglers") or []
    attempts = timeline.get("attempts") or []
    charts, ranks = [], None
    for i, a in enumerate(attempts):
        flagged = {s["rank"] for s in found if attempt_number(s) == a.get("attempt")}
        last = i == len(attempts) - 1
        charts.append(attempt_chart(a, flagged, now if last else None))
        if last:
            live = now is not None and a.get("end") is None  # its last steps move (run_live.py)
            ranks = {"attempt": a.get("attempt"), "rows": rank_rows(a, flagged, live), "live": live}
    return {
        "charts": charts,
        "ranks": ranks,
        "stragglers": straggler_rows(found),
        "goodput": goodput_view(view.get("goodput")),
        "step_work": [{"rank": r, "seconds": f"{t:.3f}"} for r, t in (view.get("step_work") or {}).items()],
        "legend": [{"name": n, "colour": c} for n, c in COLOUR.items()],
    }
