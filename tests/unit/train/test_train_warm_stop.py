"""Issue 35: a stop signal while a rank waits for a new world (train/warm.py) ends the wait at once.
A real process in `warm.rejoin`, with its own flag-setting handlers (the trainer's PreemptFlag) or
none, is sent the signal; it ends within a second with the stopped rank's code and one line, no
traceback (before, only the launcher's SIGKILL after its stop grace ended it: 137)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmgen.contract import envvars, exitcodes, warm

PROGRAM = """
import logging, sys
from pathlib import Path
from slurmgen.train import warm
from slurmgen.train.preempt import PreemptFlag

logging.basicConfig(level=logging.INFO, format="%(created)f %(levelname)s %(message)s")
flag = PreemptFlag("USR2").install() if sys.argv[1] == "own" else None
began = Path(sys.argv[2])
warm.rejoin(beat=lambda: began.exists() or began.write_text("waiting"))
print("joined", flush=True)
"""


def waiting(tmp_path: Path, handlers: str) -> subprocess.Popen:
    """The program above, in its wait (its first look is done), no world written."""
    (tmp_path / "own.py").write_text(PROGRAM)
    began = tmp_path / "began"
    env = {**os.environ, envvars.WARM_DIR: str(tmp_path / "warm")}
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "own.py"), handlers, str(began)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not began.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert began.exists(), proc.communicate()
    return proc


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR2])
def test_a_stop_signal_ends_the_wait_at_once_with_the_stopped_code(tmp_path, signum):
    """The wait ends at its next look (protocol.POLL): the line is said within a fraction of a
    second; the whole exit (an interpreter with torch imported, on a loaded 2-core machine) in ~1 s."""
    proc = waiting(tmp_path, "own")
    sent, began = time.time(), time.monotonic()
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=10)
    took = time.monotonic() - began
    assert proc.returncode == exitcodes.PREEMPTED, err
    said = re.findall(rf"^([\d.]+) WARNING signal {signum.name} while {warm.WAITING}: stopping$", err, re.M)
    assert len(said) == 1 and "Traceback" not in err, err
    assert float(said[0]) - sent < 0.5 and took < 2.5, (float(said[0]) - sent, took)
    assert "joined" not in out


def test_a_program_without_handlers_dies_of_sigterm_as_in_its_step_loop(tmp_path):
    """Nothing is installed for a signal at its default action: it ends the process at once (143)."""
    proc = waiting(tmp_path, "none")
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGTERM and time.monotonic() - sent < 2.5


def test_the_program_s_own_handler_still_runs_and_is_back_after_the_wait(tmp_path):
    """The wait chains to the program's handler (its flag is set) and restores it afterwards."""
    from slurmgen.train import warm as train_warm
    from slurmgen.train.preempt import STOP, PreemptFlag

    flag = PreemptFlag("USR2").install()
    try:
        mine = signal.getsignal(signal.SIGTERM)
        with pytest.raises(train_warm.Stopped) as stopped, train_warm.stop_watch("USR2") as seen:
            assert signal.getsignal(signal.SIGTERM) is not mine
            signal.raise_signal(signal.SIGTERM)
            train_warm.wait_world(0, {envvars.WARM_DIR: str(tmp_path)}, timeout=5, stopped=seen)
        assert stopped.value.code == exitcodes.PREEMPTED and stopped.value.signum == signal.SIGTERM
        assert flag.level == STOP and signal.getsignal(signal.SIGTERM) == mine
    finally:
        flag.restore()
