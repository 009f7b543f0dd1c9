"""The attempts record: one JSON line per event of a Slurm job's attempts, beside its logs.

`run_slurm.sh` appends to `LOG_DIR/slurmgen-<SLURM_JOB_ID>.attempts.jsonl` (bash, one
`printf >>` per line, so lines from a requeued job's later attempts simply follow). An
attempt is one job step of the program: one run of the batch script, or with `restarts` (in-job
restarts, templates/run_slurm_restart.sh.j2) each new step inside the same allocation too;
`attempt` is SLURM_RESTART_COUNT + 1 (contract/attempts.py: attempts count from 1), and with
restarts the record's last attempt + 1 (a requeue goes on after the in-job ones).
Every line has:

  event      "start" | "end" | "skipped" (the job had already finished: nothing was run) |
             "recovery" (a warm restart inside the attempt, which goes on)
  job        the Slurm job id (a string, as Slurm prints it)
  attempt    SLURM_RESTART_COUNT + 1 (the first attempt is 1), counting in-job restarts too
  time       seconds since the epoch on the batch node (float)
  host       the batch node

"start" lines add `nodes` (the job's nodes; with restarts, this step's nodes in node-rank order,
comma-separated) and, with restarts, `restart` (the in-job restarts of this allocation before it);
a step on fewer nodes than the job's (a smaller world: a node lost, no spare left) adds
`min_nodes`, the fewest the spec allows.

"recovery" lines (restart_mode: warm, templates/run_slurm_warm.sh.j2) add `generation` (the
attempt's world the ranks went on in), `rank` and `node` (the rank started anew there), `exit_code`
(its failure's) and `what`, the recovery in words as `slurmgen launch` keeps it ("warm restart 1:
rank 1 started anew after rank 1 exited with code 137 on node2", or "... rank 1 went on in the warm
spare on node2 after ..." when the node's warm spare took its place); each counts against `restarts`.

"end" lines add (rank, node, task: the first failure as run_slurm.sh's `first_failure` finds
it, from the `slurmgen-exit:` note the failing rank wrote, else from srun's report of the first
task that ended badly, which names no rank under torchrun):

  exit_code  the job's exit code: the first failure's own, else the step's (exitcodes.HUNG when
             the watcher stopped a hung rank)
  rank       the rank that failed first, or null
  node       the node where the failure started, or null
  task       the Slurm task id that failed first (under torchrun: its node's agent), or null
  hung_rank  the rank whose heartbeat went stale, or null
  hung_step  the step of its last heartbeat, or null (a program that writes no step)
  verdict    the hang in words, or null: "rank 3 on node2 stopped beating at step 220 (no
             heartbeat for 10.4 s, its process is stopped); ranks 0-2 waited in a collective"
             (the node whose rank is stopped, or whose last beat is the oldest of all nodes,
             names it: see judge_node in templates/hang_judge.sh.j2)
  stack      where the hung rank was stuck, or null: the innermost frames of its main thread,
             innermost first, [{"file", "line", "function"}, ...], as the watcher took them
             before it killed the rank (contract/hangs.py; the whole dump of every thread is in
             LOG_DIR/slurmgen-<SLURM_JOB_ID>.stacks.txt)
  stage      "step" (the job step ran) or "preflight" (`slurmgen doctor` stopped the job)
  action     "finished" (exit 0, the finished marker was written), "restart" (a new job step
             in the same allocation: `restarts`), "requeue" (retry policy), "stop" (no retry:
             a code not in retry_on, or retries and restarts used up, or too few nodes left)
  exclude    the node added to the job's ExcNodeList before the requeue, or the node a restart
             left out (a spare took its node rank, or, in a smaller world, nobody), or null

A link of a chain (`submit --chain`, templates/run_slurm_chain.sh.j2) adds to its "end" lines:

  chain      "next" (the next link resumes the run), "finished" (the run finished: the links
             after this one are cancelled) or "stopped" (a code no retry would fix: the same)
  chain_why  why the chain ended, or null; also kept in LOG_DIR/slurmgen-chain-<chain>.ended,
             which makes a later link that starts anyway write "skipped" (with chain "ended")

`LOG_DIR/slurmgen-<SLURM_JOB_ID>.finished` exists once an attempt ended with exit 0: a later
start of the same job id (a requeue by Slurm or by hand) exits 0 at once without running.
An attempt killed outright (node failure, scancel, a requeue by the program itself after a
preemption) leaves a "start" without an "end". Retries used = the "requeue" actions in the
file (SLURM_RESTART_COUNT when the file lacks attempt 1, e.g. a log directory not shared).

Read back (`parse_attempts`), an attempt whose "start" has no "end" while a later attempt of the
same job started was ended by a requeue (the program's `scontrol requeue` after a preemption, a
requeue by hand or by Slurm after a node failure: Slurm kills the batch shell "DUE TO JOB
REQUEUE" before it can write its end). It gets an "end" of its own, derived, not written:

  cause      "requeued" (REQUEUED)
  derived    true; its time is null (unknown: before the next attempt's start), and it has no
             exit_code and no action (the script decided nothing: retries used stay the file's)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slurmgen.contract import exitcodes, verdict
from slurmgen.contract.files import ATTEMPTS_NAME, FINISHED_NAME
from slurmgen.contract.verdict import Event
from slurmgen.contract.world import fewer_nodes
from slurmgen.jsonl import objects
from slurmgen.runs.model import Failure

# A warm restart inside an attempt (restart_mode: warm): the attempt goes on.
RECOVERY = "recovery"
EVENTS = ("start", "end", "skipped", RECOVERY)
# The cause of an attempt that a requeue ended before its batch shell could write its end.
REQUEUED = "requeued"
# The action after a run that ended well: a word of this file's format, not a run record's state.
FINISHED_ACTION = "finished"
ACTIONS = (FINISHED_ACTION, "restart", "requeue", "stop")


def attempts_path(log_dir: str | Path, job_id: str) -> Path:
    return Path(log_dir) / ATTEMPTS_NAME.format(job_id=job_id)


def finished_path(log_dir: str | Path, job_id: str) -> Path:
    return Path(log_dir) / FINISHED_NAME.format(job_id=job_id)


def read_attempts(path: str | Path) -> list[dict[str, Any]]:
    """Every record of the file in order; a line cut short by a kill is skipped."""
    return parse_attempts(Path(path).read_text())


def parse_attempts(text: str) -> list[dict[str, Any]]:
    """The records of an attempts file's text (read here, or over SSH by `slurmgen status`), with
    the end of each attempt a requeue ended (see above) derived in its place."""
    return requeue_ends([record for record in objects(text.splitlines()) if record.get("event") in EVENTS])


def requeue_ends(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`records` with a derived "end" (cause REQUEUED) after each "start" that a later "start"
    of the same job follows with no "end" between: the requeue killed that attempt's batch shell."""
    out: list[dict[str, Any]] = []
    open_start: dict[Any, dict[str, Any]] = {}  # job -> its attempt's start, not yet ended
    for record in records:
        job = record.get("job")
        if record.get("event") == "start" and job in open_start:
            before = open_start[job]
            out.append({"event": "end", "job": job, "attempt": before.get("attempt"), "time": None,
                        "host": before.get("host"), "cause": REQUEUED, "derived": True})  # fmt: skip
        if record.get("event") == "start":
            open_start[job] = record
        elif record.get("event") != RECOVERY:  # a recovery goes on inside its attempt
            open_start.pop(job, None)
        out.append(record)
    return out


