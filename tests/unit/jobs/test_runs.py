"""One registry of runs (issue 22): the run model on a real SQLite file, the migration of a file
of the Slurm-only shape, `slurmgen launch` and a coordinator group recording their runs, and
`slurmgen jobs` listing every kind with --kind / --state."""

from __future__ import annotations

import io
import json
import sqlite3
import time

import pytest
from helpers import PY, SLEEPER, local_connector, local_plan, run_to_end
from helpers import run as run_cli

from slurmgen.contract.states import State
from slurmgen.launch.fanout import Launcher
from slurmgen.launch.registry_entry import LaunchRecord
from slurmgen.runs.model import (
    Failure,
    NewRun,
    Recorder,
    RunAttemptRow,
    RunRow,
    add_run,
    attempts_of,
    count_rows,
    end_attempt,
    end_run,
    list_rows,
    size,
    start_attempt,
)
from slurmgen.runs.registry import JobRecord, Registry
from slurmgen.ssh.connect import SSHOptions

# The registry's third shape: Slurm jobs only (seq, cluster), no run columns, no attempts.
THIRD_SCHEMA = """
CREATE TABLE jobs (seq INTEGER PRIMARY KEY, job_id TEXT NOT NULL, name TEXT NOT NULL, output_dir TEXT NOT NULL,
                   remote TEXT, submitted REAL NOT NULL, last_state TEXT, last_exit INTEGER, info TEXT NOT NULL,
                   cluster TEXT NOT NULL DEFAULT '');
CREATE UNIQUE INDEX jobs_key ON jobs (cluster, job_id, submitted);
CREATE INDEX jobs_job_id ON jobs (job_id);
CREATE INDEX jobs_name ON jobs (name);
CREATE INDEX jobs_output_dir ON jobs (output_dir);
"""


def new_run(kind: str = "launch", key: str = "20261125-1", name: str = "exp", **kw) -> NewRun:
    return NewRun(
        kind=kind,
        key=key,
        name=name,
        workdir="/w",
        nodes=2,
        ranks=4,
        run_id=f"{kind}-{key}",
        logs=[{"node": "n1", "path": "/w/out/logs"}],
        **kw,
    )


def test_a_registry_of_the_slurm_only_shape_is_migrated_in_place(tmp_path):
    path = tmp_path / "jobs.sqlite"
    db = sqlite3.connect(path)
    db.executescript(THIRD_SCHEMA)
    info = {
        "cluster": "here",
        "nodes": 2,
        "gpus": 4,
        "workdir": "/w",
        "log_dir": "/w/logs",
        "command": ["python", "-m", "slurmgen.train", "--out-dir", "runs/a"],
    }
    db.executemany(
        "INSERT INTO jobs (job_id, name, output_dir, remote, submitted, last_state, last_exit, info, cluster) "
        "VALUES (?, ?, ?, NULL, ?, ?, ?, ?, 'here')",
        [
            ("7", "early", "/w/a", 100.0, "COMPLETED", 0, json.dumps(info)),
            ("9", "late", "/w/b", 200.0, "CANCELLED", 143, json.dumps({**info, "command": ["true"]})),
        ],
    )
    db.commit()
    db.close()
    with Registry.open(path) as reg:  # a reading command migrates it
        rows = list_rows(reg)
        assert [
            (r["job_id"], r["kind"], r["state"], r["last_state"], r["nodes"], r["ranks"], r["started"]) for r in rows
        ] == [
            ("9", "slurm", "stopped", "CANCELLED", 2, 8, 200.0),
            ("7", "slurm", "succeeded", "COMPLETED", 2, 8, 100.0),
        ]
        assert rows[1]["run_id"] == "slurm-7" and rows[1]["record_dir"] == "/w/runs/a/tracking/slurm-7"
        assert rows[0]["record_dir"] == "/w/runs/slurm-9"  # not the trainer: slurmgen.tracking's default
        assert rows[1]["logs"] == [{"node": "here", "path": "/w/logs"}]
        assert [r.job_id for r in reg.all()] == ["9", "7"]  # the Slurm lookups read it as before
    with Registry.open(path) as reg:  # opened again: nothing to migrate, nothing lost
        assert len(list_rows(reg)) == 2


