"""Parsing what Slurm says, on output recorded from the test cluster's Slurm 22.05.8
(tests/unit/jobs/data/slurm/, README.md there: `scontrol show job -o` in every state, an array,
srun's own error lines in a job log, and `sacct --parsable2` from its slurmdbd for completed,
failed, cancelled, array and requeued jobs, and from before it had accounting)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from slurmgen.jobs.logs import follow, format_line, select_lines, tasks_on_node
from slurmgen.jobs.slurm import (
    QueryResult,
    expand_tasks,
    first_rank_exit,
    parse_sacct,
    parse_scontrol,
    split_label,
    task_exits,
    valid_job_id,
)
from slurmgen.jobs.view import exit_code, overall

DATA = Path(__file__).parent / "data" / "slurm"


def recorded(name: str) -> str:
    return (DATA / name).read_text()


def answer(name: str) -> tuple[str, str, int]:
    """A recorded command's stdout, stderr and exit status (`#STDERR`, `#RC` mark them)."""
    body, _, code = recorded(name).rpartition("\n#RC ")
    out, _, err = body.partition("\n#STDERR\n")
    return out, err, int(code)


def test_running_job():
    (job,) = parse_scontrol(recorded("scontrol_running.txt"))
    assert (job.key, job.name, job.state, job.reason, job.nodes, job.limit) == (
        "1",
        "rec",
        "RUNNING",
        None,
        "node[1-2]",
        "00:05:00",
    )
    assert (job.restarts, job.exit_code, job.ended) == (0, 0, False)
    assert job.stdout.endswith("/rec-1.out") and job.workdir.endswith("test_record0")


def test_pending_reasons_and_end_states():
    (held,) = parse_scontrol(recorded("scontrol_pending_held.txt"))
    assert (held.state, held.reason, held.nodes) == ("PENDING", "JobHeldUser", None)
    (failed,) = parse_scontrol(recorded("scontrol_failed.txt"))
    assert (failed.state, failed.exit_code, failed.signal, failed.ended, exit_code(failed)) == ("FAILED", 3, 0, True, 3)
    (cancelled,) = parse_scontrol(recorded("scontrol_cancelled.txt"))
    assert (cancelled.state, cancelled.ended) == ("CANCELLED", True)
    (done,) = parse_scontrol(recorded("scontrol_completed.txt"))
    assert (done.state, done.elapsed, exit_code(done)) == ("COMPLETED", "00:00:04", 0)


def test_array_tasks_and_the_pending_range():
    jobs = parse_scontrol(recorded("scontrol_array.txt"))
    assert [(j.key, j.job_id, j.state) for j in jobs] == [
        ("4_2-3%2", "4", "PENDING"),
        ("4_1", "6", "RUNNING"),
        ("4_0", "5", "RUNNING"),
    ]
    assert jobs[0].reason == "JobArrayTaskLimit"
    snap = QueryResult()
    for j in jobs:
        snap.add(j)
    assert [j.key for j in snap.tasks_of("4")] == ["4_0", "4_1", "4_2-3%2"]
    assert "4" not in snap.jobs  # a task's own id must not stand for the whole array
    assert overall(snap.tasks_of("4")) == ("RUNNING", None)
    done = parse_scontrol(recorded("scontrol_array_done.txt"))
    assert overall(done) == ("COMPLETED", 0) and sorted(j.array_task for j in done) == ["0", "1", "2", "3"]


@pytest.mark.parametrize("word", ["REQUEUE_HOLD", "REQUEUE_FED", "STOPPED", "SUSPENDED", "COMPLETING"])
def test_a_held_requeued_or_stopped_task_is_still_going_not_a_failure(word):
    # `scontrol requeuehold`, a federation's requeue, `scontrol suspend` or SIGSTOP: the job lives on.
    from slurmgen.jobs.slurm import SlurmJob

    tasks = [SlurmJob(job_id="9_0", state="COMPLETED", exit_code=0), SlurmJob(job_id="9_1", state=word, exit_code=0)]
    assert overall(tasks) == (word, None) and exit_code(tasks[1]) is None


