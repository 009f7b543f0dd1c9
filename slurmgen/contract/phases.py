"""The words of the timeline protocol: what a rank, a launcher or Slurm says happened, and when.

Every rank appends JSON lines to $SLURMGEN_TIMELINE_FILE (observe/timeline_writer.py writes them,
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

A program that says only `beat(step=...)` gets `imports` and `rendezvous` inferred (marked
`"inferred": true`): imports when it imported slurmgen, the rendezvous at its first step at
the latest, when torch.distributed was initialised by then.

A launcher writes the phases it sees itself into the same file, for any program: `process`
when it started the rank, `end` when the rank exited (with `code`, its exit code); its lines
carry `"by": "launcher"` (BY_LAUNCHER). The reader takes each phase's first time, so a
program's own `end` (written before it exits) comes first and the launcher's adds its status.
Restarts are the attempts: each launcher numbers them (`attempt`) and records when each
started and ended (the attempts record of run_slurm.sh; the run registry for launch and group).
A warm restart (contract/warm.py) is no new attempt: the ranks' lines in its new world carry
`generation` (GENERATION; absent in the job's first world, 0), and every rank of it, the ones
that kept their process too, writes `first_step` again there, so that the time from the fault
to every rank stepping again can be read off the file (observe/goodput.py).
"""

from __future__ import annotations

import time

# When this process imported slurmgen (whose __init__ imports this module): a program patched
# with only `from slurmgen import beat` among its imports has its imports done about then
# (slurmgen.beat writes `imports` there, marked `"inferred": true`, unless told better).
IMPORTED_AT = time.time()

PROCESS = "process"
IMPORTS = "imports"
RENDEZVOUS = "rendezvous"
FIRST_STEP = "first_step"
STEPS = "steps"
CHECKPOINT = "checkpoint"
END = "end"

# The field of a line written in a warm restart's world: its generation (contract/warm.py).
GENERATION = "generation"

# The `by` of a line a launcher wrote (a rank's own lines have none).
BY_LAUNCHER = "launcher"

# The once-per-attempt phases of a rank, in the order they happen (the timeline's columns).
PHASES = (PROCESS, IMPORTS, RENDEZVOUS, FIRST_STEP, END)
EVENTS = frozenset({*PHASES, STEPS, CHECKPOINT})