def test_runs_of_every_kind_list_newest_first_and_filter_by_kind_and_state(tmp_path):
    with Registry.open(tmp_path / "jobs.sqlite", create=True) as reg:
        reg.add(JobRecord("5", "sbatched", "/w/out", 100.0, None, "RUNNING", None, {"nodes": 1, "gpus": 2}))
        launch = add_run(reg, new_run(), 200.0)
        start_attempt(reg, launch, 1, 200.0)
        end_attempt(reg, launch, 1, State.FAILED, Failure("rank 3 exited with code 7", 3, "n2", 7), 210.0)
        start_attempt(reg, launch, 2, 211.0)
        end_attempt(reg, launch, 2, State.SUCCEEDED, None, 220.0)
        end_run(reg, launch, State.SUCCEEDED, 0, None, 220.0)
        group = add_run(reg, new_run("group", "exp1.1", "exp1"), 300.0)
        start_attempt(reg, group, 1, 300.0)
        rows = list_rows(reg)
        assert [(r["kind"], r["job_id"], r["state"], r["attempts"]) for r in rows] == [
            ("group", "exp1.1", "running", 1),
            ("launch", "20261125-1", "succeeded", 2),
            ("slurm", "5", "running", 0),
        ]
        assert rows[1]["last_cause"] is None and rows[1]["ended"] == 220.0 and rows[1]["last_exit"] == 0
        assert attempts_of(reg, launch)[0] == {
            "number": 1,
            "state": "failed",
            "started": 200.0,
            "ended": 210.0,
            "cause": "rank 3 exited with code 7",
            "rank": 3,
            "node": "n2",
            "code": 7,
        }
        assert [r["kind"] for r in list_rows(reg, kinds=["launch", "group"])] == ["group", "launch"]
        assert [r["kind"] for r in list_rows(reg, states=["running"])] == ["group", "slurm"]
        assert [r["kind"] for r in list_rows(reg, limit=1)] == ["group"]
        # The Slurm lifecycle (status, logs, cancel of "the newest job") never sees the other kinds.
        assert [r.job_id for r in reg.all()] == ["5"] and reg.all(limit=1)[0].job_id == "5"
        assert reg.get("20261125-1") is None and reg.by_name("exp1") == []


def test_each_row_shape_of_the_registry_is_what_its_select_returns(tmp_path):
    """The TypedDicts the type checker holds the run registry's readers to name the columns
    list_rows/get_row and attempts_of return, in order; a run row has every column of `jobs`
    (its `attempt` read as the `attempts` count), an attempt row every column of `attempts` but
    the run it belongs to."""
    with Registry.open(tmp_path / "jobs.sqlite", create=True) as reg:
        run = add_run(reg, new_run(), 200.0)
        start_attempt(reg, run, 1, 200.0)
        assert list(list_rows(reg)[0]) == list(RunRow.__annotations__)
        assert list(attempts_of(reg, run)[0]) == list(RunAttemptRow.__annotations__)
        jobs = {r[1] for r in reg.db.execute("PRAGMA table_info(jobs)")}
        assert jobs - {"attempt"} | {"attempts", "last_cause"} == set(RunRow.__annotations__)
        attempts = [r[1] for r in reg.db.execute("PRAGMA table_info(attempts)")]
        assert [c for c in attempts if c != "run"] == list(RunAttemptRow.__annotations__)


def test_the_not_ended_runs_are_counted_and_kept_by_the_contracts_words(tmp_path):
    """The page's count of runs not ended and `jobs --state`'s runs not yet ended (whose stored
    state may be stale) take the contract's words as the SELECT's parameters."""
    with Registry.open(tmp_path / "jobs.sqlite", create=True) as reg:
        reg.add(JobRecord("5", "sbatched", "/w/out", 100.0, None, "PENDING", None, {}))
        done = add_run(reg, new_run(), 200.0)
        end_run(reg, done, State.FAILED, 1, None, 210.0)
        add_run(reg, new_run("group", "exp1.1", "exp1"), 300.0)
        assert count_rows(reg) == (3, 2)
        assert count_rows(reg, states=["failed"]) == (1, 0)
        assert [r["kind"] for r in list_rows(reg, states=["failed"], or_active=True)] == ["group", "launch", "slurm"]
        assert [r["kind"] for r in list_rows(reg, states=["succeeded"], or_active=True)] == ["group", "slurm"]
        assert [r["kind"] for r in list_rows(reg, states=["succeeded"])] == []