def test_the_failing_task_comes_from_srun_in_the_log():
    log = recorded("log_fail.txt")
    (exit_,) = task_exits(log)
    assert (exit_.node, exit_.tasks, exit_.code) == ("node1", (1,), 3)
    more = task_exits("srun: error: gn7: tasks 4-5,7: Killed\nsrun: error: gn6: task 0: Exited with exit code 9\n")
    assert [(e.node, e.tasks, e.code) for e in more] == [("gn7", (4, 5, 7), None), ("gn6", (0,), 9)]


def test_the_rank_that_failed_first_comes_from_the_rank_notes():
    # torchrun: srun names only the nodes' agents (tasks 1 and 0); the notes name the ranks, and
    # the earliest note wins whatever order srun relayed them in. Older scripts wrote no task.
    log = (
        "0: slurmgen-exit: rank 0 on gn1 (task 0) exited with code 1 at 100.9\n"
        "1: slurmgen-exit: rank 3 on gn2 (task 1) exited with code 5 at 100.25\n"
        "srun: error: gn2: task 1: Exited with exit code 1\n"
    )
    assert first_rank_exit(log) == {"rank": 3, "node": "gn2", "task": 1, "exit_code": 5}
    assert first_rank_exit("2: slurmgen-exit: rank 2 on gn1 exited with code 9 at 5.5\n") == {
        "rank": 2,
        "node": "gn1",
        "task": None,
        "exit_code": 9,
    }
    assert first_rank_exit(recorded("log_fail.txt")) is None


def test_label_prefixes_split_ranks():
    lines = recorded("log_rec.txt").splitlines()
    assert sorted(split_label(line) for line in lines) == [(r, f"hi {r}") for r in range(4)]
    assert split_label(" 12: padded") == (12, "padded") and split_label("slurmgen: job 5") == (None, "slurmgen: job 5")
    # Under srun a task is a rank: (task, rank, text).
    assert select_lines(["0: a", "1: b", "plain", "1: c"], {1}) == [(1, 1, "b"), (1, 1, "c")]
    assert select_lines(["0: a", "plain"], None) == [(0, 0, "a"), (None, None, "plain")]
    assert select_lines(["0: a", "1: b", "plain", "1: c"], None, {1}) == [(1, 1, "b"), (1, 1, "c")]
    assert tasks_on_node(1, 4, "srun") == {4, 5, 6, 7} and tasks_on_node(1, 4, "torchrun") == {1}


def test_torchrun_logs_name_the_node_for_the_agent_and_the_rank_for_each_worker():
    """Under torchrun srun's label is the node's agent: `[rank 1] RANK=3` was shown for rank 3's
    line. Each worker's own `[rank R] ` tag (run_slurm.sh) names the rank; untagged lines, the node."""
    log = [
        " 0: [rank 0] RANK=0",
        " 1: [rank 3] RANK=3",
        " 1: W1125 torchrun says",
        " 1: [rank 2] RANK=2",
        "slurmgen: job 5",
        " 0: [rank 1] [rank 9] printed by the program",
    ]
    lines = select_lines(log, None, torchrun=True)
    assert [format_line(line, colour=False) for line in lines] == [
        "[rank 0] RANK=0",
        "[rank 3] RANK=3",
        "[node 1] W1125 torchrun says",
        "[rank 2] RANK=2",
        "slurmgen: job 5",
        "[rank 1] [rank 9] printed by the program",
    ]
    assert select_lines(log, None, {3}, torchrun=True) == [(1, 3, "RANK=3")]
    assert [line.text for line in select_lines(log, {1}, torchrun=True)] == ["RANK=3", "W1125 torchrun says", "RANK=2"]


def sacct(name: str):
    return parse_sacct(answer(name)[0])


