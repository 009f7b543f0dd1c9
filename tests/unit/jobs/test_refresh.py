"""The runs list's live Slurm states (jobs/refresh.py): every active Slurm row refreshed by one
batched query per login node, written back to a real registry file, a stale state marked with its
age. Slurm's answers are recorded text (tests/unit/jobs/data/slurm/)."""

from __future__ import annotations

import re
from pathlib import Path

from slurmgen.coordinator.web.runs_page import run_view
from slurmgen.jobs.refresh import STALE_AFTER, Refresher, refresh_active, stale_for
from slurmgen.jobs.slurm_runner import Result, Unanswered
from slurmgen.runs.model import list_rows
from slurmgen.runs.registry import JobRecord, Registry

DATA = Path(__file__).parent / "data" / "slurm"


def recorded(name: str, job_id: str, **fields: str) -> str:
    """A recorded answer (scontrol or sacct) under another job id, some scontrol fields replaced."""
    text = (DATA / name).read_text().partition("\n#")[0]
    if name.startswith("sacct"):
        return (
            re.sub(r"^1(?=[|.])", job_id, text, flags=re.M).replace("|1|", f"|{job_id}|").replace("|1.", f"|{job_id}.")
        )
    for key, value in {"JobId": job_id, **fields}.items():
        text = re.sub(rf"\b{key}=\S*", f"{key}={value}", text, count=1)
    return text


class Slurm:
    """Answers scontrol and sacct from recorded text, counting calls; `down`: never answers."""

    where = "local"

    def __init__(self, scontrol: str = "", sacct: str = "", down: bool = False):
        self.scontrol, self.sacct, self.down, self.calls = scontrol, sacct, down, []

    def run(self, argv, *, cwd=None, stdin=b"", timeout=60):
        self.calls.append(list(argv))
        if self.down:
            raise Unanswered(argv, timeout)
        return Result(0, self.scontrol if argv[0] == "scontrol" else self.sacct, "")

    def close(self):
        pass


def job(job_id: str, state: str | None, remote: str | None = None, submitted: float = 100.0) -> JobRecord:
    info = {"workdir": "/w", "command": ["x"], "nodes": 2, "gpus": 1, "array": None}
    return JobRecord(job_id, f"j{job_id}", "/out", submitted, remote, state, 0 if state == "COMPLETED" else None, info)


def test_every_active_row_of_a_thousand_is_refreshed_by_one_query_and_written_back(tmp_path):
    """Of 1,000 jobs, 997 ended long ago: not asked. One pending job runs now (scontrol), one running
    job's row is corrected to its end (sacct, the controller forgot it), one held one stays
    pending: one scontrol and one sacct call in all, and the registry file says what Slurm said."""
    path = tmp_path / "jobs.sqlite"
    with Registry.open(path, create=True) as reg:
        reg.add_many([job(str(i), "COMPLETED") for i in range(10, 1007)])
        reg.add_many([job("1", "PENDING"), job("2", "PENDING"), job("3", "RUNNING")])
        slurm = Slurm(
            "\n".join([recorded("scontrol_running.txt", "1"), recorded("scontrol_pending_held.txt", "2")]),
            recorded("sacct_completed.txt", "3"),
        )
        asked = refresh_active(lambda *where: slurm, reg, print, now=500.0)
        assert asked == 3
        assert [c[0] for c in slurm.calls] == ["scontrol", "sacct"], slurm.calls
        assert slurm.calls[0] == ["scontrol", "show", "job", "-o"]  # one listing, not one call per id
        assert slurm.calls[1][-1] == "3"  # sacct only about what the controller forgot
    with Registry.open(path) as reg:
        rows = {r["job_id"]: r for r in list_rows(reg)}
    assert {k: (rows[k]["state"], rows[k]["attempts"]) for k in "123"} == {
        "1": ("running", 1),
        "2": ("pending", 0),
        "3": ("succeeded", 1),
    }
    assert {rows[k]["state_seen"] for k in "123"} == {500.0} and rows["10"]["state_seen"] is None
    assert run_view(rows["1"], 500.0 + 1)["as_of"] is None  # just told: no age


