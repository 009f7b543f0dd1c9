"""The warning signals: what Slurm sends before it stops a job, and what a program may take as
"checkpoint now". Pure, import-free.

USR1 and USR2 end a process by default, and nobody sends them to stop a job (TERM, INT and KILL
mean "stop"): `#SBATCH --signal=USR2@90` (the spec's preempt_signal, either of them) warns of
the time limit, Lightning requeues on USR1, and `slurmgen cancel --signal` sends either. They are
for the user's program, which decides: every process slurmgen itself runs around it (the rank
wrappers and their log labellers, the torchrun agent, the launchers, the node link, the
coordinator's agent) outlives both, so that a warning never leaves a rank running without the
process that would stop it (issue 34: a USR1 orphaned a Lightning job's ranks, which trained on
after the requeue).
"""

from __future__ import annotations

WARNINGS = ("USR1", "USR2")