def first_failure(record: Mapping[str, Any]) -> Event:
    """An "end" record's first failure (as run_slurm.sh's `first_failure` decided it) as the
    contract's verdict event: hung when a rank's heartbeat went stale, else an exit."""
    code, hung = record.get("exit_code"), record.get("hung_rank")
    return Event(
        verdict.HUNG if hung is not None else verdict.EXITED,
        None if code is None else int(code),
        node=record.get("node"),
        rank=hung if hung is not None else record.get("rank"),
        task=record.get("task"),
    )


def cause(record: Mapping[str, Any]) -> str:
    """One phrase for an "end" record: 'requeued' for one a requeue ended (derived), 'hung: rank 3
    on node2 stopped beating at step 220 (...)' when the watchers judged a hang across nodes, else
    verdict.summary's 'hung (rank 3 on node2)', 'exit 3 (rank 5 on node2)', or 'exit 3 (task 1 on
    node2)' when no rank is known."""
    code = record.get("exit_code")
    if record.get("cause") == REQUEUED:
        return REQUEUED
    if code is not None and record.get("verdict"):
        return f"{exitcodes.describe(int(code))}: {record['verdict']}"
    return verdict.summary(first_failure(record))


def job_failure(records: Sequence[Mapping[str, Any]]) -> Failure | None:
    """The job's first failure as the run registry keeps it (runs/model.keep_failures): its last
    attempt's "end" record, when that attempt failed (None: it has not ended, or ended well)."""
    ends = [r for r in records if r.get("event") == "end"]
    latest = max((r.get("attempt") or 0 for r in records), default=0)
    end = ends[-1] if ends and (ends[-1].get("attempt") or 0) >= latest else None
    if end is None or not end.get("exit_code") or end.get("action") == FINISHED_ACTION:
        return None
    first = first_failure(end)  # the cause without the rank and node, which the failure names apart
    what = end.get("verdict") or exitcodes.describe(int(end["exit_code"]))
    return Failure(cause=str(what), rank=first.rank, node=first.node, code=first.code)


