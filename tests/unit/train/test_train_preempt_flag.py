"""The preemption flag's two meanings: the warning signal may requeue the job, TERM never does."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import pytest

from slurmgen.train.preempt import NONE, REQUEUE, STOP, PreemptFlag, after_preemption


@pytest.fixture
def flag():
    f = PreemptFlag("USR2").install()
    yield f
    f.restore()


def scontrol_in(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A PATH whose scontrol only records its arguments (and says the job is requeueable)."""
    calls, bin_dir = tmp_path / "calls", tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "scontrol"
    exe.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n[ "$1" = show ] && echo "JobId=$4 Requeue=1"\nexit 0\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return {"SLURM_JOB_ID": "55", "PATH": f"{bin_dir}:{os.environ['PATH']}"}, calls


def test_term_outranks_the_warning_whatever_the_order(flag):
    assert flag.level == NONE
    os.kill(os.getpid(), signal.SIGUSR2)
    assert flag.level == REQUEUE
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGUSR2)
    assert flag.level == STOP and flag.signum == signal.SIGUSR2


def test_the_warning_signal_requeues(flag, tmp_path):
    environ, calls = scontrol_in(tmp_path)
    os.kill(os.getpid(), signal.SIGUSR2)
    assert after_preemption(REQUEUE, flag, environ, True) == (False, "asked Slurm to requeue job 55")
    assert calls.read_text().splitlines() == ["requeue 55"]


@pytest.mark.parametrize("voted, own", [(STOP, None), (STOP, signal.SIGUSR2), (REQUEUE, signal.SIGTERM)])
def test_term_anywhere_never_requeues(flag, tmp_path, voted, own):
    """TERM on any rank (the vote says STOP), or on rank 0 after a warning's vote (scancel during
    the checkpoint): scancel must end the job, so scontrol is not even asked."""
    environ, calls = scontrol_in(tmp_path)
    if own is not None:
        os.kill(os.getpid(), own)
    warn, said = after_preemption(voted, flag, environ, True)
    assert not warn and said.startswith(
        "SIGTERM (scancel, a preemption or the launcher stopping the run): not requeueing"
    )
    assert not calls.exists()