def test_sacct_completed_and_failed_jobs_with_their_steps():
    (done,), steps = sacct("sacct_completed.txt")
    assert (done.key, done.job_id, done.name, done.state, done.nodes, done.limit, done.workdir, done.source) == (
        "1",
        "1",
        "done",
        "COMPLETED",
        "node[1-2]",
        "00:05:00",
        "/tmp/h-rawid.F28n/rec/work",
        "sacct",
    )
    assert steps == {"1": [("batch", "COMPLETED", 0), ("0", "COMPLETED", 0), ("1", "COMPLETED", 0)]}
    (plain,), steps = sacct("sacct_failed_no_kill.txt")
    assert (plain.state, exit_code(plain), steps) == ("FAILED", 7, {"3": [("batch", "FAILED", 7), ("0", "FAILED", 7)]})
    # srun --kill-on-bad-exit: the failing task's own code is gone from sacct; the step it
    # cancelled says 0:15, which reads as a shell would say it.
    (killed,), steps = sacct("sacct_failed.txt")
    assert (killed.state, exit_code(killed), steps["2"]) == (
        "FAILED",
        15,
        [("batch", "FAILED", 15), ("0", "CANCELLED", 143)],
    )
    # A slurmgen job keeps the first failing rank's code in its batch step.
    (job,), steps = sacct("sacct_slurmgen_failed.txt")
    assert (exit_code(job), steps["9"]) == (3, [("batch", "FAILED", 3), ("0", "FAILED", 15)])


def test_sacct_cancelled_array_and_several_jobs():
    (cancelled,), steps = sacct("sacct_cancelled.txt")
    assert (cancelled.state, cancelled.ended, exit_code(cancelled)) == ("CANCELLED", True, 1)  # "CANCELLED by 0", 0:0
    # The batch shell, sent SIGTERM, sometimes ends on its own first (FAILED 15:0 in this recording)
    # and sometimes is killed by the signal (CANCELLED 0:15); the step srun ran is cancelled.
    assert steps["4"] == [("batch", "FAILED", 15), ("0", "CANCELLED", 143)]
    tasks, steps = sacct("sacct_array.txt")
    # Each task's own id (JobIDRaw) is its own: the last task got the array's id, the others new ones.
    assert [(t.key, t.job_id, t.array_job_id, t.array_task, t.state, exit_code(t)) for t in tasks] == [
        ("5_0", "7", "5", "0", "COMPLETED", 0),
        ("5_1", "8", "5", "1", "FAILED", 2),
        ("5_2", "5", "5", "2", "COMPLETED", 0),
    ]
    assert steps["5_1"] == [("batch", "FAILED", 2), ("0", "FAILED", 2)] and overall(tasks) == ("FAILED", 2)
    jobs, steps = sacct("sacct_several.txt")
    assert [j.key for j in jobs] == ["1", "5_0", "5_1", "5_2"] and sorted(steps) == ["1", "5_0", "5_1", "5_2"]
    assert [j.job_id for j in jobs] == ["1", "7", "8", "5"]


def test_sacct_requeued_job_is_its_last_run():
    (job,), steps = sacct("sacct_requeued.txt")
    assert (job.key, job.job_id, job.state, job.restarts, job.nodes, job.elapsed) == (
        "6",
        "6",
        "COMPLETED",
        1,
        "node1",
        "00:00:04",
    )
    assert steps == {"6": [("batch", "COMPLETED", 0), ("0", "COMPLETED", 0)]}  # not the cancelled first run's


@pytest.mark.parametrize(
    "text, ok",
    [
        ("1", True),
        ("1234_5", True),
        ("0", False),
        ("12_", False),
        ("1_2_3", False),
        ("-3", False),
        ("12.0", False),
        ("", False),
    ],
)
def test_job_ids(text, ok):
    assert valid_job_id(text) is ok


def test_pending_ranges():
    assert expand_tasks("2-3%2") == ["2", "3"] and expand_tasks("0,4-8:2") == ["0", "4", "6", "8"]


