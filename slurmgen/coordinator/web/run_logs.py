"""A Slurm job's or an SSH launch's log on its run page, followed live: the newest lines first,
then every line appended since, split by rank (jobs/logs.py: srun --label, torchrun's [rank R]
tags). A launch's log is the one its launcher keeps on this machine (launch/registry_entry.py: what every
node sent, a rank's lines labelled as srun labels them, a line per attempt between them).

The page's script (static/app.js, the group page's log view) asks every quarter second for the
lines after a byte offset, so a line reaches the page within about a quarter second of being
written; only the bytes after the offset are read (the file is never read whole again). The
first answer is the last LOG_FIRST lines of at most TAIL_BYTES of the file; a later one holds at
most the newest LOG_BATCH lines of at most READ_MOST bytes and counts what it left out
(`skipped`), as the group's log does (live.py): a flood never grows an answer. A rank filter keeps
that rank's lines only: the batch shell's and a torchrun agent's own lines carry no rank and
are shown under "all ranks" alone. An array job's log is one of its tasks' (`task`, the first
by default): the page offers every task the array has.

A coordinator group's run has no log file here: its lines are those the coordinator keeps of its
attempts (the group page's, asked through the in-process API, web/api.py, by attempt: a run's
attempts are the coordinator's numbers from the one in its key, GROUP.N, on), each shown under
its attempt within the run.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from slurmgen.errors import SlurmgenError
from slurmgen.jobs.logs import Line, array_tasks, log_path, select_lines, tasks_text
from slurmgen.launch.display import NODE_LINE
from slurmgen.runs.log_lines import log_lines
from slurmgen.runs.model import get_row
from slurmgen.runs.registry import JobRecord, Registry

from . import api
from .auth import guarded
from .live import LOG_BATCH, LOG_FIRST
from .run_records import runner_for
from .runs_page import registry_path

router = APIRouter()
TAIL_BYTES = 512 * 1024
READ_MOST = 2 * 1024 * 1024  # bytes a poll reads at most (a 0.25 s poll at 10k lines/s: ~0.25 MB)


def _row(line: Line, launch: bool = False) -> dict[str, Any]:
    """A line as the page shows it: a rank's under its rank; a Slurm job's batch shell as "batch", a
    torchrun agent's as its node; a launch's node lines under the node's name, its own as "launch"."""
    who, text = ("batch" if line.task is None else f"node {line.task}"), line.text
    if launch and line.task is None:
        node = NODE_LINE.match(text)
        who, text = (node.group(1), node.group(2)) if node else ("launch", text)
    return {"rank": line.rank, "worker": who, "text": text, "attempt": None}


def _start(runner: Any, path: str) -> int:
    """Where the first read starts: TAIL_BYTES before the end, when the file is here."""
    if getattr(runner, "where", "") != "local":
        return 0
    try:
        return max(0, os.path.getsize(path) - TAIL_BYTES)
    except OSError:
        return 0


class BadTask(ValueError):
    """The `task` asked for is not one of the job's array tasks (or the job is no array)."""


def task_of(record: JobRecord, task: int | None) -> str | None:
    """Which array task's log to read: the one asked for, else the first; None for a job that is
    no array. An id outside the array is refused, naming the tasks there are."""
    if not record.info.get("array"):
        if task is not None:
            raise BadTask(f"task: job {record.job_id} is not an array job (got {task})")
        return None
    known = array_tasks(record.info)
    if task is None:
        return str(known[0] if known else 0)
    if known and task not in known:
        raise BadTask(f"task: expected one of the tasks of array job {record.job_id} ({tasks_text(known)}), got {task}")
    return str(task)


def _log_of(reg_path: Any, seq: int, task: int | None) -> tuple[JobRecord | None, str | None, str] | None:
    """(the Slurm job's record, the array task shown, the log's path) of run SEQ; a launch's log
    has no record (it is on this machine) and no task; None: the run keeps no log here."""
    with Registry.open(reg_path) as reg:
        record = reg.by_seq(seq)
        row = get_row(reg, seq) if record is None else None
    if record is not None:
        if "log_dir" not in record.info:
            return None
        which = task_of(record, task)
        return record, which, log_path(record, which)
    log_file = row["info"].get("log_file") if row is not None else None
    if log_file and task is not None:
        raise BadTask(f"task: run {seq} is not an array job (got {task})")
    return (None, None, log_file) if log_file else None


