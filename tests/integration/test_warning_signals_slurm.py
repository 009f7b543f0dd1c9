"""A warning signal sent to a Slurm job is the program's: no process slurmgen runs around the ranks
dies of it (issue 34, item 1). Before the fix, `slurmgen cancel JOB --signal USR1` on a job
whose spec warns with USR2 killed every rank wrapper (and, in torchrun mode, the torchrun agent),
and the ranks, orphaned outside the step, trained on after the job had ended.

On the real test cluster, in both launcher modes (and torchrun mode with a program that is not a
Python interpreter, whose agent is found through torchrun's own #! line): the ranks take the
warning (as Lightning takes USR1), every process stays, and the job ends when the ranks do, with
none of them left behind.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from helpers import sg, wait_for, wait_status

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# Each rank notes its pid and its parent's, then every warning it gets, and ends when told.
PROGRAM = """
import os, signal, sys, time
from pathlib import Path
here = Path(sys.argv[1])
rank = os.environ["RANK"]
def warned(num, frame):
    with open(here / f"warned-{rank}", "a") as f:
        f.write(signal.Signals(num).name + "\\n")
for s in (signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, warned)
(here / f"pids-{rank}").write_text(f"{os.getpid()} {os.getppid()}")
while not (here / "done").exists():
    time.sleep(0.05)
"""


def alive(pid: int) -> bool:
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False


@pytest.mark.parametrize(
    "launcher, wrap",
    [("srun", False), ("torchrun", False), ("torchrun", True)],
    ids=["srun", "torchrun-python", "torchrun-bash"],
)
def test_a_users_usr1_reaches_the_ranks_and_orphans_none(cluster, tmp_path, launcher, wrap):
    here = tmp_path / "shared"
    here.mkdir()
    program = [sys.executable, "-u", "-c", PROGRAM, str(here)]
    if wrap:  # not a Python interpreter: torchrun from PATH runs the agent
        program = ["bash", "-c", 'exec "$@"', "run", *program]
    job = sg(
        cluster,
        tmp_path,
        "submit",
        *("--nodes", "2", "--gpus", "2", "--backend", "gloo", "--time", "5", "--launcher", launcher),
        "-o",
        "out",
        "--",
        *program,
    ).stdout.strip()
    wait_for(lambda: len(list(here.glob("pids-*"))) == 4, 90, "4 ranks running")
    pids = {int(p) for f in here.glob("pids-*") for p in f.read_text().split()}  # ranks and their wrappers
    assert all(alive(p) for p in pids), pids

    sent = sg(cluster, tmp_path, "cancel", job, "--signal", "USR1")
    assert sent.stdout.strip() == f"sent USR1 to {job}", sent.stdout + sent.stderr
    wait_for(lambda: len(list(here.glob("warned-*"))) == 4, 30, "every rank warned")
    time.sleep(2)  # long enough for a wrapper or an agent to die of it, as they did
    assert [p for p in pids if not alive(p)] == [], "a rank or its wrapper died of the warning"
    assert wait_status(cluster, tmp_path, job, {"RUNNING"})["state"] == "RUNNING"

    (here / "done").touch()
    view = wait_status(cluster, tmp_path, job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=90)
    assert (view["state"], view["exit_code"]) == ("COMPLETED", 0), view
    for rank in range(4):  # once each: nobody passed it on a second time
        assert (here / f"warned-{rank}").read_text() == "SIGUSR1\n", rank
    wait_for(lambda: not any(alive(p) for p in pids), 10, "no process of the job left")
    assert os.path.exists(tmp_path / "out" / "run_slurm.sh")
