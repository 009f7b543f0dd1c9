"""Preemption: a signal sets a flag, the step loop acts on it, Slurm may be asked to requeue.

Why a flag and not work in the handler: the signal may arrive in the middle of a collective
or of a checkpoint write. The handler only records it; at the next step boundary all ranks
all-reduce the flag (so a signal that reached only some ranks still stops all of them at the
same step), rank 0 writes a checkpoint, and every process exits with EXIT_PREEMPTED (75).

Two signals, two meanings. The warning signal is --preempt-signal (USR2 by default, what
generated scripts ask Slurm for with `#SBATCH --signal=USR2@<lead>`; NCCL may use USR1 itself,
see the README): the time limit is near, so checkpoint and requeue the job (the only case where
the trainer runs `scontrol requeue`). SIGTERM is what scancel, a preemption, torchrun and
launch_multi_node.sh send: checkpoint and stop, never requeue, or `slurmgen cancel` would put
the job back in the queue; where preemption should requeue, Slurm does that itself
(PreemptMode=REQUEUE). So the flag is a level: STOP (TERM) outranks REQUEUE (the warning) in
the ranks' MAX vote, and a TERM that arrives after the vote still cancels the requeue.
"""

from __future__ import annotations

import logging
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping

log = logging.getLogger("slurmgen.train")


# What a rank saw, as voted (MAX over ranks): nothing, the warning signal, TERM.
NONE, REQUEUE, STOP = 0, 1, 2


class PreemptFlag:
    """Installs handlers for the warning signal and SIGTERM; `level` says which arrived (STOP wins)."""

    def __init__(self, warning: str = "USR2") -> None:
        self.signals = (signal.Signals[f"SIG{warning}"], signal.SIGTERM)
        self.signum: int | None = None
        self.level = NONE
        self._previous: dict[int, object] = {}

    def _handler(self, signum: int, frame: object) -> None:
        self.signum = signum
        self.level = max(self.level, STOP if signum == signal.SIGTERM else REQUEUE)

    def install(self) -> PreemptFlag:
        if threading.current_thread() is not threading.main_thread():
            names = "/".join(s.name for s in self.signals)
            log.warning("not in the main thread: %s will not trigger a checkpoint", names)
            return self
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handler)
        return self

    def restore(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)  # type: ignore[arg-type]
        self._previous.clear()


def _job_requeueable(exe: str, job: str, timeout: float) -> bool | None:
    """Requeue=1 in `scontrol show job`? None when scontrol cannot tell."""
    try:
        done = subprocess.run([exe, "show", "job", "-o", job], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"\bRequeue=(\d)", done.stdout)
    return None if done.returncode != 0 or m is None else m.group(1) == "1"


def after_preemption(
    voted: int, flag: PreemptFlag, environ: Mapping[str, str], wanted: bool | None
) -> tuple[bool, str]:
    """Rank 0's last act of a preempted run: requeue for the warning signal only.

    `voted` is the ranks' agreed level; `flag` is this rank's own, read now, so that a TERM
    that came after the vote (scancel during the checkpoint) still cancels the requeue."""
    if max(voted, flag.level) >= STOP:
        return False, (
            "SIGTERM (scancel, a preemption or the launcher stopping the run): not requeueing; "
            "where preemption requeues, Slurm does it; run the same command again to resume"
        )
    return request_requeue(environ, wanted)


def request_requeue(environ: Mapping[str, str], wanted: bool | None, timeout: float = 30.0) -> tuple[bool, str]:
    """Ask Slurm to requeue this job if wanted; return (worth a warning?, what happened).

    wanted None means "if the job is requeueable" (sbatch --requeue, as scontrol reports it).
    Never raises: a missing scontrol (a container without Slurm's client) or a refusal only
    changes the message; the caller exits with EXIT_PREEMPTED either way, so a wrapper or a
    person can restart the run, which resumes from the checkpoint just written.
    """
    if wanted is False:
        return (
            False,
            "requeue is off (--no-requeue, or SLURMGEN_REQUEUE=0 from a spec with requeue: false): "
            "restart the run to resume",
        )
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job:
        return False, "not a Slurm job (SLURM_JOB_ID unset): not requeueing; restart the run to resume"
    exe = shutil.which("scontrol", path=environ.get("PATH"))
    if exe is None:
        return True, f"scontrol not found (inside a container?): cannot requeue job {job}; restart it to resume"
    if wanted is None:
        requeueable = _job_requeueable(exe, job, timeout)
        if not requeueable:
            # Requeue=0: submitted with --no-requeue, or since a person's "checkpoint and stop"
            # (jobs/stopping.keep_from_requeue), whose job Slurm would refuse to requeue anyway.
            why = "is not requeueable (Requeue=0)" if requeueable is False else "cannot be checked"
            return requeueable is None, f"job {job} {why}: not requeueing (--requeue forces it); restart it to resume"
    try:
        done = subprocess.run([exe, "requeue", job], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return True, f"scontrol requeue {job} failed: {exc}"
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        return True, f"scontrol requeue {job} failed ({detail[0] if detail else 'exit ' + str(done.returncode)})"
    return False, f"asked Slurm to requeue job {job}"
