"""What `submit`, `status` and `cancel` say about a job that cannot run or did not run as asked
(issue 34): `submit` gives create's notes, `status` names a command that was not found and
reads a cancelled job as stopped, `cancel --signal` says who handles the signal. The commands run
in-process as typed; Slurm is a stand-in `sbatch` / `scontrol` on PATH answering as Slurm 22.05
does, the registry and the job's log are real files."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from helpers import run

from slurmgen.runs.registry import JobRecord, Registry

DATA = Path(__file__).parent / "data" / "slurm"


def slurm_on_path(tmp_path: Path, monkeypatch, scontrol: str = "", keep_path: bool = True) -> Path:
    """`sbatch --parsable` says job 77; `scontrol show job -o` prints `scontrol`; scancel works; no accounting.
    Without `keep_path` these are all there is on PATH (no torchrun, say)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol.txt").write_text(scontrol)
    for name, body in (
        ("sbatch", "echo 77"),
        ("scontrol", f"cat '{bin_dir}/scontrol.txt'"),
        ("sacct", "exit 1"),
        ("scancel", "exit 0"),
    ):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}" if keep_path else str(bin_dir))
    return bin_dir


def scontrol_as(name: str, job_id: str, **fields: str) -> str:
    """A recorded `scontrol show job -o` line under another id, with some fields replaced."""
    text = (DATA / name).read_text().partition("\n#")[0]
    for key, value in {"JobId": job_id, **fields}.items():
        text = re.sub(rf"\b{key}=\S*", f"{key}={value}", text, count=1)
    return text + "\n"


def registered(tmp_path: Path, log: str, **info) -> Path:
    """A registry holding job 7 ('fail', 2 nodes x 2) whose log is `log`."""
    (tmp_path / "logs").mkdir(parents=True, exist_ok=True)
    (tmp_path / "logs" / "fail-7.out").write_text(log)
    base = {"log_dir": str(tmp_path / "logs"), "workdir": str(tmp_path), "command": ["python", "train.py"]}
    base |= {"nodes": 2, "gpus": 2, "launcher": "srun", "array": None}
    path = tmp_path / "jobs.sqlite"
    with Registry.open(path, create=True) as reg:
        reg.add(JobRecord("7", "fail", str(tmp_path / "out"), 7.0, None, None, None, {**base, **info}))
    return path