def test_the_list_of_1000_runs_is_one_indexed_select_well_under_200_ms(tmp_path):
    with Registry.open(tmp_path / "jobs.sqlite", create=True) as reg:
        reg.db.execute("BEGIN")
        for i in range(1000):
            kind = ("slurm", "launch", "group")[i % 3]
            run = add_run(reg, new_run(kind, f"k{i}"), 1000.0 + i)
            for n in range(1, 4):
                start_attempt(reg, run, n, 1000.0 + i)
                end_attempt(reg, run, n, State.FAILED, Failure("rank 0 exited with code 1", 0, "n1", 1), 1000.5 + i)
            if i % 20:
                end_run(reg, run, State.FAILED, 1, Failure("rank 0 exited with code 1", 0, "n1", 1), 1001.0 + i)
        reg.db.execute("COMMIT")
        took = []
        for _ in range(5):
            t0 = time.perf_counter()
            rows = list_rows(reg)
            took.append(time.perf_counter() - t0)
        assert len(rows) == 1000 and rows[0]["job_id"] == "k999" and rows[0]["attempts"] == 3
        assert min(took) < 0.2, took
        print(f"list_rows of 1000 runs x 3 attempts: best {min(took) * 1000:.1f} ms")
        plan = " ".join(r[3] for r in reg.db.execute("EXPLAIN QUERY PLAN SELECT seq FROM jobs ORDER BY started DESC"))
        assert "jobs_started" in plan and "TEMP B-TREE" not in plan, plan
        plan = " ".join(
            r[3]
            for r in reg.db.execute(
                "EXPLAIN QUERY PLAN SELECT seq FROM jobs WHERE kind = 'launch' ORDER BY started DESC"
            )
        )
        assert "jobs_kind_started" in plan and "TEMP B-TREE" not in plan, plan
        active = list_rows(reg, states=["running"])  # the 50 not yet ended (every 20th)
        assert [r["job_id"] for r in active] == [f"k{i}" for i in range(980, -1, -20)]


def launch_rows(path):
    with Registry.open(path) as reg:
        return [(r, attempts_of(reg, r["seq"])) for r in list_rows(reg, kinds=["launch"])]


def test_a_failing_launch_is_recorded_running_at_start_then_with_its_verdict_per_attempt(tmp_path):
    path = tmp_path / "jobs.sqlite"
    plan = local_plan(tmp_path, [PY, "-c", SLEEPER], slots=(1, 1), max_restarts=1)
    plan.env.update({"SLURMGEN_LAUNCH_ID": "L1", "SLURMGEN_GROUP": "launch-L1"})
    record = LaunchRecord.start(Recorder(path), plan, "exp", [PY, "-c", SLEEPER])
    ((row, attempts),) = launch_rows(path)
    assert (row["state"], row["nodes"], row["ranks"], row["run_id"], row["job_id"]) == (
        "running",
        2,
        2,
        "launch-L1",
        "L1",
    )
    assert [log["node"] for log in row["logs"]] == ["h0", "h1"]

    made: dict = {}
    launcher = Launcher(
        plan,
        SSHOptions(),
        out=io.StringIO(),
        err=io.StringIO(),
        colour=False,
        record=record,
        connector=local_connector(made, {"FAIL_RANK": "1", "FAIL_CODE": "7", "FAIL_ATTEMPTS": "1,2", "RUN_FOR": "30"}),
    )
    code = run_to_end(launcher, made)
    err = launcher.err.getvalue()
    record.ended(code, False)
    assert code == 7, err
    ((row, attempts),) = launch_rows(path)
    assert (row["state"], row["last_exit"], row["failure"]) == (
        "failed",
        7,
        {"rank": 1, "node": "h1", "code": 7, "cause": "rank 1 exited with code 7"},
    )
    assert [(a["number"], a["state"], a["rank"], a["node"], a["code"]) for a in attempts] == [
        (1, "failed", 1, "h1", 7),
        (2, "failed", 1, "h1", 7),
    ]
    assert row["ended"] >= row["started"]


