"""The warning signals (USR1, USR2) are the program's: every process slurmgen runs around it
outlives them (issue 34: a USR1 killed the rank wrappers of a Lightning job, whose ranks then
trained on, orphaned, after the requeue).

Each test sends the signal the way Slurm does, to every process of the job at once (here: every
process of the launcher's session), and then looks at what is still alive. The Slurm path is
proved on the real cluster in tests/integration/test_warning_signals_slurm.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import write

from slurmgen.contract.signals import WARNINGS
from slurmgen.generate.render import LAUNCH_SCRIPT, SLURM_SCRIPT, render
from slurmgen.generate.specfile import build_spec

# A program that takes both warnings (as Lightning takes USR1), says so, and ends when told.
HANDLES = """
import os, signal, sys, time
from pathlib import Path
for s in (signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, lambda n, f: print("warned", signal.Signals(n).name, flush=True))
print("ready", os.getpid(), os.getppid(), flush=True)
while not Path(sys.argv[1]).exists():
    time.sleep(0.05)
"""
# A program that takes neither: the default action ends it.
IGNORES = """
import os, time
print("ready", os.getpid(), os.getppid(), flush=True)
time.sleep(60)
"""


def tree(root: int) -> set[int]:
    """`root` and every process below it (what Slurm signals: the job step's processes, whatever
    session or process group they moved to)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return alive(found)


def alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)}


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def warn_all(root: int, sig: signal.Signals) -> set[int]:
    """Send `sig` to every process of the tree at once; the pids it reached."""
    reached = tree(root)
    for pid in reached:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, sig)
    return reached


def ready_lines(proc: subprocess.Popen, n: int) -> list[str]:
    lines: list[str] = []
    while sum("ready" in line for line in lines) < n:
        line = proc.stdout.readline()
        assert line, f"the launcher ended before {n} ranks were ready: {lines}"
        lines.append(line)
    return lines


def start_launcher(tmp_path: Path, program: str) -> tuple[subprocess.Popen, Path]:
    done = tmp_path / "done"
    out = write(tmp_path, command=["python3", "-u", "-c", program, str(done)])
    proc = subprocess.Popen(
        [str(out / LAUNCH_SCRIPT), "127.0.0.1", "1", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return proc, done


def test_the_contract_names_both_warnings_and_every_script_traps_them():
    assert WARNINGS == ("USR1", "USR2")
    files = render(build_spec({"launcher": "torchrun"})).files
    for name in (SLURM_SCRIPT, LAUNCH_SCRIPT):
        assert "trap : USR1 USR2" in files[name], name


def test_a_warning_to_every_process_of_a_launch_reaches_the_program_and_kills_nothing(tmp_path):
    proc, done = start_launcher(tmp_path, HANDLES)
    try:
        ready = ready_lines(proc, 2)
        before = tree(proc.pid)
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            warn_all(proc.pid, sig)
            time.sleep(0.5)
        # Nothing died of it: the launcher, each rank's shell and labellers, each program.
        assert alive(before) == before, "a process of the launch died of a warning signal"
        parents = {int(line.split()[-1]) for line in ready if line.startswith("[rank")}
        assert len(parents) == 2 and parents <= tree(proc.pid)
        done.touch()
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, stderr
    for rank in (0, 1):
        for name in ("SIGUSR1", "SIGUSR2"):
            assert stdout.count(f"[rank {rank}] warned {name}") == 1, stdout  # once: nobody passed it on again
    assert alive(before) == set()


def test_a_program_without_a_handler_dies_of_the_warning_and_the_launch_says_which_rank(tmp_path):
    proc, _ = start_launcher(tmp_path, IGNORES)
    try:
        ready_lines(proc, 2)
        before = warn_all(proc.pid, signal.SIGUSR1)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGUSR1, stderr
    assert re.search(r"rank [01] \(local rank [01]\) exited with code 138", stderr), stderr
    time.sleep(0.5)
    assert alive(before) == set()


def agent_shim() -> str:
    """The Python that run_slurm.sh runs torch.distributed.run under in torchrun mode."""
    text = render(build_spec({"launcher": "torchrun"})).files[SLURM_SCRIPT]
    return re.search(r"^agent_shim='(.*?)'$", text, re.S | re.M).group(1)


def test_torchruns_agent_outlives_a_warning_and_its_workers_get_the_default_back(tmp_path):
    """Real torch.distributed.run under the script's shim: the agent survives USR1 and USR2 sent
    to every process, the worker that handles them gets each once, and the job ends as the worker does."""
    pytest.importorskip("torch")
    done = tmp_path / "done"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            agent_shim(),
            "--standalone",
            "--nproc-per-node=1",
            "--max-restarts=0",
            "--no-python",
            sys.executable,
            "-u",
            "-c",
            HANDLES,
            str(done),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        ready_lines(proc, 1)
        before = tree(proc.pid)
        assert len(before) >= 2  # the agent and its worker
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            warn_all(proc.pid, sig)
            time.sleep(0.5)
        assert alive(before) == before, "the torchrun agent or its worker died of a warning signal"
        done.touch()
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, stderr[-2000:]
    assert alive(before) == set()
    assert stdout.count("warned SIGUSR1") == 1 and stdout.count("warned SIGUSR2") == 1, stdout
