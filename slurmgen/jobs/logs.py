"""A job's log split by rank: srun --label puts `TASK: ` before every line of every task.

Under srun a task is a rank. Under torchrun a task is a node's agent; each of its workers puts
`[rank R] ` before its own lines (see run_slurm.sh.j2), so ` 1: [rank 3] text` is rank 3's line
and an untagged ` 1: text` is the agent's, shown as `[node 1]`.
A line ends at a newline only and a progress bar's line shows as its last state
(runs/log_lines.py, which the run page and `slurmgen launch` read lines by too).

`select_lines` and `tail` are pure; `follow` polls the file (here or over SSH) from an offset
and stops when the job has ended and the last bytes are read. `--follow --tail N` is `tail`
of what is there, then `follow` from where it stopped, as `tail -n N -f` does.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any, NamedTuple

from slurmgen.errors import SlurmgenError
from slurmgen.jobs.slurm import split_label
from slurmgen.runs.log_lines import log_lines, shown
from slurmgen.runs.registry import JobRecord

POLL = 0.5
# What a torchrun worker puts before each of its lines (run_slurm.sh.j2 writes the same form).
RANK_TAG = re.compile(r"^\[rank (\d+)\] (.*)$", re.S)


class Line(NamedTuple):
    """One log line: its srun task (None: the batch shell), the rank that printed it (None: the
    batch shell or a torchrun agent) and its text without the labels."""

    task: int | None
    rank: int | None
    text: str


def log_path(record: JobRecord, task: str | None) -> str:
    """Where the job's (or array task's) output is: --output=LOG_DIR/%x-%j.out, or %x-%A_%a.out for arrays."""
    log_dir = record.info["log_dir"]
    if record.info.get("array"):
        return str(PurePosixPath(log_dir) / f"{record.name}-{record.job_id}_{task if task is not None else 0}.out")
    return str(PurePosixPath(log_dir) / f"{record.name}-{record.job_id}.out")


MAX_TASKS = 10_001  # Slurm's largest MaxArraySize default is 1001; a list this long is a mistake


def array_tasks(info: Mapping[str, Any]) -> list[int]:
    """The task ids of an array job, from what it was submitted with (jobs/commands.py keeps a
    sweep's point count, or --array's own spec: "0-15%4", "1,3,5", "0-10:2"); [] when it is
    no array, or a spec this does not read (then any task id is tried). `info`: the job's
    registry record's (JobRecord.info, a run row's "info")."""
    spec = info.get("array")
    if isinstance(spec, int) and not isinstance(spec, bool):
        return list(range(min(spec, MAX_TASKS)))
    out: list[int] = []
    for part in str(spec or "").split("%")[0].split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part.strip())
        if not m:
            return []
        out += range(int(m[1]), int(m[2] or m[1]) + 1, max(1, int(m[3] or 1)))
    return sorted(set(out))[:MAX_TASKS]


def tasks_text(tasks: Sequence[int]) -> str:
    """ "0-3", "1, 3, 5", "0-2, 7": task ids as a person reads them, runs joined."""
    runs: list[list[int]] = []
    for t in tasks:
        if runs and t == runs[-1][-1] + 1:
            runs[-1].append(t)
        else:
            runs.append([t])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def tasks_on_node(node_index: int, per_node: int, launcher: str) -> set[int]:
    """srun task ids on the node_index-th node: a block of per_node ranks, or one torchrun agent."""
    if launcher == "torchrun":
        return {node_index}
    return set(range(node_index * per_node, (node_index + 1) * per_node))


def check_rank(record: JobRecord, rank: int) -> None:
    """`--rank R` must name one of the job's ranks: a rank beyond them has no lines to show."""
    world = int(record.info.get("nodes", 1)) * int(record.info.get("gpus", 1))
    if rank >= world:
        raise SlurmgenError(f"rank: job {record.job_id} has ranks 0-{world - 1} (got {rank})")


def split_line(line: str, torchrun: bool = False) -> Line:
    """The task, rank and text of one log line (see the module's docstring); the text as a terminal
    shows it, a progress bar's last state (runs/log_lines.py)."""
    task, text = split_label(line)
    if task is None or not torchrun:
        return Line(task, task, shown(text))
    tagged = RANK_TAG.match(text)
    return Line(task, int(tagged.group(1)), shown(tagged.group(2))) if tagged else Line(task, None, shown(text))


def select_lines(
    lines: Sequence[str], tasks: set[int] | None, ranks: set[int] | None = None, torchrun: bool = False
) -> list[Line]:
    """The lines of `tasks` and of `ranks` when given (None: all, batch lines too)."""
    out = []
    for raw in lines:
        line = split_line(raw, torchrun)
        if (tasks is None or line.task in tasks) and (ranks is None or line.rank in ranks):
            out.append(line)
    return out


def format_line(line: Line, colour: bool) -> str:
    """`[rank R] text`, `[node N] text` for a torchrun agent's own line, the text of a batch line."""
    if line.task is None:
        return line.text
    label, number = (f"[rank {line.rank}]", line.rank) if line.rank is not None else (f"[node {line.task}]", line.task)
    if colour:
        label = f"\x1b[{31 + number % 6}m{label}\x1b[0m"
    return f"{label} {line.text}"


def tail(
    data: bytes | None, tasks: set[int] | None, count: int | None, ranks: set[int] | None = None, torchrun: bool = False
) -> tuple[list[Line], int]:
    """The last `count` selected complete lines of `data` (all when None), and the offset after them.

    A last line without its newline yet is left for `follow`, which prints it once complete."""
    data = data or b""
    end = data.rfind(b"\n") + 1
    return last(select_lines(log_lines(data[:end].decode(errors="replace")), tasks, ranks, torchrun), count), end


def last(lines: list[Line], count: int | None) -> list[Line]:
    """The last `count` lines (`--tail N`; 0 gives none), or all when `count` is None."""
    return lines if count is None else lines[len(lines) - count :] if count else []


def follow(
    read: Callable[[int], bytes | None],
    ended: Callable[[], bool],
    sleep: Callable[[float], None] = time.sleep,
    offset: int = 0,
) -> Iterator[str]:
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