def test_remote_jobs_are_asked_once_per_login_node(tmp_path):
    with Registry.open(tmp_path / "jobs.sqlite", create=True) as reg:
        reg.add_many([job("1", "RUNNING", "login1"), job("2", "RUNNING", "login1"), job("3", "RUNNING")])
        reg.add_many([job("4", "RUNNING", "login2")])
        runners: dict = {}
        refresh_active(lambda where, *a: runners.setdefault(where, Slurm()), reg, print)
    assert {where: [c[0] for c in r.calls] for where, r in runners.items()} == {
        "login1": ["scontrol", "sacct"],
        None: ["scontrol", "sacct"],
        "login2": ["scontrol", "sacct"],
    }


def test_a_state_no_refresh_could_renew_is_shown_with_its_age(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURMGEN_SLURM_TIMEOUT", "0.01")
    notes: list[str] = []
    with Registry.open(tmp_path / "jobs.sqlite", create=True) as reg:
        reg.add_many([job("1", "PENDING", submitted=100.0)])
        refresh_active(lambda *a: Slurm("\n".join([recorded("scontrol_running.txt", "1")])), reg, notes.append, 200.0)
        refresh_active(lambda *a: Slurm(down=True), reg, notes.append, 320.0)
        (row,) = list_rows(reg)
    assert notes and "does not answer" in notes[0]
    assert (row["state"], row["state_seen"]) == ("running", 200.0)  # the last word Slurm gave stands
    view = run_view(row, 320.0)
    assert (view["state"], view["as_of"]) == ("running", "2 min ago")
    assert stale_for(row, 200.0 + STALE_AFTER - 1) is None
    assert stale_for({**row, "state": "succeeded"}, 1e9) is None  # an ended job's state does not age


def test_the_page_refreshes_at_most_every_few_seconds_and_waits_boundedly(tmp_path):
    path = tmp_path / "jobs.sqlite"
    with Registry.open(path, create=True) as reg:
        reg.add_many([job("1", "PENDING")])
    slurm = Slurm(recorded("scontrol_running.txt", "1"))

    class Runners:
        def __call__(self, *where):
            return slurm

        def close(self):
            pass

    refresher = Refresher(Runners, every=60.0, wait=5.0)
    assert refresher.refresh(path) == []
    refresher.refresh(path)  # within `every`: no second query
    assert [c[0] for c in slurm.calls] == ["scontrol"]
    with Registry.open(path) as reg:
        assert list_rows(reg)[0]["state"] == "running"


def test_a_job_seen_failing_gets_the_rank_its_attempts_record_names_and_the_list_shows_it(tmp_path):
    """Issue 33 item 11: the list named no failing rank for a Slurm job ("3") where a launch's row
    says "rank 3 on node2". The refresh that sees the job fail reads its attempts record beside its
    logs (run_slurm.sh's verdict) into the row; a requeue (running again) clears it."""
    import json

    from slurmgen.coordinator.web.runs_page import outcome
    from slurmgen.heal.attempts import attempts_path

    path = tmp_path / "jobs.sqlite"
    record = job("5", "RUNNING")
    record.info["log_dir"] = str(tmp_path)
    ends = [
        {"event": "start", "job": "5", "attempt": 1, "time": 1.0, "host": "node1"},
        {"event": "end", "job": "5", "attempt": 1, "time": 9.0, "exit_code": 3, "rank": 3, "node": "node2"},
    ]
    attempts_path(tmp_path, "5").write_text("".join(json.dumps(e) + "\n" for e in ends))
    with Registry.open(path, create=True) as reg:
        reg.add(record)
        refresh_active(lambda *where: Slurm(recorded("scontrol_failed.txt", "5")), reg, print, now=500.0)
        (row,) = list_rows(reg)
        assert row["state"] == "failed" and row["failure"] == {
            "rank": 3,
            "node": "node2",
            "code": 3,
            "cause": "exit 3",
        }
        assert outcome(row) == "3 — rank 3 on node2 code 3 (exit 3)"
        reg.remember_states({row["seq"]: ("FAILED", 3)})  # nothing new: the record is not read again
        attempts_path(tmp_path, "5").unlink()
        requeued = reg.by_seq(row["seq"])
        assert requeued is not None
        ask = recorded("scontrol_running.txt", "5")
        from slurmgen.jobs.refresh import ask_slurm

        ask_slurm(lambda *where: Slurm(ask), reg, [requeued], print, batched=True)
        assert list_rows(reg)[0]["failure"] is None and list_rows(reg)[0]["state"] == "running"


def test_the_list_holds_the_current_attempts_elapsed_time_to_the_limit_not_the_runs(tmp_path):
    """Issue 33 item 11: a job submitted 20 min ago, requeued, its attempt 2 running for 3 min
    under a 5 min limit read "20 min 00 s / 5 min 00 s" (queue and both attempts against one
    attempt's limit). Slurm's RunTime is the current attempt's: the row keeps when it started."""
    path = tmp_path / "jobs.sqlite"
    record = job("6", "RUNNING")
    record.info["time_limit"] = "5"
    with Registry.open(path, create=True) as reg:
        reg.add(record)
        running = recorded("scontrol_running.txt", "6", RunTime="00:03:00", Restarts="1")
        refresh_active(lambda *where: Slurm(running), reg, print, now=1300.0)
        (row,) = list_rows(reg)
        assert (row["attempts"], row["attempt_started"]) == (2, 1120.0)
        assert run_view(row, 1300.0)["elapsed"] == "3 min 00 s / 5 min 00 s"
        assert run_view(row, 1330.0)["elapsed"] == "3 min 30 s / 5 min 00 s"  # live: from the attempt's start
        pending = recorded("scontrol_pending_held.txt", "6", Restarts="2")
        refresh_active(lambda *where: Slurm(pending), reg, print, now=1400.0)  # requeued again: no attempt runs
        (row,) = list_rows(reg)
        assert row["attempt_started"] is None and run_view(row, 1400.0)["elapsed"] == "21 min 40 s"


def test_the_list_counts_in_job_restarts_from_the_tail_of_the_attempts_record(tmp_path):
    """Issue 35: a job with `restarts` restarts inside its allocation, which Slurm's restart count
    (Restarts=0 here) never sees; the refresh reads the end of its attempts record, bounded
    (ATTEMPTS_TAIL) however long it is, so the list says attempt 3 without `slurmgen status`."""
    import json

    from slurmgen.heal.attempts import attempts_path
    from slurmgen.jobs.refresh import ATTEMPTS_TAIL, attempt_here

    def attempt(n: int, action: str = "restart") -> list[dict]:
        start = {"event": "start", "job": "8", "attempt": n, "time": n, "host": "node1", "nodes": "node1,node2"}
        return [start, {"event": "end", "job": "8", "attempt": n, "time": n + 0.5, "exit_code": 137, "action": action}]

    path = tmp_path / "jobs.sqlite"
    restarting, plain = job("8", "RUNNING"), job("9", "RUNNING")
    for record in (restarting, plain):
        record.info.update(log_dir=str(tmp_path), restarts=5 if record is restarting else None)
    lines = [*attempt(1), *attempt(2), attempt(3)[0]]
    attempts_path(tmp_path, "8").write_text("".join(json.dumps(x) + "\n" for x in lines))
    attempts_path(tmp_path, "9").write_text(attempts_path(tmp_path, "8").read_text().replace('"8"', '"9"'))
    with Registry.open(path, create=True) as reg:
        reg.add_many([restarting, plain])
        both = "\n".join(recorded("scontrol_running.txt", j, Restarts="0") for j in ("8", "9"))
        refresh_active(lambda *where: Slurm(both), reg, print, now=500.0)
        rows = {r["job_id"]: r for r in list_rows(reg)}
        assert rows["8"]["attempts"] == 3  # in-job restarts: the record's
        assert rows["9"]["attempts"] == 1  # no restarts asked: Slurm's count, its record never read
    # A record longer than the tail: only its end is read, its first (cut) line skipped.
    many = [line for n in range(1, 2001) for line in attempt(n)]
    text = "".join(json.dumps(x) + "\n" for x in many)
    assert len(text) > 4 * ATTEMPTS_TAIL
    attempts_path(tmp_path, "8").write_text(text)
    assert attempt_here(restarting) == 2000
    attempts_path(tmp_path, "8").unlink()
    assert attempt_here(restarting) is None  # not readable here: Slurm's count stands
