"""`status` of an array task Slurm dropped (issue 36): scancel of a pending array task removes it
(`scontrol show job 4_0`: not found; a chain's later links lose the tasks whose run ended), so it
never ran. It reads as cancelled before it started, not as the array's last state in the registry
("PENDING", which it would never leave). Slurm's answer is the recorded scontrol_array.txt of the
test cluster without task 0's line."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from slurmgen.contract import grid as sweep
from slurmgen.jobs import commands
from slurmgen.jobs.slurm_runner import Result
from slurmgen.jobs.view import format_view, pending_text
from slurmgen.runs.registry import JobRecord, Registry

DATA = Path(__file__).parent / "data" / "slurm"


class Runner:
    where = "local"

    def __init__(self, scontrol: str, files: dict[str, str]):
        self.scontrol, self.files = scontrol, files

    def run(self, argv, *, cwd=None, stdin=b"", timeout=60):
        if argv[:3] == ["scontrol", "show", "job"]:
            return Result(0, self.scontrol, "")
        return Result(1, "", "Slurm accounting storage is disabled\n")  # sacct: no accounting

    def read(self, path, offset=0):
        text = self.files.get(path)
        return None if text is None else text.encode()[offset:]

    def close(self):
        pass


def status(tmp_path: Path, task: str | None, logs: dict[str, str]) -> dict:
    lines = (DATA / "scontrol_array.txt").read_text().partition("\n#")[0].splitlines()
    without_task_0 = "\n".join(line for line in lines if "ArrayTaskId=0 " not in line) + "\n"
    grid = sweep.grid_jsonl(sweep.points({"lr": [1, 2], "bs": [8, 16]}))
    info = {"log_dir": str(tmp_path / "logs"), "workdir": str(tmp_path), "command": ["x"], "nodes": 1, "gpus": 1}
    info |= {"launcher": "srun", "array": 4, "sweep_file": str(tmp_path / "sweep.jsonl")}
    rec = JobRecord("4", "arr", str(tmp_path / "out"), 4.0, None, "PENDING", None, info)
    files = {info["sweep_file"]: grid, **{str(tmp_path / "logs" / name): text for name, text in logs.items()}}
    with Registry.open(tmp_path / "jobs.sqlite", create=True) as reg:
        reg.add(rec)
        return commands.status(Runner(without_task_0, files), reg, rec, task)


def test_a_dropped_pending_task_reads_as_cancelled_before_it_started(tmp_path):
    view = status(tmp_path, None, {})
    assert [(t["job"], t["state"]) for t in view["tasks"]] == [
        ("4_0", "CANCELLED"),
        ("4_1", "RUNNING"),
        ("4_2", "PENDING"),
        ("4_3", "PENDING"),
    ]
    one = status(tmp_path / "one", "0", {})
    assert (one["state"], one["exit_code"]) == ("CANCELLED", None)
    assert one["source"] == "slurm: no longer listed and no log: cancelled before it started, it never ran"
    text = format_view(one)
    assert text[0] == "job 4_0 (arr): CANCELLED" and "  stopped: 4_0 CANCELLED, stopped by you (scancel)" in text
    assert text[-1] == "  note: 4_0: no longer listed and no log: cancelled before it started, it never ran", text


def test_a_task_with_a_log_that_slurm_forgot_keeps_its_last_seen_state(tmp_path):
    view = status(tmp_path, "0", {"arr-4_0.out": "it ran\n"})
    assert (view["state"], view["source"]) == ("PENDING", "registry (last seen)")


def test_status_of_a_waiting_job_says_when_slurm_expects_it_to_start(tmp_path):
    from datetime import datetime

    line = (DATA / "scontrol_pending_resources.txt").read_text().partition("\n#")[0] + "\n"
    info = {"log_dir": str(tmp_path / "logs"), "workdir": str(tmp_path), "command": ["x"], "nodes": 1, "gpus": 1}
    rec = JobRecord("2", "j.sh", str(tmp_path / "out"), 2.0, None, None, None, {**info, "launcher": "srun"})
    with Registry.open(tmp_path / "jobs.sqlite", create=True) as reg:
        reg.add(rec)
        view = commands.status(Runner(line, {}), reg, rec, None)
    assert (view["state"], view["reason"], view["expected_start"]) == ("PENDING", "Resources", "2026-11-28T11:01:06")
    now = datetime(2026, 11, 28, 10, 58, 6).timestamp()
    assert "  pending: Resources; Slurm expects it to start at 2026-11-28 11:01:06 (in 3 min)" in format_view(
        view, now=now
    )


def test_a_requeued_job_whose_expected_start_is_its_eligible_time_says_that_time_once():
    """After a requeue Slurm's StartTime is the requeue delay's end, the moment it becomes eligible:
    the line said the same time twice ("eligible at 12:03:31 ...; Slurm expects it to start at
    2026-11-28 12:03:31"). A later expected start (a busy cluster) is still said."""
    view = {"reason": "BeginTime", "eligible": "2026-11-28T12:03:31", "restarts": 1}
    now = datetime(2026, 11, 28, 12, 1, 31).timestamp()
    same = pending_text({**view, "expected_start": "2026-11-28T12:03:31"}, now)
    assert same == "requeued, eligible at 12:03:31 (in 120 s)", same
    later = pending_text({**view, "expected_start": "2026-11-28T12:09:31"}, now)
    assert later.endswith("; Slurm expects it to start at 2026-11-28 12:09:31 (in 8 min)"), later