def test_a_launch_that_cannot_connect_is_recorded_failed_with_the_reason(tmp_path):
    from slurmgen.errors import SlurmgenError
    from slurmgen.launch import fanout
    from slurmgen.ssh.connect import ConnectError, SSHOptions

    path = tmp_path / "jobs.sqlite"
    plan = local_plan(tmp_path, ["true"], slots=(1,))
    record = LaunchRecord.start(Recorder(path), plan, "exp", ["true"])

    def refuse(hosts, opts, notify=None):
        raise ConnectError("h0", "connection refused")

    real = fanout.Launcher.__init__
    fanout.Launcher.__init__ = lambda self, *a, **kw: real(self, *a, **{**kw, "connector": refuse})
    try:
        with pytest.raises(SlurmgenError):
            fanout.launch(plan, SSHOptions(), record=record)
    finally:
        fanout.Launcher.__init__ = real
    ((row, attempts),) = launch_rows(path)
    assert (row["state"], row["last_exit"], attempts) == ("failed", 1, [])
    assert "connection refused" in row["failure"]["cause"]


def test_a_coordinator_group_records_one_run_whose_restarts_are_its_attempts(tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient
    from helpers import AUTH, TOKEN, Clock, beat, running, setup_group

    from slurmgen.coordinator.group_runs import GroupRuns
    from slurmgen.coordinator.server import create_app
    from slurmgen.coordinator.service import Coordinator
    from slurmgen.coordinator.store import Store

    path = tmp_path / "runs.sqlite"
    store = Store(tmp_path / "c.db")
    api = TestClient(create_app(Coordinator(store, clock=Clock(), runs=GroupRuns(Recorder(path))), TOKEN))
    setup_group(api, max_restarts=1)
    assert api.post("/api/groups/exp1/start", headers=AUTH).status_code == 200
    with Registry.open(path) as reg:
        (row,) = list_rows(reg)
        assert (row["kind"], row["name"], row["state"], row["nodes"], row["ranks"], row["run_id"]) == (
            "group",
            "exp1",
            "running",
            2,
            4,
            "exp1",
        )
    exited = {"id": 1, "state": "exited", "group": "exp1", "attempt": 1, "exit_code": 3}
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    beat(api, "gn6", *running("exp1", 1, 0), exited)  # rank 3 fails: attempt 2 starts
    beat(api, "gn7", 0, 1)
    beat(api, "gn6", 0, 1)
    beat(api, "gn7", *running("exp1", 2, 0, 1))
    beat(api, "gn6", *running("exp1", 2, 0), {**exited, "attempt": 2, "exit_code": 5})
    store.close()
    with Registry.open(path) as reg:
        (row,) = list_rows(reg)
        assert (row["state"], row["last_exit"], row["attempts"]) == ("failed", 5, 2), row
        assert row["failure"] == {"rank": 3, "node": "gn6", "code": 5, "cause": row["failure"]["cause"]}
        assert [(a["number"], a["state"], a["rank"], a["code"]) for a in attempts_of(reg, row["seq"])] == [
            (1, "failed", 3, 3),
            (2, "failed", 3, 5),
        ]


def test_jobs_lists_every_kind_and_filters_with_one_clear_line_for_bad_values(tmp_path, capsys):
    path = tmp_path / "jobs.sqlite"
    with Registry.open(path, create=True) as reg:
        end_run(
            reg,
            add_run(reg, new_run(), 100.0),
            State.FAILED,
            7,
            Failure("rank 1 exited with code 7", 1, "n2", 7),
            110.0,
        )
        add_run(reg, new_run("group", "exp1.1", "exp1"), 200.0)
    code, out, err = run_cli(capsys, "jobs", "--registry", str(path), "--json")
    rows = json.loads(out)
    assert code == 0 and [(r["kind"], r["job"], r["state"], r["exit_code"]) for r in rows] == [
        ("group", "exp1.1", "running", None),
        ("launch", "20261125-1", "failed", 7),
    ]
    assert rows[1]["first_failure"]["node"] == "n2" and rows[1]["nodes"] == 2 and rows[1]["ranks"] == 4
    code, out, _ = run_cli(capsys, "jobs", "--registry", str(path), "--kind", "launch")
    assert code == 0 and out.startswith("launch ") and "2x2" in out and len(out.splitlines()) == 1
    code, out, _ = run_cli(capsys, "jobs", "--registry", str(path), "--state", "running", "--json")
    assert [r["kind"] for r in json.loads(out)] == ["group"]
    for flag, value, words in (
        ("--kind", "ssh", "kind: expected one of slurm, launch, group (got 'ssh')"),
        ("--state", "RUNNING", "state: expected one of pending, starting"),
        ("--state", "idle", "state: expected one of pending, starting"),  # a group's word, never a run's
    ):
        code, out, err = run_cli(capsys, "jobs", "--registry", str(path), flag, value)
        assert code == 2 and words in err and "Traceback" not in err


def test_a_launch_whose_process_is_gone_without_a_verdict_shows_lost(tmp_path, capsys):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = tmp_path / "jobs.sqlite"
    with Registry.open(path, create=True) as reg:
        add_run(reg, new_run(info={"pid": int(dead.stdout)}), 100.0)
    code, out, _ = run_cli(capsys, "jobs", "--registry", str(path), "--json")
    assert code == 0 and json.loads(out)[0]["state"] == "lost"


def test_a_registry_that_cannot_be_written_never_stops_a_run_but_stops_a_launch_before_it_starts(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    recorder = Recorder(blocker / "jobs.sqlite")  # its directory is a file: every write fails
    assert recorder.started(new_run()) is None
    recorder.attempt_started(None, 1)
    recorder.ended(7, State.FAILED, 1, None)  # a row that does not exist: nothing raised
    code, out, err = run_cli(
        capsys, "launch", "--hosts", "h0", "--master-addr", "127.0.0.1", "--registry", str(tmp_path), "--", "true"
    )
    assert code == 2 and "registry:" in err and "is a directory" in err and "Traceback" not in err


def test_a_restarted_server_finds_the_run_of_a_group_it_left_running(tmp_path):
    from slurmgen.coordinator.group_runs import GroupRuns
    from slurmgen.coordinator.models import GroupConfig, RankOut
    from slurmgen.coordinator.state import Outcome

    path = tmp_path / "jobs.sqlite"
    ranks = [
        RankOut(
            worker=f"gn{h}-{i}",
            host=f"gn{h}",
            rank=2 * (h - 6) + i,
            local_rank=i,
            node_rank=h - 6,
            local_world_size=2,
            world_size=4,
        )
        for h in (6, 7)
        for i in (0, 1)
    ]
    GroupRuns(Recorder(path)).attempt_started("exp1", 3, 0, GroupConfig(argv=["true"]), ranks, tmp_path / "c.db")
    attempt = {"number": 3, "plan": {"ranks": {r.worker: r.rank for r in ranks}}, "exit_codes": {"gn7-1": 9}}
    again = GroupRuns(Recorder(path))  # a new server process: nothing in memory
    again.attempt_ended("exp1", attempt, 0, Outcome("failed", "rank 3 (gn7-1) exited with code 9", 9))
    again.ended("exp1", attempt, 0, Outcome("failed", "rank 3 (gn7-1) exited with code 9", 9))
    with Registry.open(path) as reg:
        (row,) = list_rows(reg)
        assert (row["job_id"], row["state"], row["last_exit"], row["failure"]["rank"], row["failure"]["node"]) == (
            "exp1.3",
            "failed",
            9,
            3,
            "gn7",
        )
        # the group's third attempt is this run's first (contract/attempts.py)
        assert [(a["number"], a["state"]) for a in attempts_of(reg, row["seq"])] == [(1, "failed")]


@pytest.mark.parametrize(
    "nodes, ranks, text",
    [
        (2, 8, "2x4"),
        (2, 4, "2x2"),
        (1, 1, "1x1"),
        (3, 5, "3 nodes, 5 ranks"),
        (None, 4, None),
        (2, None, None),
        (0, 0, None),
    ],
)
def test_a_runs_size_is_nodes_by_ranks_per_node_in_every_view(nodes, ranks, text):
    # The row keeps the total: a 2-node job of 4 GPUs each is 2x4 (8 ranks), never "2 x 8".
    assert size(nodes, ranks) == text


@pytest.mark.parametrize(
    "word, expected",
    [
        ("RUNNING", "cyan"),
        ("running", "cyan"),
        ("CANCELLED by 1000", "magenta"),
        ("stopped", "magenta"),
        ("TIMEOUT", "red"),
        ("BOOT_FAIL", "red"),
        ("COMPLETED", "green"),
        ("succeeded", "green"),
        ("REQUEUED", "yellow"),
        ("PREEMPTED", "magenta"),
        ("finished", "green"),
        ("preempted", "magenta"),
        ("UNKNOWN", None),
    ],
)
def test_a_state_is_coloured_by_what_it_means_whoever_said_it(word, expected):
    from slurmgen.cliopts import colour

    assert colour(word) == expected  # Slurm's word through contract/states.from_slurm, a run's as it is


def test_a_launch_whose_stop_was_taken_reads_stopping_until_it_ends(tmp_path):
    """Issue 33, item 10: between the launcher taking a person's stop and its ranks being gone, the
    run and its open attempt read `stopping` (a contract state), then `stopped`, which views say
    as "stopped by you"."""
    from slurmgen.contract.states import ACTIVE_WORDS, STOPPED_BY_YOU, shown

    recorder = Recorder(tmp_path / "r.sqlite")
    run = recorder.started(NewRun(kind="launch", key="L1", name="n", workdir="/w", nodes=1, ranks=2))
    recorder.attempt_started(run, 1)
    recorder.stopping(run)
    with Registry.open(tmp_path / "r.sqlite") as reg:
        (row,) = list_rows(reg)
        assert row["state"] == "stopping" and row["state"] in ACTIVE_WORDS
        assert [a["state"] for a in attempts_of(reg, run)] == ["stopping"]
    recorder.attempt_ended(run, 1, State.STOPPED, Failure(cause=STOPPED_BY_YOU))
    recorder.ended(run, State.STOPPED, 143, None)
    recorder.stopping(run)  # too late: the end stands
    with Registry.open(tmp_path / "r.sqlite") as reg:
        (row,) = list_rows(reg)
        assert (row["state"], shown(row["state"])) == ("stopped", "stopped by you")


def test_the_trainers_records_are_found_under_a_shell_wrapper_but_its_signals_are_not_assumed():
    """`bash -c '... python -m slurmgen.train --out-dir X ...'`: the records are under X (the
    registry, the run page and `status` look there); but the shell, not the trainer, receives a
    warning signal, so the command is not taken for the trainer itself (jobs/stopping.py)."""
    from slurmgen.runs.trainer_records import is_trainer, record_dir, root_names

    wrapped = ["bash", "-lc", 'cd /w && python -m slurmgen.train --out-dir "runs/my x" --track-dir=T']
    assert record_dir("/w", wrapped, "slurm-5") == "/w/T/slurm-5"
    assert record_dir("/w", wrapped[:2] + [wrapped[2].replace(" --track-dir=T", "")], "g") == "/w/runs/my x/tracking/g"
    assert root_names(wrapped) == ["runs", "runs/my x"] and not is_trainer(wrapped)
    # Not the bundled trainer: where slurmgen.tracking and the framework callbacks write by default.
    assert record_dir("/w", ["bash", "-c", "python train.py --out-dir o"], "g") == "/w/runs/g"
    assert record_dir("/w", ["sh", "-c", "python -m slurmgen.train --track off"], "g") is None
    assert record_dir("/w", ["sh", "-c", "python -m slurmgen.train 'unbalanced"], "g") == "/w/runs/train/tracking/g"


def test_a_launch_is_recorded_under_the_name_given_with_name(tmp_path, capsys, monkeypatch):
    """`slurmgen launch --name exp-7` (issue 33 item 11: every launch was named "slurmgen"); the
    launch itself is stubbed, its registry row is the real one `launch` writes before it starts."""
    from slurmgen.launch import fanout

    monkeypatch.setattr(fanout, "launch", lambda plan, opts, keepalive, record: 0)
    path = tmp_path / "jobs.sqlite"
    base = ["launch", "--hosts", "h0", "--master-addr", "127.0.0.1", "--registry", str(path)]
    assert run_cli(capsys, *base, "--name", "exp-7", "--", "true")[0] == 0
    assert run_cli(capsys, *base, "--", "true")[0] == 0
    with Registry.open(path) as reg:
        assert [r["name"] for r in list_rows(reg, kinds=["launch"])] == ["slurmgen", "exp-7"]
    code, _, err = run_cli(capsys, *base, "--name", "two\nlines", "--", "true")
    assert code == 2 and "job_name" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