def test_follow_reads_to_the_end_after_the_job_ended():
    chunks = [b"0: a\n1: b", b"\n", b"", b"0: last"]
    states = iter([False, False, False, True])
    read_at = []

    def read(offset):
        read_at.append(offset)
        return chunks.pop(0) if chunks else b""

    lines = list(follow(read, lambda: next(states), sleep=lambda s: None))
    assert lines == ["0: a", "1: b", "0: last"] and read_at == [0, 9, 10, 10]


class Recorded:
    """A runner that answers each Slurm command with a recorded file: stdout, #STDERR, #RC."""

    where = "local"

    def __init__(self, answers: dict[str, str]):
        self.answers, self.calls = answers, []

    def run(self, argv, **kwargs):
        from slurmgen.jobs.slurm_runner import Result

        self.calls.append(argv[0])
        out, err, code = answer(self.answers[argv[0]])
        return Result(code, out, err)


def test_a_job_the_controller_forgot_without_accounting_gets_a_clear_note():
    from slurmgen.jobs.query import ask

    runner = Recorded({"scontrol": "scontrol_bad.txt", "sacct": "sacct_disabled.txt"})
    snap = ask(runner, ["999999"])
    assert snap.jobs == {} and runner.calls == ["scontrol", "sacct"]
    assert snap.notes == [
        "sacct: Slurm accounting storage is disabled; showing the last state slurmgen saw for "
        "1 job(s) the controller no longer knows"
    ]
    known = ask(Recorded({"scontrol": "scontrol_completed.txt"}), ["1"])
    assert known.jobs["1"].state == "COMPLETED" and known.notes == []


def test_a_job_the_controller_forgot_comes_from_sacct_with_its_steps():
    from slurmgen.jobs.query import ask

    runner = Recorded({"scontrol": "scontrol_bad.txt", "sacct": "sacct_requeued.txt"})
    snap = ask(runner, ["6"])
    assert runner.calls == ["scontrol", "sacct"] and snap.notes == []
    assert (snap.jobs["6"].state, snap.jobs["6"].source, snap.jobs["6"].restarts) == ("COMPLETED", "sacct", 1)
    assert snap.steps["6"] == [("batch", "COMPLETED", 0), ("0", "COMPLETED", 0)]
    # Without steps asked for, a job the controller knows costs no sacct call.
    known = Recorded({"scontrol": "scontrol_completed.txt"})
    assert ask(known, ["1"]).steps == {} and known.calls == ["scontrol"]


def test_steps_for_status_come_from_sacct_while_scontrol_stays_the_source_of_the_job():
    from slurmgen.jobs.query import ask

    runner = Recorded({"scontrol": "scontrol_completed.txt", "sacct": "sacct_completed.txt"})
    snap = ask(runner, ["1"], steps=True)
    assert runner.calls == ["scontrol", "sacct"] and snap.notes == []
    assert (snap.jobs["1"].source, snap.jobs["1"].elapsed) == ("scontrol", "00:00:04")  # not sacct's 00:00:00
    assert [s for s, _, _ in snap.steps["1"]] == ["batch", "0", "1"]
    # Without accounting the job itself is known: nothing to say, no steps.
    quiet = ask(Recorded({"scontrol": "scontrol_completed.txt", "sacct": "sacct_disabled.txt"}), ["1"], steps=True)
    assert (quiet.steps, quiet.notes, quiet.jobs["1"].state) == ({}, [], "COMPLETED")


