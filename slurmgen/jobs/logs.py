"""A job's log split by rank: srun --label puts `TASK: ` before every line of every task.

`select_lines` and `tail` are pure; `follow` polls the file (here or over SSH) from an offset
and stops when the job has ended and the last bytes are read. `--follow --tail N` is `tail`
of what is there, then `follow` from where it stopped, as `tail -n N -f` does.
"""

from __future__ import annotations

import time
from pathlib import PurePosixPath
from typing import Callable, Iterator, Sequence

from slurmgen.jobs.registry import JobRecord
from slurmgen.jobs.slurm import split_label

POLL = 0.5


def log_path(record: JobRecord, task: str | None) -> str:
    """Where the job's (or array task's) output is: --output=LOG_DIR/%x-%j.out, or %x-%A_%a.out for arrays."""
    log_dir = record.info["log_dir"]
    if record.info.get("array"):
        return str(PurePosixPath(log_dir) / f"{record.name}-{record.job_id}_{task if task is not None else 0}.out")
    return str(PurePosixPath(log_dir) / f"{record.name}-{record.job_id}.out")


def tasks_on_node(node_index: int, per_node: int, launcher: str) -> set[int]:
    """srun task ids on the node_index-th node: a block of per_node ranks, or one torchrun agent."""
    if launcher == "torchrun":
        return {node_index}
    return set(range(node_index * per_node, (node_index + 1) * per_node))


def select_lines(lines: Sequence[str], tasks: set[int] | None) -> list[tuple[int | None, str]]:
    """(task, text) for each line, only those of `tasks` when given (None: all, batch lines too)."""
    out = []
    for line in lines:
        task, text = split_label(line)
        if tasks is None or task in tasks:
            out.append((task, text))
    return out


def format_line(task: int | None, text: str, colour: bool) -> str:
    if task is None:
        return text
    label = f"[rank {task}]"
    if colour:
        label = f"\x1b[{31 + task % 6}m{label}\x1b[0m"
    return f"{label} {text}"


def tail(data: bytes | None, tasks: set[int] | None, count: int | None) -> tuple[list[tuple[int | None, str]], int]:
    """The last `count` selected complete lines of `data` (all when None), and the offset after them.

    A last line without its newline yet is left for `follow`, which prints it once complete."""
    data = data or b""
    end = data.rfind(b"\n") + 1
    return last(select_lines(data[:end].decode(errors="replace").splitlines(), tasks), count), end


def last(lines: list[tuple[int | None, str]], count: int | None) -> list[tuple[int | None, str]]:
    """The last `count` lines (`--tail N`; 0 gives none), or all when `count` is None."""
    return lines if count is None else lines[len(lines) - count:] if count else []


def follow(read: Callable[[int], bytes | None], ended: Callable[[], bool], sleep: Callable[[float], None] = time.sleep,
           offset: int = 0) -> Iterator[str]:
    """Complete lines appended from `offset` on, until the job has ended and nothing more comes."""
    pending = b""
    while True:
        done = ended()  # asked before reading: whatever the job wrote before ending is read below
        chunk = read(offset) or b""
        offset += len(chunk)
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line.decode(errors="replace")
        if done:
            if pending:
                yield pending.decode(errors="replace")
            return
        if not chunk:
            sleep(POLL)
