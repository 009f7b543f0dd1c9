"""The hung rank's whole Python stack on a Slurm job's or a launch's run page, as the group page
shows a group's (its agent puts the dump into the rank's lines).

The watcher that judged a rank hung dumped its stack before killing it (contract/hangs.py,
templates/hang_stack.sh.j2), where contract/files.py names it:
- a Slurm job: STACKS_NAME beside its logs, every hang of every attempt appended, each headed
  "=== rank R on NODE, attempt N" (templates/run_slurm_watch.sh.j2); read through the job's
  runner, here or on its login node, as its log is;
- a launch: LAUNCH_STACK_NAME in the nodes' log directory, one file per hung rank (the ranks its
  attempts blame), read here when that directory is (a file system shared with the nodes, or a
  launch on this machine); a file older than the run is an earlier launch's and is not shown.
Only the last STACK_BYTES of a file are read: a stack is a few kB, a file of many hangs is not
read whole for every view of the page. The text goes to the page autoescaped and to the script
as JSON, which writes it as text (static/app.js). `/ui/live/runs/SEQ/stacks` is the same as JSON:
the page's script asks it while the run is live (and not on a login node: no SSH connection every
few seconds), so a hang shows without a reload.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from slurmgen.contract.exitcodes import HUNG
from slurmgen.contract.files import LAUNCH_STACK_NAME, STACKS_NAME
from slurmgen.errors import SlurmgenError
from slurmgen.runs.model import RunRow, attempts_of, get_row
from slurmgen.runs.registry import JobRecord, Registry

from .auth import guarded
from .run_records import runner_for
from .runs_page import registry_path

router = APIRouter()
STACK_BYTES = 256 * 1024
# The header run_slurm_watch.sh.j2 writes before each stack (a test renders it and reads it back).
HEADER = re.compile(r"^=== rank (\d+) on (\S+), attempt (\d+)$", re.MULTILINE)
ANY_TIME = 5.0  # seconds a launch's stack file may predate its row (the launcher's and the node's clocks)


@dataclass(frozen=True)
class Stack:
    """One hung rank's stack: which rank, on which node, in which attempt (None: not recorded)."""

    rank: int | None
    node: str | None
    attempt: int | None
    text: str


def tail(data: bytes, whole: int) -> tuple[str, bool]:
    """The text of the end of a file read as `data` ((text, True) when the file was longer, `whole`
    bytes: its start is not shown)."""
    return data.decode(errors="replace"), whole > len(data)


def sections(text: str, cut: bool) -> list[Stack]:
    """A Slurm job's stacks file as its stacks, in the order they were taken. When the file's start
    was not read (`cut`), the text before the first header is the end of an older stack: dropped."""
    heads = list(HEADER.finditer(text))
    out = []
    if heads and heads[0].start() > 0 and not cut and text[: heads[0].start()].strip():
        out.append(Stack(None, None, None, text[: heads[0].start()].strip("\n")))
    elif not heads and text.strip() and not cut:
        out.append(Stack(None, None, None, text.strip("\n")))
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        body = text[head.end() : end].strip("\n")
        out.append(Stack(int(head[1]), head[2], int(head[3]), body))
    return out


def _read_here(path: str, limit: int = STACK_BYTES, newer_than: float | None = None) -> tuple[str, bool] | None:
    """The end of a file of this machine (None: none, or older than `newer_than`)."""
    try:
        with open(path, "rb") as fh:
            info = os.fstat(fh.fileno())
            if newer_than is not None and info.st_mtime < newer_than:
                return None
            fh.seek(max(0, info.st_size - limit))
            return tail(fh.read(limit), info.st_size)
    except OSError:
        return None


def _read_there(runner: Any, path: str, limit: int = STACK_BYTES) -> tuple[str, bool] | None:
    """The end of a file on the login node a job was submitted through (`tail -c`, never the
    whole file over the connection); a file of `limit` bytes or more is taken as cut."""
    got = runner.run(["tail", "-c", str(limit), path], timeout=10)
    return (got.out, len(got.out.encode()) >= limit) if got.code == 0 else None