def test_submit_says_what_create_says_of_a_torchrun_agent_missing_here(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    slurm_on_path(tmp_path, monkeypatch, keep_path=False)  # sbatch, but no torchrun
    argv = ("--launcher", "torchrun", "--", "accelerate", "launch", "prog.py")
    code, _, created = run(capsys, "create", "-o", "made", *argv)
    assert code == 0 and "'torchrun' is not on PATH here" in created, created
    code, out, err = run(capsys, "submit", "--registry", "r.sqlite", "--no-check", "-o", "sent", *argv)
    assert (code, out) == (0, "77\n"), err
    assert err == created  # the same note, once


# As run_slurm.sh's shells and srun --label write them (the job's log; run by hand with a
# stand-in srun, the labels and srun's report as Slurm 22.05 adds them).
TORCHRUN_NOT_FOUND = (
    "slurmgen: job 7 on node[1-2]: master node1:20007, 2 x 2 processes\n"
    "0: slurmgen-task: line 4: exec: torchrun: not found\n"
    "1: slurmgen-task: line 4: exec: torchrun: not found\n"
    "srun: error: node1: task 0: Exited with exit code 127\n"
    "srun: error: node2: task 1: Exited with exit code 127\n"
    "slurmgen: job step failed with exit code 127 (see the lines above, prefixed with the failing task id)\n"
)
RANK_NOT_FOUND = (
    "slurmgen: job 7 on node[1-2]: master node1:20007, 2 x 2 processes\n"
    "2: slurmgen-rank: line 5: no-such-prog: command not found\n"
    "2: slurmgen-exit: rank 2 on node2 (task 2) exited with code 127 at 1795851020.625713\n"
    "srun: error: node2: task 2: Exited with exit code 127\n"
    "slurmgen: rank 2 on node2 exited with code 127 first; the job exits with it (the step's code was 127)\n"
)


def test_status_of_a_job_whose_command_was_not_found_names_the_command(tmp_path, capsys, monkeypatch):
    slurm_on_path(tmp_path, monkeypatch, scontrol_as("scontrol_failed.txt", "7", ExitCode="127:0"))
    path = registered(tmp_path, TORCHRUN_NOT_FOUND, launcher="torchrun")
    code, out, err = run(capsys, "status", "7", "--registry", str(path))
    assert code == 0, err
    assert "  failed: 7 FAILED (exit code 127) task 0 on node1: torchrun: command not found\n" in out, out
    (tmp_path / "logs" / "fail-7.out").write_text(RANK_NOT_FOUND)
    code, out, err = run(capsys, "status", "7", "--registry", str(path))
    assert "  failed: 7 FAILED (exit code 127) task 2 on node2: no-such-prog: command not found\n" in out, out


def test_status_of_a_127_without_the_shells_words_still_says_not_found(tmp_path, capsys, monkeypatch):
    slurm_on_path(tmp_path, monkeypatch, scontrol_as("scontrol_failed.txt", "7", ExitCode="127:0"))
    path = registered(tmp_path, "srun: error: node1: task 1: Exited with exit code 127\n")
    code, out, err = run(capsys, "status", "7", "--registry", str(path), "--json")
    assert json.loads(out)["first_failure"]["what"] == "command not found", out


def test_cancel_signal_says_the_program_dies_of_it_only_without_a_handler(tmp_path, capsys, monkeypatch):
    # A Lightning program (its SLURMEnvironment requeues on USR1) under the default spec (USR2).
    slurm_on_path(tmp_path, monkeypatch, scontrol_as("scontrol_running.txt", "7"))
    path = registered(tmp_path, "", command=["python", "fit.py"], preempt_signal="USR2")
    code, out, err = run(capsys, "cancel", "7", "--signal", "USR1", "--registry", str(path))
    assert (code, out) == (0, "sent USR1 to 7\n"), err
    assert err == (
        "slurmgen: warning: job 7 runs `python fit.py`, which did not declare that it handles USR1 "
        "(env SLURMGEN_PREEMPT_CONTRACT=1 declares it): slurmgen's own processes ignore USR1 and the program gets "
        "it; it dies of it (exit code 138) only if it installed no handler for it (Lightning's SLURMEnvironment, "
        "for one, requeues the job on USR1)\n"
    )
    trainer = registered(tmp_path / "t", "", command=["python", "-m", "slurmgen.train"])
    code, out, err = run(capsys, "cancel", "7", "--signal", "USR1", "--registry", str(trainer))
    assert err.endswith(
        "(the bundled trainer takes only its preempt_signal, USR2): slurmgen's own processes ignore USR1 and the "
        "program gets it and dies of it, exit code 138\n"
    ), err


# A job cancelled while running, as Slurm 22.05 leaves it: every task killed by srun's stop.
CANCELLED_LOG = (
    "slurmgen: job 7 on node[1-2]: master node1:20007, 2 x 2 processes\n"
    "slurmstepd: error: *** STEP 7.0 ON node1 CANCELLED AT 2026-11-23T12:25:53 ***\n"
    "srun: error: node1: tasks 0-1: Killed\n"
    "srun: error: node2: tasks 2-3: Killed\n"
)


def test_status_of_a_cancelled_job_reads_as_stopped_not_failed(tmp_path, capsys, monkeypatch):
    slurm_on_path(tmp_path, monkeypatch, scontrol_as("scontrol_failed.txt", "7", JobState="CANCELLED", ExitCode="0:15"))
    path = registered(tmp_path, CANCELLED_LOG)
    code, out, err = run(capsys, "status", "7", "--registry", str(path))
    assert code == 0, err
    assert "  stopped: 7 CANCELLED, stopped by you (scancel)\n" in out and "failed" not in out, out
    code, out, err = run(capsys, "status", "7", "--registry", str(path), "--json")
    view = json.loads(out)
    assert view["first_failure"] is None and view["stopped"] == {
        "job": "7",
        "state": "CANCELLED",
        "exit_code": 143,  # the stop's TERM, raw, not a failure's
        "what": "stopped by you",
    }


def trained_95_s(logs: Path, start: float) -> None:
    """Job 7's timeline and attempts record: two ranks from `start`, first step at 10 s, step 850 at
    95 s, the attempt's start and no end (its batch shell was stopped before it wrote one)."""
    ranks = [
        {"event": event, "rank": rank, "attempt": 1, "time": start + t, "host": "node1", "pid": 1, **more}
        for rank in (0, 1)
        for event, t, more in (("process", 1, {}), ("first_step", 10, {"step": 1}), ("steps", 95, {"step": 850}))
    ]
    (logs / "slurmgen-7.timeline.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ranks))
    (logs / "slurmgen-7.attempts.jsonl").write_text(json.dumps({"event": "start", "attempt": 1, "time": start}) + "\n")


def test_the_goodput_of_a_job_slurm_never_said_ended_counts_to_its_last_record_and_says_so(
    tmp_path, capsys, monkeypatch
):
    """The benchmark's kept runs, looked at once its cluster was gone: Slurm answers nothing and the
    registry keeps no end (the job was running when last seen). Counted to now, a run that had
    trained 84% of its 605 s read 20% of 2,500 s, and lower at every look. It counts to the job's
    last record, and says so."""
    start = time.time() - 3600
    slurm_on_path(tmp_path, monkeypatch, "")  # the controller knows nothing, no accounting
    path = registered(tmp_path, CANCELLED_LOG)
    trained_95_s(tmp_path / "logs", start)
    code, out, err = run(capsys, "status", "7", "--registry", str(path), "--json")
    assert code == 0, err
    view = json.loads(out)
    assert view["goodput"]["wall"] == pytest.approx(95, abs=1), view["goodput"]
    assert "goodput is counted to the job's last record: nothing says when it ended" in view["notes"], view["notes"]


def test_the_goodput_of_a_cancelled_job_ends_with_the_job_not_when_status_is_asked(tmp_path, capsys, monkeypatch):
    """A cancelled job's batch shell dies before it records its last attempt's end. Goodput then
    ran to the moment `status` was asked: the benchmark's cancelled run read 79% at its end and
    47% seven minutes later. It ends where Slurm says the job ended, also once Slurm no longer
    answers (what it said last, kept in the registry)."""
    start = time.time() - 3600  # an hour ago: counted to now, goodput would be a sliver
    stamp = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))  # noqa: E731  (Slurm's local time)
    fields = {"JobState": "CANCELLED", "ExitCode": "0:15", "StartTime": stamp(start), "EndTime": stamp(start + 100)}
    bin_dir = slurm_on_path(tmp_path, monkeypatch, scontrol_as("scontrol_failed.txt", "7", **fields))
    path = registered(tmp_path, CANCELLED_LOG)
    trained_95_s(tmp_path / "logs", start)

    def goodput() -> dict:
        code, out, err = run(capsys, "status", "7", "--registry", str(path), "--json")
        assert code == 0, err
        return json.loads(out)["goodput"]

    told = goodput()
    assert told["wall"] == pytest.approx(100, abs=1) and told["goodput"] == pytest.approx(0.85, abs=0.02), told
    (bin_dir / "scontrol.txt").write_text("")  # the controller forgot the job: no answer, no accounting
    assert goodput()["wall"] == pytest.approx(told["wall"], abs=1e-3)