def stuck(record: Mapping[str, Any], frames: int = 3) -> str | None:
    """Where an "end" record's hung rank was stuck, for `slurmgen status`: 'rank 3 stuck in
    time.py:12 in sleep() <- train.py:123 in step()' (innermost first), or None without a stack."""
    stack = record.get("stack")
    if not isinstance(stack, list) or not stack:
        return None
    where = " <- ".join(
        f"{Path(str(f.get('file', '?'))).name}:{f.get('line', '?')} in {f.get('function', '?')}()"
        for f in stack[:frames]
        if isinstance(f, dict)
    )
    return f"rank {record.get('hung_rank')} stuck in {where}"


def where_next(records: Sequence[Mapping[str, Any]], index: int) -> str:
    """Where the in-job restart that the "end" at `records[index]` decided went on, from the next
    attempt's start (its nodes in node-rank order), the node this end left out and the node that
    took its place (one of the next start's nodes this attempt's start did not have: a spare):
    ' on node1,node3 (node2 left out, spare node3 took its place)'; on fewer nodes (a smaller
    world), the nodes it lost: ' on node1 (2 -> 1 nodes: node2 lost, --min-nodes 1)'; '' for any
    other end. The one rule of `slurmgen status`'s "-> restart on ..." and the run page's
    "restarted on ..."."""
    end = records[index]
    if end.get("action") != "restart":
        return ""
    start = next((r for r in records[index + 1 :] if r.get("event") == "start"), None)
    began = next((r for r in reversed(records[:index]) if r.get("event") == "start"), None)
    after = str(start.get("nodes") or "").split(",") if start else []
    before = str(began.get("nodes") or "").split(",") if began else []
    spares = [node for node in after if node and before != [""] and node not in before]
    nodes = f" on {start['nodes']}" if start and start.get("nodes") else ""
    if start and start.get("min_nodes") and before != [""] and len(after) < len(before):
        lost = ",".join(node for node in before if node not in after)
        return nodes + f" ({fewer_nodes(len(before), len(after), lost, start['min_nodes'], ','.join(spares))})"
    if not end.get("exclude"):
        return nodes
    took = f", spare {','.join(spares)} took its place" if spares else ""
    return nodes + f" ({end['exclude']} left out{took})"