def slurm_stacks(record: JobRecord) -> list[Stack]:
    """Every hung rank's stack of a Slurm job (its stacks file; [] when none was taken)."""
    log_dir = record.info.get("log_dir")
    if not log_dir:
        return []
    path = str(PurePosixPath(log_dir) / STACKS_NAME.format(job_id=record.job_id))
    runner = runner_for(record)
    try:
        found = _read_here(path) if getattr(runner, "where", "") == "local" else _read_there(runner, path)
    except (OSError, SlurmgenError):
        found = None
    finally:
        runner.close()
    return sections(*found) if found else []


def blamed(row: RunRow, attempts: Iterable[Mapping[str, Any]]) -> dict[int, tuple[str | None, int | None]]:
    """rank -> (node, attempt) of every rank a launch's attempts (or the run's failure) name as
    hung (code HUNG), the latest kept: its file is rewritten at each of its hangs."""
    out: dict[int, tuple[str | None, int | None]] = {}
    failure: Mapping[str, Any] = row.get("failure") or {}
    if failure.get("rank") is not None and failure.get("code") == HUNG:
        out[int(failure["rank"])] = (failure.get("node"), None)
    for a in attempts:
        if a.get("rank") is not None and a.get("code") == HUNG:
            out[int(a["rank"])] = (a.get("node"), a.get("number"))
    return out


def launch_stacks(row: RunRow, attempts: Iterable[Mapping[str, Any]]) -> tuple[list[Stack], str | None]:
    """The stacks a launch's nodes left for its blamed ranks, read where its log directory is
    here; (stacks, a note naming where a blamed rank's stack would be when none is readable)."""
    logs = {entry.get("node"): entry["path"] for entry in row.get("logs") or [] if entry.get("path")}
    if not logs:
        return [], None
    stacks, elsewhere = [], []
    newer = (row.get("started") or 0) - ANY_TIME
    for rank, (node, attempt) in sorted(blamed(row, attempts).items()):
        folder = logs.get(node) or next(iter(logs.values()))
        path = str(Path(folder) / LAUNCH_STACK_NAME.format(rank=rank))
        found = _read_here(path, newer_than=newer)
        if found is None:
            elsewhere.append(f"rank {rank}'s would be in {path}" + (f" on {node}" if node else ""))
            continue
        text, cut = found
        stacks.append(Stack(rank, node, attempt, text.strip("\n") if not cut else text.partition("\n")[2]))
    note = None
    if elsewhere and not stacks:
        note = f"No stack of a hung rank is readable from this machine: {elsewhere[0]}, if it could be taken."
    return stacks, note


def stacks_of(row: RunRow, record: JobRecord | None, attempts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """{"stacks": [...], "note": text or None} of a run: a Slurm job's (`record`: its registry
    record), a launch's (`attempts`: its attempts' rows). A group's run has none here: its agent
    put the stack into the rank's lines, which the group's log shows."""
    if record is not None:
        return {"stacks": [asdict(s) for s in slurm_stacks(record)], "note": None}
    if row["kind"] == "launch":
        stacks, note = launch_stacks(row, attempts)
        return {"stacks": [asdict(s) for s in stacks], "note": note}
    return {"stacks": [], "note": None}


def read_stacks(path: Any, seq: int) -> dict[str, Any] | None:
    """stacks_of run SEQ of the registry at `path` (None: no such run)."""
    with Registry.open(path) as reg:
        row = get_row(reg, seq)
        if row is None:
            return None
        record = reg.by_seq(seq) if row["kind"] == "slurm" else None
        attempts = attempts_of(reg, seq)
    return stacks_of(row, record, attempts)


@router.get("/ui/live/runs/{seq}/stacks", name="web_live_run_stacks")
@guarded("live")
async def live_run_stacks(request: Request, seq: int) -> Response:
    body = await asyncio.to_thread(read_stacks, registry_path(request.app), seq)
    if body is None:
        return JSONResponse(
            {"detail": f"there is no run {seq}"}, status_code=404, headers={"cache-control": "no-store"}
        )
    return JSONResponse(body, headers={"cache-control": "no-store"})
