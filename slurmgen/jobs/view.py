"""One job's status, put together from the registry, Slurm, its log and its run records.

`job_view` is pure (all inputs already read); the readers above it fetch those inputs. The
result is a plain dict: `--json` prints it as is, `format_view` writes the text form.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from slurmgen.contract import verdict
from slurmgen.contract.attempts import from_restart_count
from slurmgen.contract.exitcodes import HUNG, NOT_FOUND
from slurmgen.contract.states import SLURM_LIVE, STOP_ASKED, STOPPED_BY_YOU, State, from_slurm
from slurmgen.generate.slurm_values import time_limit_seconds
from slurmgen.heal.attempts import FINISHED_ACTION, RECOVERY, cause, stuck, where_next
from slurmgen.jobs import signals
from slurmgen.jobs.slurm import QueryResult, SlurmJob, TaskExit, first_rank_exit, missing_command, task_exits
from slurmgen.observe.report import lines as time_lines
from slurmgen.runs.registry import JobRecord


def overall(tasks: Sequence[SlurmJob]) -> tuple[str, int | None]:
    """An array's state: still going if any task is; else COMPLETED, or the first failure's state."""
    if not tasks:
        return "UNKNOWN", None
    for wanted in ("RUNNING", "PENDING"):
        if any(t.state == wanted for t in tasks):
            return wanted, None
    if any(t.state in SLURM_LIVE for t in tasks):
        return next(t.state for t in tasks if t.state in SLURM_LIVE), None
    failed = [t for t in tasks if t.state != "COMPLETED"]
    if not failed:
        return "COMPLETED", 0
    return failed[0].state, exit_code(failed[0])


def ended_at(tasks: Sequence[SlurmJob]) -> tuple[bool, float | None]:
    """(known, when the job ended) by Slurm's EndTime, for the registry's end column: (True, t)
    when every task ended; (True, None) while any runs (a requeued job has not ended, whatever
    an earlier end said); (False, None) when it ended but Slurm gave no end time (keep what is kept)."""
    if not tasks:
        return False, None
    if not all(t.ended for t in tasks):
        return True, None
    ends = [t.end_time for t in tasks]
    return (True, max(e for e in ends if e is not None)) if all(e is not None for e in ends) else (False, None)


def attempt_start(tasks: Sequence[SlurmJob], now: float) -> tuple[bool, float | None]:
    """(known, when the job's current attempt started): its end (or `now` while it runs) less the
    elapsed time Slurm gives, which is the current attempt's (a requeue starts it again);
    (True, None) while it waits for an attempt (pending, again after a requeue); (False, None) for
    an array (each task has its own) or an elapsed time not given. The list holds it to the limit."""
    if len(tasks) != 1 or tasks[0].array_task is not None:
        return False, None
    job = tasks[0]
    if from_slurm(job.state) is State.PENDING:
        return True, None
    try:
        seconds = time_limit_seconds(job.elapsed) if job.elapsed else None
    except ValueError:
        seconds = None
    until = job.end_time if job.ended else now
    return (True, until - seconds) if seconds is not None and until is not None else (False, None)


def attempt(tasks: Sequence[SlurmJob]) -> int | None:
    """The attempt the job is at (contract/attempts.py: Slurm's restart count + FIRST), for the
    registry's list of runs; an array's is its furthest task's. None until a task has started: a
    job pending since its submission has had no attempt, one pending after a requeue has its
    next attempt waiting."""
    started = [t.restarts for t in tasks if t.state != "PENDING" or t.restarts]
    return from_restart_count(max(started)) if started else None


def exit_code(job: SlurmJob) -> int | None:
    """The job's code as a shell reports it: its exit code, or 128 + the signal that ended it."""
    if job.exit_code:
        return job.exit_code
    if job.signal:
        return 128 + job.signal
    if job.state == "COMPLETED":
        return 0
    return None if job.state in SLURM_LIVE or job.state == "UNKNOWN" else 1


def task_row(
    key: str,
    job: SlurmJob | None,
    record: JobRecord,
    params: Mapping[str, Any] | None,
    log_text: str | None,
    run: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """One job or array task: what Slurm says, the failing tasks from its log, its run record."""
    state = job.state if job else (record.last_state or "UNKNOWN")
    row: dict[str, Any] = {
        "job": key,
        "state": state,
        "source": job.source if job else "registry (last seen)",
        "reason": job.reason if job and state == "PENDING" else None,
        "eligible": job.eligible if job and state == "PENDING" and job.reason == "BeginTime" else None,
        "expected_start": job.expected if job and state == "PENDING" else None,
        "nodes": job.nodes if job else None,
        "elapsed": job.elapsed if job else None,
        "limit": job.limit if job else None,
        "restarts": job.restarts if job else 0,
        "exit_code": exit_code(job) if job else record.last_exit,
    }
    failures: list[TaskExit] = task_exits(log_text) if log_text else []
    row["failed_tasks"] = [f.as_dict() for f in failures]
    row["first_rank_exit"] = first_rank_exit(log_text) if log_text else None
    row["missing_command"] = missing_command(log_text) if log_text else None
    if params is not None:
        row["params"] = dict(params)
    if run:
        row["run"] = dict(run)
    return row


def job_view(
    record: JobRecord, snap: QueryResult, rows: list[dict[str, Any]], attempts: list[dict[str, Any]]
) -> dict[str, Any]:
    """The whole status of a registered job; `rows` has one entry, or one per array task."""
    info = record.info
    if len(rows) == 1 and not info.get("array"):
        top = dict(rows[0])
    else:
        fake = [SlurmJob(job_id=r["job"], state=r["state"], exit_code=r["exit_code"]) for r in rows]
        state, code = overall(fake)
        top = {"job": record.job_id, "state": state, "exit_code": code, "tasks": rows}
    ended = [r for r in rows if r["state"] not in SLURM_LIVE and r["state"] != "COMPLETED" and r["state"] != "UNKNOWN"]
    # A cancelled job (scancel: `slurmgen cancel`, the page's Cancel) or one a person's "checkpoint
    # and stop" ended (its 75) was stopped on request: its ranks' ends are the stop's doing, not a
    # failure to name.
    asked = STOP_ASKED in info
    on_request = [from_slurm(r["state"], r["exit_code"], asked) is State.STOPPED for r in ended]
    stopped = [r for r, stop in zip(ended, on_request, strict=True) if stop]
    failed = [r for r, stop in zip(ended, on_request, strict=True) if not stop]
    view = {
        **top,
        "name": record.name,
        "output_dir": record.output_dir,
        "remote": record.remote,
        "submitted": record.submitted,
        "command": info.get("command"),
        "notes": list(snap.notes),
        "first_failure": _hang_told(_first_failure(failed), attempts),
        "stopped": {
            "job": stopped[0]["job"],
            "state": stopped[0]["state"],
            "exit_code": stopped[0]["exit_code"],  # the stop's, raw: no failure's
            "what": STOPPED_BY_YOU + (", checkpointed first" if asked else ""),
        }
        if stopped and not failed
        else None,
    }
    if snap.unanswered:
        view["unanswered"] = snap.unanswered
    for key in ("snapshot", "sweep_file", "digest", "cluster"):
        if info.get(key) is not None:
            view[key] = info[key]
    if attempts:
        view["attempts"] = attempts
    # sacct's steps (batch, extern, 0, 1, ...) of the one job or array task shown.
    steps = snap.steps.get(rows[0]["job"] if len(rows) == 1 else record.job_id)
    if steps:
        # parse_sacct gives a step ended by signal N (sacct's 0:N) as 128 + N; sacct itself never
        # shows an exit code above 127 (it writes 128 + N as N), so above 128 it was a signal.
        view["steps"] = [
            {"step": s, "state": st, "exit_code": c, **({"signal": c - 128} if c and c > 128 else {})}
            for s, st, c in steps
        ]
    signalled = _signalled_by_user(record, view)
    if signalled:
        view["signalled"] = signalled
    return view


def _signalled_by_user(record: JobRecord, view: Mapping[str, Any]) -> dict[str, Any] | None:
    """The signal sent with `slurmgen cancel --signal` that ended the job: its exit code is
    128 + that signal, the shell's word for "killed by it", so the program had no handler."""
    code = view.get("exit_code")
    if view.get("state") in SLURM_LIVE or not isinstance(code, int) or code <= 128:
        return None
    task = view["job"].split("_", 1)[1] if "_" in str(view["job"]) else None
    for sent in reversed(record.info.get("signals") or []):
        num = signals.number(str(sent.get("signal")))
        if num is not None and code == 128 + num and sent.get("task") in (None, task):
            label = signals.name(num) or str(num)
            return {
                "signal": label,
                "time": sent.get("time"),
                "exit_code": code,
                "what": f"signalled by the user ({label}, slurmgen cancel --signal), which the program did not "
                f"handle: {signals.killed_by(num)} (exit code {code})",
            }
    return None


def _first_failure(failed: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Which job or array task failed, which rank (and srun task) failed first, and its code:
    the rank's own note first, srun's report when no rank left one, as run_slurm.sh decides
    (the contract's verdict over those events, in that order). A code of 127 is said as the
    command that was not found, named when the log names it: srun's report says only the code."""
    if not failed:
        return None
    row = failed[0]
    first = verdict.decide(_failure_events(row)).first
    what = first.detail if first else None
    if (first.code if first else row["exit_code"]) == NOT_FOUND:
        what = f"{row['missing_command']}: command not found" if row.get("missing_command") else "command not found"
    return {
        "job": row["job"],
        "state": row["state"],
        "exit_code": row["exit_code"],
        "node": first.node if first else None,
        "task": first.task if first else None,
        "rank": first.rank if first else None,
        "what": what,
    }


def _hang_told(first: dict[str, Any] | None, attempts: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """A job its watcher stopped for a hang (exit code HUNG): the hang is its first failure, as
    the attempts record tells it (the hung rank, its node, the verdict), not the exit of the rank
    the watcher then killed ("exit code 124: rank 1 exited with code 137" contradicted itself)."""
    if first is None or first.get("exit_code") != HUNG:
        return first
    hangs = [a for a in attempts if a.get("event") == "end" and a.get("hung_rank") is not None]
    if not hangs:
        return first
    end = hangs[-1]
    what = end.get("verdict") or f"rank {end['hung_rank']} stopped beating"
    return {**first, "rank": end["hung_rank"], "node": end.get("node") or first.get("node"), "task": None, "what": what}


def _failure_events(row: Mapping[str, Any]) -> list[verdict.Event]:
    """A failed row's failures as verdict events: the rank's note, then srun's failed tasks."""
    note = row.get("first_rank_exit")
    events = (
        [
            verdict.exited(
                note["exit_code"],
                note["node"],
                note["rank"],
                note["task"],
                f"rank {note['rank']} exited with code {note['exit_code']}",
            )
        ]
        if note
        else []
    )
    # srun names only tasks that failed; one ended by a signal carries no code, still a failure.
    return events + [
        verdict.exited(t.get("code"), t["node"], None, t["tasks"][0], t["what"]) for t in row.get("failed_tasks") or []
    ]


def _fmt_loss(run: Mapping[str, Any] | None) -> str:
    loss = (run or {}).get("loss")
    return f"{loss:.4g}" if isinstance(loss, (int, float)) else "-"


def format_view(
    view: Mapping[str, Any], style: Callable[[str, str], str] = lambda text, state: text, now: float | None = None
) -> list[str]:
    """The text form of `job_view`, one line per fact; `style` colours a state."""
    lines = [
        f"job {view['job']} ({view['name']}): {style(view['state'], view['state'])}"
        + (f", exit code {view['exit_code']}" if view.get("exit_code") is not None else "")
    ]
    if view.get("unanswered"):  # first: every Slurm fact below is missing or old
        last_seen = str(view.get("source", "")).startswith("registry")
        lines.append(
            f"  slurm: {view['unanswered']}" + ("; the state is the last one slurmgen saw" if last_seen else "")
        )
    if view.get("reason"):
        lines.append(f"  pending: {pending_text(view, now)}")
    for label, key in (("nodes", "nodes"), ("elapsed", "elapsed"), ("limit", "limit"), ("requeued", "restarts")):
        if view.get(key):
            lines.append(f"  {label}: {view[key]}")
    lines.append(f"  output: {view['output_dir']}" + (f" on {view['remote']}" if view.get("remote") else ""))
    snap = view.get("snapshot")
    if snap:
        lines.append(
            f"  code: {snap.get('dir')} (commit {snap.get('commit') or 'none'}{', dirty' if snap.get('dirty') else ''})"
        )
    failure = view.get("first_failure")
    if view.get("signalled"):  # no rank to blame: every rank the signal reached died of it
        lines.append(f"  failed: {view['job']} {view['state']}, {view['signalled']['what']}")
    elif failure:
        where = f" task {failure['task']} on {failure['node']}" if failure.get("node") else ""
        where += f": {failure['what']}" if failure.get("what") else ""
        lines.append(f"  failed: {failure['job']} {failure['state']} (exit code {failure['exit_code']}){where}")
    elif view.get("stopped"):
        stop = view["stopped"]
        lines.append(f"  {State.STOPPED}: {stop['job']} {stop['state']}, {stop['what']} (scancel)")
    for task in view.get("tasks") or []:
        params = " ".join(f"{k}={v}" for k, v in (task.get("params") or {}).items())
        code = "" if task.get("exit_code") is None else f" exit {task['exit_code']}"
        lines.append(
            (
                f"  {task['job']:>10}  {style(task['state'], task['state']):<10}{code}  "
                f"loss {_fmt_loss(task.get('run'))}  {params}"
            ).rstrip()
        )
        if _eventful(task.get("attempts")):  # a grid of a hundred tasks that simply finished stays a grid
            lines += _attempt_lines(task.get("attempts"), " " * 14)
    run = view.get("run")
    if run:
        lines.append(
            f"  run: step {run.get('step')}, loss {_fmt_loss(run)}, "
            f"checkpoint {run.get('checkpoint') or '-'} ({run.get('dir')})"
        )
    for step in view.get("steps") or []:
        lines.append(f"  step {step['step']}: {step['state']} {_step_end(step)}")
    lines += _attempt_lines(view.get("attempts"), "  ")
    lines += time_lines(view)
    for note in view.get("notes") or []:
        if note != view.get("unanswered"):
            lines.append(f"  note: {note}")
    return lines


def pending_text(view: Mapping[str, Any], now: float | None) -> str:
    """Why it waits; after a requeue (Reason=BeginTime) also until when: Slurm's requeue delay."""
    eligible, reason = view.get("eligible"), str(view["reason"])
    try:
        at = datetime.fromisoformat(eligible) if eligible else None
    except ValueError:
        at = None
    if at is None:
        return reason + _expected(view, now)
    wait = round(at.timestamp() - (time.time() if now is None else now))
    why = "requeued" if view.get("restarts") else "begin time"
    # Slurm's expected start is said only when it is not the moment the job becomes eligible.
    expected = "" if _start_of(view) == at else _expected(view, now)
    return (
        f"{why}, eligible at {at:%H:%M:%S}"
        + (f" (in {wait} s)" if wait > 0 else " (now: waiting for resources)")
        + expected
    )


def _start_of(view: Mapping[str, Any]) -> datetime | None:
    """Slurm's expected start of a pending job (StartTime), None when unknown or unreadable."""
    try:
        return datetime.fromisoformat(view["expected_start"]) if view.get("expected_start") else None
    except ValueError:
        return None


def _expected(view: Mapping[str, Any], now: float | None) -> str:
    """When Slurm's backfill scheduler expects the job to start (StartTime, known after its next
    cycle, from the time limits of the jobs running now), and how long that is from now."""
    at = _start_of(view)
    if at is None:
        return ""
    wait = round(at.timestamp() - (time.time() if now is None else now))
    span = f"{wait} s" if wait < 120 else f"{wait // 60} min" if wait < 7200 else f"{wait / 3600:.1f} h"
    return f"; Slurm expects it to start at {at:%Y-%m-%d %H:%M:%S}" + (f" (in {span})" if wait > 0 else "")


# Signals that end steps (srun's TERM and KILL, aborts, crashes, unhandled warnings): an exit
# code of one of these numbers in sacct more likely means 128 + it than a program's own choice.
_KILLERS = frozenset({6, 9, 10, 11, 12, 15})


def _step_end(step: Mapping[str, Any]) -> str:
    """'killed by signal 15 (TERM)' or 'exit code 3'. sacct writes an exit code of 128 + N as N,
    so a step's N:0 may also mean the shell's "killed by signal N": both are said."""
    code = step.get("exit_code")
    if step.get("signal"):
        return signals.killed_by(step["signal"])
    if step.get("state") != "COMPLETED" and code in _KILLERS:
        return f"exit code {code} or {128 + code} ({signals.killed_by(code)}): sacct writes both as {code}"
    return f"exit code {code}"


def _attempt_lines(attempts: Sequence[Mapping[str, Any]] | None, indent: str) -> list[str]:
    """One line per ended attempt of a job (or of one array task, under its row)."""
    lines, records = [], list(attempts or [])
    for i, a in enumerate(records):
        if a.get("event") == RECOVERY:  # a warm restart: the attempt went on
            lines.append(f"{indent}attempt {a.get('attempt')}: {a.get('what')}")
        if a.get("event") == "end":
            then = f" -> {a['action']}" if a.get("action") else ""  # a requeue's end (derived) decided nothing
            lines.append(f"{indent}attempt {a.get('attempt')}: {cause(a)}{then}{where_next(records, i)}")
            where = stuck(a)
            lines += [f"{indent}  {where}"] if where else []
    return lines


def _eventful(attempts: Sequence[Mapping[str, Any]] | None) -> bool:
    """More than one attempt, one that did not simply finish, or a warm restart inside one."""
    ends = [a for a in attempts or [] if a.get("event") == "end"]
    recovered = any(a.get("event") == RECOVERY for a in attempts or [])
    return recovered or len(ends) > 1 or any(a.get("action") != FINISHED_ACTION for a in ends)
