"""The wire between `slurmgen launch` and a node. Pure (imports only the contract).

Launcher -> node, on the SSH session's stdin: a length line and the bootstrap, then the
payload (`PAYLOAD_MAGIC script_len env_len`, the node script, the environment, `PAYLOAD_END`);
stdin then stays open as the node's lifeline (see templates/launch_bootstrap.sh.j2): the
launcher writes `LIFELINE_PING` on it every keepalive interval, and a node that reads nothing
for `lifeline_silence(keepalive)` seconds stops its ranks. A dropped network never closes
the session (no FIN arrives), so the node must judge the silence itself; the launcher counts
the host lost after the same silence, and both sides of a partition stop on their own.
Once the launcher has judged a rank of the node hung it writes `STACK_ASK RANK` on it instead:
the node takes that rank's Python stack (templates/hang_stack.sh.j2, the Slurm watcher's
take_stack) and answers with a `stack` event; the launcher stops every node on the answer, or
`STACK_ASK_WAIT` seconds after asking without one. With warm restarts (contract/warm.py) it writes
`WARM_WORD GENERATION MASTER_ADDR MASTER_PORT WORLD_SIZE [RANK...]` on every node after a rank
failed: the bootstrap writes the world where the node's ranks wait for it, and orders each RANK
named (the failed ones of that node) started anew.

Node -> launcher, on two streams of the same session:
- stdout: everything the ranks and the node scripts print, shown to the user as is. Nothing
  on it is ever interpreted, so a rank may print any bytes, stop mid-line, or print a line
  that looks like an event.
- stderr: node events only, one line each, written by the bootstrap and the node script
  through a file descriptor no rank holds:

      slurmgen-event-1 started
      slurmgen-event-1 exited RANK CODE      a rank ended with a non-zero code
      slurmgen-event-1 hung RANK MS          a rank's heartbeat is MS milliseconds old
      slurmgen-event-1 beats R:STEP:MS:STATE[:LIMIT] ...   the ranks of the node silent for over half
                                             the heartbeat timeout, every poll while there are
                                             any (then once with none): STEP "-" when the beat
                                             has none, STATE "stopped" when the rank's process
                                             is (SIGSTOP, a debugger), "waiting" in a phase
                                             nothing bounds (a first checkpoint: never hung,
                                             it waited), else "running". The
                                             launcher judges the hang across every node's
                                             beats (slurmgen/contract/blame.py).
      slurmgen-event-1 error MESSAGE         the node could not start (bad payload, workdir...)
      slurmgen-event-1 stack RANK[\tFRAME...] the answer to STACK_ASK: the innermost frames of the
                                             rank's main thread, innermost first, each
                                             "FILE:LINE FUNCTION", tab-separated (none: no stack
                                             could be taken); the whole dump is in the node's log
                                             directory, stack-rank-RANK.txt

  Anything else arriving on stderr (bash's own complaint before the bootstrap runs, say) is
  shown as a node message.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurmgen.contract.blame import LastBeat
from slurmgen.contract.hangs import STACK_WAIT

PAYLOAD_MAGIC = "slurmgen-payload-1"
# The payload's last line: seen only if every byte before it arrived.
PAYLOAD_END = "slurmgen-payload-end"
EVENT_TAG = "slurmgen-event-1"
# The node script writes its events to this descriptor when the bootstrap sets
# SLURMGEN_EVENT_FD to it; run by hand (`create`), it writes none.
EVENT_FD = 9
# Keepalives: like ssh's ServerAliveInterval 5 and ServerAliveCountMax 3 (`--keepalive`).
KEEPALIVE_INTERVAL = 5.0
KEEPALIVE_COUNT = 3
# One line, one byte: per node a byte every few seconds, next to the SSH keepalive's packet.
LIFELINE_PING = b"\n"
STACK_ASK = "stack"
WARM_WORD = "warm-world"
# How long the launcher waits for the stack it asked for before it stops every node anyway: the
# node's own wait for the dump (contract/hangs.py STACK_WAIT) and a round trip.
STACK_ASK_WAIT = STACK_WAIT + 0.5


def lifeline_silence(keepalive: float) -> float:
    """Seconds without a keepalive after which each side gives the other up (20 s by default):
    the launcher counts the host lost, the node stops its ranks."""
    return keepalive * (KEEPALIVE_COUNT + 1)


@dataclass(frozen=True)
class NodeEvent:
    """One event line from a node: `started`, `exited` (rank, code), `hung` (rank, ms),
    `beats` (its quiet ranks' beats), `stack` (rank, frames), `error` (message)."""

    kind: str
    rank: int | None = None
    value: int | None = None
    message: str = ""
    beats: tuple[LastBeat, ...] = ()
    frames: tuple[str, ...] = ()  # `stack`: "FILE:LINE FUNCTION", innermost first


def _beat(word: str) -> LastBeat | None:
    """One `RANK:STEP:MS:STATE[:LIMIT_MS]` word of a beats event (None: malformed); LIMIT_MS is
    the rank's own (learned) limit when it has one. STATE: stopped, running, or waiting (in a
    phase nothing bounds: contract/blame.py's `judged`)."""
    parts = word.split(":")
    if (
        len(parts) not in (4, 5)
        or not (parts[0].isdigit() and parts[2].isdigit())
        or parts[3] not in ("stopped", "running", "waiting")
    ):
        return None
    if len(parts) == 5 and not parts[4].isdigit():
        return None
    if not (parts[1].isdigit() or parts[1] == "-"):
        return None
    step = int(parts[1]) if parts[1] != "-" else None
    limit = int(parts[4]) if len(parts) == 5 and int(parts[4]) > 0 else None
    return LastBeat(
        int(parts[0]), int(parts[2]), step, parts[3] == "stopped", limit_ms=limit, judged=parts[3] != "waiting"
    )


def parse_event(line: str) -> NodeEvent | None:
    """The event on one stderr line, or None if the line is not a well-formed event."""
    tag, _, rest = line.partition(" ")
    if tag != EVENT_TAG:
        return None
    kind, _, args = rest.partition(" ")
    if kind == "started" and not args:
        return NodeEvent("started")
    if kind == "error":
        return NodeEvent("error", message=args.strip() or "the node could not start")
    if kind == "beats":
        beats = [_beat(w) for w in args.split()]
        return None if None in beats else NodeEvent("beats", beats=tuple(b for b in beats if b is not None))
    if kind == "stack":
        rank, *frames = args.split("\t")
        return NodeEvent("stack", int(rank), frames=tuple(f for f in frames if f)) if rank.isdigit() else None
    if kind in ("exited", "hung"):
        words = args.split()
        if len(words) == 2 and all(w.isdigit() for w in words):
            return NodeEvent(kind, int(words[0]), int(words[1]))
    return None
