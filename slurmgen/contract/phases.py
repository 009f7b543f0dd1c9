"""The words of the timeline protocol: what a rank, a launcher or Slurm says happened, and when.

Every rank appends JSON lines to $SLURMGEN_TIMELINE_FILE (observe/record.py writes them,
observe/timeline.py reads them). Each line has `event` (one of the names below), `rank`,
`attempt`, `time` (the writer's clock, seconds since the epoch), `host` and `pid`; some add:

  process      when the OS started the rank's process (from /proc: what its launcher did)
  imports      the program's imports are done (the trainer: before the process group)
  rendezvous   init_process_group returned: every rank has joined
  first_step   the first step of this attempt is done; `step` says which
  steps        a sample, at most one per heartbeat period: `step`, and `work`, the seconds the
               rank spent working (not waiting in a collective) since the previous sample
  checkpoint   a checkpoint's stall ended: `step`, `stall` (seconds the ranks waited)
  end          the rank stopped: `status` (a heartbeat status word: done, failed, preempted)
"""

from __future__ import annotations

PROCESS = "process"
IMPORTS = "imports"
RENDEZVOUS = "rendezvous"
FIRST_STEP = "first_step"
STEPS = "steps"
CHECKPOINT = "checkpoint"
END = "end"

# The once-per-attempt phases of a rank, in the order they happen (the timeline's columns).
PHASES = (PROCESS, IMPORTS, RENDEZVOUS, FIRST_STEP, END)
EVENTS = frozenset({*PHASES, STEPS, CHECKPOINT})