def _silent_slurm(tmp_path, monkeypatch, answer_sacct: bool = False, answer_scontrol: bool = False) -> Path:
    """`scontrol` and `sacct` on PATH that hang as a down controller makes them (or answer at
    once, as one that forgot the job), counting calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for name in ("scontrol", "sacct"):
        answers = answer_sacct if name == "sacct" else answer_scontrol
        body = "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1" if answers else "exec sleep 30"
        (bin_dir / name).write_text(f'#!/bin/sh\necho {name} >> "{calls}"\n{body}\n')
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return calls


def test_a_silent_controller_is_asked_twice_within_the_bound_and_named_once(tmp_path, monkeypatch):
    from slurmgen.jobs.query import ask
    from slurmgen.jobs.slurm_runner import LocalRunner

    calls = _silent_slurm(tmp_path, monkeypatch, answer_sacct=True)
    started = time.monotonic()
    snap = ask(LocalRunner(), ["5", "6", "7"], accounting=False)
    took = time.monotonic() - started
    # One scontrol, asked twice (a second id would wait as long): 2 x 0.8 s, not 3 x 18 s.
    assert calls.read_text().split() == ["scontrol", "scontrol"] and took < 2.4, took
    assert (
        snap.jobs == {}
        and snap.unanswered == "the Slurm controller does not answer (scontrol: no answer within 0.8 s, 2 tries)"
    )
    assert snap.notes == [snap.unanswered]


def test_the_slurm_timeout_is_a_setting_and_a_bad_one_is_one_line(tmp_path, monkeypatch):
    from slurmgen.errors import SlurmgenError
    from slurmgen.jobs.query import ask
    from slurmgen.jobs.slurm_runner import LocalRunner

    _silent_slurm(tmp_path, monkeypatch)
    monkeypatch.setenv("SLURMGEN_SLURM_TIMEOUT", "0.2")
    snap = ask(LocalRunner(), ["5"], steps=True)  # sacct is not asked: it lags the controller
    assert snap.notes == ["the Slurm controller does not answer (scontrol: no answer within 0.2 s, 2 tries)"]
    monkeypatch.setenv("SLURMGEN_SLURM_TIMEOUT", "soon")
    with pytest.raises(
        SlurmgenError, match=r"^SLURMGEN_SLURM_TIMEOUT: expected seconds, a number above 0 \(got 'soon'\)$"
    ):
        ask(LocalRunner(), ["5"])


def test_silent_accounting_under_an_answering_controller_is_said_as_such(tmp_path, monkeypatch):
    from slurmgen.jobs.query import ask
    from slurmgen.jobs.slurm_runner import LocalRunner

    _silent_slurm(tmp_path, monkeypatch, answer_scontrol=True)
    monkeypatch.setenv("SLURMGEN_SLURM_TIMEOUT", "0.2")
    snap = ask(LocalRunner(), ["5"])
    assert snap.unanswered is None
    assert snap.notes == ["Slurm's accounting (slurmdbd) does not answer (sacct: no answer within 0.2 s, 2 tries)"]


def test_a_hung_jobs_first_failure_is_the_hang_not_the_killed_ranks_exit():
    """Issue 33, item 4: "exit code 124: rank 1 exited with code 137" contradicted itself: the
    watcher killed the hung rank (137) and the job exited 124. The attempts record's hang is the
    failure: the hung rank, its node and the verdict."""
    from slurmgen.jobs.slurm import QueryResult
    from slurmgen.jobs.view import job_view
    from slurmgen.runs.registry import JobRecord

    row = {
        "job": "5",
        "state": "FAILED",
        "exit_code": 124,
        "failed_tasks": [],
        "first_rank_exit": {"rank": 1, "node": "gn7", "task": 1, "exit_code": 137},
        "missing_command": None,
    }
    verdict = "rank 0 on gn6 stopped beating at step 220 (no heartbeat for 10.4 s); ranks 1 waited in a collective"
    attempts = [
        {"event": "start", "attempt": 1, "time": 1.0},
        {
            "event": "end",
            "attempt": 1,
            "time": 20.0,
            "exit_code": 124,
            "hung_rank": 0,
            "node": "gn6",
            "verdict": verdict,
        },
    ]
    view = job_view(JobRecord("5", "j", "/o", 1.0), QueryResult(), [row], attempts)
    f = view["first_failure"]
    assert (f["rank"], f["node"], f["exit_code"], f["what"]) == (0, "gn6", 124, verdict)
    # without a hang in the record, the rank's own exit stays the failure
    plain = job_view(JobRecord("5", "j", "/o", 1.0), QueryResult(), [{**row, "exit_code": 1}], [])["first_failure"]
    assert (plain["rank"], plain["what"]) == (1, "rank 1 exited with code 137")