def _catch_up(runner: Any, path: str, after: int, chosen: Callable[[bytes], int]) -> tuple[int, int]:
    """(where to read from, how many lines that skips): a poll that finds more than READ_MOST new
    bytes here (the page was away, or a flood outran it) reads the last READ_MOST of them, from
    a line's start, and counts the lines before them that the view would have shown (`chosen`:
    of a block of whole lines, those of the rank filtered on, or all) without keeping them."""
    if getattr(runner, "where", "") != "local":
        return after, 0
    try:
        with open(path, "rb") as fh:
            target = os.fstat(fh.fileno()).st_size - READ_MOST
            if target <= after:
                return after, 0
            fh.seek(after)
            pos, count, carry = after, 0, b""
            while pos < target:
                chunk = fh.read(min(1 << 20, target - pos))
                if not chunk:
                    break
                pos, block = pos + len(chunk), carry + chunk
                cut = block.rfind(b"\n") + 1
                count, carry = count + chosen(block[:cut]), block[cut:]
            rest = carry + fh.readline()  # the line the cut fell in: skipped whole
            return pos + len(rest) - len(carry), count + (chosen(rest) if rest.endswith(b"\n") else 0)
    except OSError:
        return after, 0


def read_lines(reg_path: Any, seq: int, after: int, rank: int | None, task: int | None = None) -> dict[str, Any]:
    """{"lines", "next", "rank", "task", "skipped"}: complete lines after byte `after` (0: the
    newest LOG_FIRST) of the job's log, or of one array task's (task_of); at most LOG_BATCH, the
    newest, and `skipped` counts those left out before them."""
    found = _log_of(reg_path, seq, task)
    if found is None:
        return {"lines": [], "next": after, "rank": rank, "task": task, "skipped": 0}
    record, which, path = found
    runner = runner_for(record)
    torchrun = record is not None and record.info.get("launcher") == "torchrun"

    def chosen(text: str) -> list[Line]:  # the lines the view shows: the rank's, or all
        return select_lines(log_lines(text), None, None if rank is None else {rank}, torchrun)

    def counted(block: bytes) -> int:
        return block.count(b"\n") if rank is None else len(chosen(block.decode(errors="replace")))

    skipped = 0
    try:
        offset, skipped = _catch_up(runner, path, after, counted) if after else (_start(runner, path), 0)
        data = runner.read(path, offset) or b""
    except (OSError, SlurmgenError):
        data, offset = b"", after
    finally:
        runner.close()
    end = data.rfind(b"\n") + 1
    text = data[:end].decode(errors="replace")
    if not after and offset:  # started inside the file: its first line may be cut
        text = text[text.find("\n") + 1 :]
    lines = chosen(text)
    most = LOG_BATCH if after else LOG_FIRST
    skipped += max(0, len(lines) - most) if after else 0
    return {
        "lines": [_row(line, record is None) for line in lines[-most:]],
        "next": offset + end,
        "rank": rank,
        "task": None if which is None else int(which),
        "skipped": skipped,
    }


def _group_run(reg_path: Any, seq: int) -> tuple[str, range] | None:
    """(the group, the coordinator's numbers of its attempts) of run SEQ when it is a group's run."""
    with Registry.open(reg_path) as reg:
        row = get_row(reg, seq)
    if row is None or row["kind"] != "group":
        return None
    group, _, first = row["job_id"].rpartition(".")
    start = int(first) if first.isdigit() else 1
    return group, range(start, start + max(1, row["attempts"]))


async def group_lines(app: Any, group: str, numbers: range, after: int, rank: int | None) -> dict[str, Any]:
    """A group run's lines after id `after` (0: the newest LOG_FIRST), oldest first, from the
    coordinator's store, attempt by attempt, newest attempt first until enough are found; `gap`:
    lines between `after` and the first one were skipped (a burst over LOG_BATCH)."""
    limit = LOG_FIRST if after == 0 else LOG_BATCH
    found: list[dict[str, Any]] = []
    for number in reversed(numbers):
        params = {"after": after, "attempt": number, "limit": limit, "tail": "true", "rank": rank}
        reply = await api.call(
            app, "GET", f"/api/groups/{group}/logs", params={k: v for k, v in params.items() if v is not None}
        )
        if not reply.ok:  # the group was deleted: its lines with it
            break
        found = reply.body + found
        if len(found) >= limit:
            break
    lines = sorted(found, key=lambda line: line["id"])[-limit:]
    return {
        "lines": [
            {
                "rank": x.get("rank"),
                "worker": x.get("worker"),
                "text": x["line"],
                "attempt": x["attempt"] - numbers.start + 1,
            }
            for x in lines
        ],
        "next": max([after] + [x["id"] for x in lines]),
        "rank": rank,
        "task": None,
        "gap": after > 0 and len(found) >= limit,
    }


@router.get("/ui/live/runs/{seq}/logs", name="web_live_run_logs")
@guarded("live")
async def live_run_logs(
    request: Request, seq: int, after: int = 0, rank: int | None = None, task: int | None = None
) -> Response:
    group = await asyncio.to_thread(_group_run, registry_path(request.app), seq)
    if group is not None:
        body = await group_lines(request.app, *group, max(0, after), rank)
        return JSONResponse(body, headers={"cache-control": "no-store"})
    try:
        body = await asyncio.to_thread(read_lines, registry_path(request.app), seq, max(0, after), rank, task)
    except BadTask as exc:
        return JSONResponse({"detail": str(exc)}, status_code=422, headers={"cache-control": "no-store"})
    return JSONResponse(body, headers={"cache-control": "no-store"})
