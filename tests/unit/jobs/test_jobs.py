"""The job registry, JOB lookup, sweeps and the job commands' logic, without a cluster.

A stand-in runner answers with output recorded from Slurm 22.05 (tests/unit/jobs/data/slurm/) and
counts calls; tests/integration/test_job_commands.py runs the same commands on the real
cluster.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
from helpers import run

from slurmgen.contract import grid as sweep
from slurmgen.contract.states import State
from slurmgen.errors import SlurmgenError
from slurmgen.generate import sweep_input
from slurmgen.generate.render import SLURM_SCRIPT, render
from slurmgen.generate.specfile import build_spec
from slurmgen.heal.attempts import parse_attempts
from slurmgen.jobs import commands, listing, stopping
from slurmgen.jobs.cli_shared import Runners
from slurmgen.jobs.resolve import find
from slurmgen.jobs.slurm_runner import Result
from slurmgen.jobs.view import format_view
from slurmgen.runs.model import list_rows
from slurmgen.runs.registry import JobRecord, Registry

DATA = Path(__file__).parent / "data" / "slurm"


class FakeRunner:
    """Answers `scontrol show job -o [ID]` (and `sacct`, if given) from recorded text; files from a dict."""

    where = "local"

    def __init__(self, scontrol: str = "", files: dict[str, str] | None = None, sacct: str | None = None):
        self.scontrol, self.files, self.sacct, self.calls = scontrol, files or {}, sacct, []

    def run(self, argv, *, cwd=None, stdin=b"", timeout=60):
        self.calls.append(list(argv))
        if argv[:3] == ["scontrol", "show", "job"]:
            return Result(0, self.scontrol, "")
        if argv[0] == "sacct":
            return (
                Result(0, self.sacct, "")
                if self.sacct is not None
                else Result(1, "", "Slurm accounting storage is disabled\n")
            )
        if argv[0] == "sbatch":
            return Result(0, "77\n", "")
        raise AssertionError(f"unexpected command {argv}")

    def read(self, path, offset=0):
        text = self.files.get(path)
        return None if text is None else text.encode()[offset:]

    def close(self):
        pass


def registry(tmp_path: Path) -> Registry:
    return Registry.open(tmp_path / "jobs.sqlite", create=True)


def record(job_id: str, tmp_path: Path, submitted: float | None = None, **info) -> JobRecord:
    base = {
        "log_dir": str(tmp_path / "logs"),
        "workdir": str(tmp_path),
        "command": ["x"],
        "nodes": 2,
        "gpus": 2,
        "launcher": "srun",
        "array": None,
    }
    return JobRecord(
        job_id,
        info.pop("name", "rec"),
        str(tmp_path / "out"),
        submitted or float(job_id),
        None,
        None,
        None,
        {**base, **info},
    )


# --- sweeps -------------------------------------------------------------------------------------
def test_a_grid_expands_first_key_slowest_and_words_keep_spaces():
    rows = sweep.points({"lr": ["1e-3", 3e-4], "bs": [8, 16]})
    assert rows == [{"lr": "1e-3", "bs": 8}, {"lr": "1e-3", "bs": 16}, {"lr": 3e-4, "bs": 8}, {"lr": 3e-4, "bs": 16}]
    assert sweep.task_words({"name": "a b", "flag": True}) == ["--name", "a b", "--flag", "true"]
    assert sweep.task_words({"model.depth": 4}, "{key}={value}") == ["model.depth=4"]
    assert sweep.array_option(1000, "%8") == "0-999%8"


@pytest.mark.parametrize(
    "flag, words",
    [
        (["lr"], "expected KEY=V1,V2"),
        (["lr="], "expected KEY=V1,V2"),
        (["lr=1,,2"], "expected KEY=V1,V2"),
        (["lr=1", "lr=2"], "lr is given twice"),
        (["a b=1"], "expected KEY=V1,V2"),
    ],
)
def test_bad_sweep_flags(flag, words):
    with pytest.raises(SlurmgenError, match=words):
        sweep_input.parse_flag(flag)


def test_sweep_file_errors_name_the_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"lr": 1}\n\nnot json\n')
    with pytest.raises(SlurmgenError, match=r"p.jsonl:3: not JSON"):
        sweep_input.read_file(path)
    path.write_text('{"lr": 1}\n[1]\n')
    with pytest.raises(SlurmgenError, match=r"p.jsonl:2: expected a JSON object"):
        sweep_input.read_file(path)
    with pytest.raises(SlurmgenError, match="cannot read"):
        sweep_input.read_file(tmp_path / "missing.jsonl")


def test_a_sweep_renders_one_array_script_whose_tasks_get_their_row(tmp_path):
    spec = build_spec(
        {
            "output_dir": str(tmp_path / "out"),
            "nodes": 2,
            "array": "%3",
            "backend": "gloo",
            "sweep": [{"lr": "it's $(x)", "bs": 8}, {"lr": "0.1", "bs": 16}],
            "command": ["printf", "<%s>"],
        }
    )
    files = render(spec).files
    script = files[SLURM_SCRIPT]
    assert "#SBATCH --array=0-1%3" in script and "#SBATCH --output=" in script and "%x-%A_%a.out" in script
    assert [json.loads(line)["params"] for line in files[sweep.SWEEP_FILE].splitlines()] == spec.sweep
    out = tmp_path / "out"
    out.mkdir()
    (out / SLURM_SCRIPT).write_text(script)
    assert subprocess.run(["shellcheck", str(out / SLURM_SCRIPT)], capture_output=True).returncode == 0
    # Real bash, with a stand-in srun that runs the task once: task 0 gets row 0, literally.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(
        "#!/usr/bin/env bash\nwhile [[ $1 == -* ]]; do shift; done\n"
        'SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_NTASKS=1 "$@"\n'
    )
    (bin_dir / "scontrol").write_text("#!/usr/bin/env bash\necho localhost\n")
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "x"}
    ran = subprocess.run(
        ["bash", str(out / SLURM_SCRIPT)],
        env={**env, "SLURM_ARRAY_TASK_ID": "0"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ran.stdout.endswith("<--lr><it's $(x)><--bs><8>"), ran.stdout + ran.stderr
    bad = subprocess.run(
        ["bash", str(out / SLURM_SCRIPT)],
        env={**env, "SLURM_ARRAY_TASK_ID": "5"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 1 and "this sweep has 2 points (array tasks 0-1); got task '5'" in bad.stderr


def test_an_array_without_a_sweep_passes_through():
    script = render(build_spec({"array": "0-15%4"})).files[SLURM_SCRIPT]
    assert (
        "#SBATCH --array=0-15%4" in script and "%x-%A_%a.out" in script and "case ${SLURM_ARRAY_TASK_ID" not in script
    )


@pytest.mark.parametrize(
    "values, words",
    [
        ({"sweep": {"lr": []}}, "sweep: every parameter needs at least one value"),
        ({"sweep": {"lr": [1]}, "array": "0-3"}, "with a sweep, give only %N"),
        ({"array": "%4"}, "caps a sweep's tasks"),
        ({"array": "0-3;rm"}, "array: expected sbatch's --array form"),
        ({"sweep": {"lr": [1]}, "sweep_args": "--{key}"}, "sweep_args: must contain {value}"),
        ({"sbatch_extra": ["--array=0-3"]}, "--array is written by slurmgen"),
    ],
)
def test_bad_sweep_specs(values, words):
    with pytest.raises(SlurmgenError) as info:
        build_spec(values)
    assert words in "\n".join(info.value.lines())


# --- registry -----------------------------------------------------------------------------------
def test_registry_round_trip_and_last_states(tmp_path):
    with registry(tmp_path) as reg:
        old, new, other = (
            record("5", tmp_path),
            record("5", tmp_path, 50.0, nodes=4),
            record("6", tmp_path, name="other"),
        )
        reg.add_many([old, new, other])  # a reset cluster hands out 5 again: the newest 5 is the one meant
        reg.remember_states({new.seq: ("FAILED", 3)})
    with Registry.open(tmp_path / "jobs.sqlite") as reg:
        assert [(r.job_id, r.last_state) for r in reg.all()] == [("6", None), ("5", "FAILED"), ("5", None)]
        assert (reg.get("5").last_state, reg.get("5").last_exit, reg.get("5").info["nodes"]) == ("FAILED", 3, 4)
        assert [r.job_id for r in reg.by_name("other")] == ["6"] and reg.get("7") is None


def test_a_runs_attempt_only_rises_so_slurms_count_keeps_the_in_job_restarts(tmp_path):
    # `status` read the attempts record (attempt 3 after two in-job restarts); the batched refresh
    # then hears Slurm's count (no requeue: attempt 1), which must not take it back.
    with registry(tmp_path) as reg:
        rec = record("5", tmp_path)
        reg.add(rec)
        reg.remember_states({rec.seq: ("RUNNING", None)}, None, {rec.seq: 3})
        reg.remember_states({rec.seq: ("RUNNING", None)}, None, {rec.seq: 1})
        assert reg.db.execute("SELECT attempt FROM jobs WHERE seq = ?", (rec.seq,)).fetchone()[0] == 3
        reg.remember_states({rec.seq: ("RUNNING", None)}, None, {rec.seq: 4})  # requeued after them
        assert reg.db.execute("SELECT attempt FROM jobs WHERE seq = ?", (rec.seq,)).fetchone()[0] == 4


def test_a_registry_path_may_hold_uri_characters(tmp_path):
    path = tmp_path / "odd ?#% dir" / "jobs.sqlite"
    with Registry.open(path, create=True) as reg:
        reg.add(record("5", tmp_path))
    assert [p.name for p in path.parent.iterdir()] == ["jobs.sqlite"]
    with Registry.open(path) as reg:
        assert reg.get("5").job_id == "5"


def test_reading_commands_never_create_or_touch_a_registry(tmp_path):
    with pytest.raises(SlurmgenError, match="no job registry"):
        Registry.open(tmp_path / "none.sqlite")
    assert not (tmp_path / "none.sqlite").exists()
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(SlurmgenError, match="not a slurmgen registry"):
        Registry.open(other, create=True)


# The registry's first shape (before rows were numbered): one row per job id, a reused id replaced.
FIRST_SCHEMA = """
CREATE TABLE jobs (job_id TEXT PRIMARY KEY, name TEXT NOT NULL, output_dir TEXT NOT NULL, remote TEXT,
                   submitted REAL NOT NULL, last_state TEXT, last_exit INTEGER, info TEXT NOT NULL);
CREATE INDEX jobs_name ON jobs (name);
CREATE INDEX jobs_output_dir ON jobs (output_dir);
"""
# Its second: rows numbered by submission, no cluster column.
SECOND_SCHEMA = """
CREATE TABLE jobs (seq INTEGER PRIMARY KEY, job_id TEXT NOT NULL, name TEXT NOT NULL, output_dir TEXT NOT NULL,
                   remote TEXT, submitted REAL NOT NULL, last_state TEXT, last_exit INTEGER, info TEXT NOT NULL);
CREATE INDEX jobs_job_id ON jobs (job_id);
CREATE INDEX jobs_name ON jobs (name);
CREATE INDEX jobs_output_dir ON jobs (output_dir);
"""


@pytest.mark.parametrize("schema", [FIRST_SCHEMA, SECOND_SCHEMA], ids=["one-row-per-id", "numbered-rows"])
def test_a_registry_of_an_older_shape_is_migrated_keeping_every_row(tmp_path, schema):
    path = tmp_path / "jobs.sqlite"
    db = sqlite3.connect(path)
    db.executescript(schema)
    rows = [
        ("12", "late", "/w/a", None, 300.0, "RUNNING", None, '{"cluster": "here", "nodes": 2}'),
        ("7", "early", "/w/b", "login1", 100.0, "COMPLETED", 0, '{"cluster": "login1", "nodes": 1}'),
        ("9", "mid", "/w/c", None, 200.0, "FAILED", 3, '{"nodes": 4}'),
    ]
    db.executemany(
        "INSERT INTO jobs (job_id, name, output_dir, remote, submitted, last_state, last_exit, info) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        rows if schema == FIRST_SCHEMA else sorted(rows, key=lambda r: r[4]),
    )  # numbered rows: in submit order
    db.commit()
    db.close()
    with Registry.open(path) as reg:  # a reading command: migrated in place
        assert [(r.job_id, r.name, r.last_state, r.last_exit, r.cluster, r.info["nodes"]) for r in reg.all()] == [
            ("12", "late", "RUNNING", None, "here", 2),
            ("9", "mid", "FAILED", 3, "", 4),
            ("7", "early", "COMPLETED", 0, "login1", 1),
        ]
        reused = record("12", tmp_path, 400.0, name="again", cluster="here")
        reg.add(reused)  # the cluster was reset and hands out 12 again: both are kept
        assert [r.name for r in reg.with_id("12")] == ["again", "late"] and reg.get("12").name == "again"
        assert reg.superseded() == {reg.with_id("12")[1].seq: reused.seq}
    columns = [row[1] for row in sqlite3.connect(path).execute("PRAGMA table_info(jobs)")]
    assert "cluster" in columns and "seq" in columns
    with Registry.open(path) as reg:  # opened again: nothing to migrate, nothing lost
        assert len(reg.all()) == 4


def _two_jobs_with_id_5(tmp_path: Path, reg: Registry) -> tuple[JobRecord, JobRecord]:
    """A cluster that was reset gave the id 5 twice; the older job ended, the newer one runs."""
    first = record("5", tmp_path, 100.0, name="first", cluster="c1")
    first.last_state, first.last_exit = "COMPLETED", 0
    second = record("5", tmp_path, 200.0, name="second", cluster="c1")
    other = record("5", tmp_path, 150.0, name="elsewhere", cluster="c2")  # another cluster's 5 is not reused
    reg.add_many([first, other, second])
    return first, second


def test_a_reused_id_keeps_the_older_job_and_its_last_state(tmp_path):
    scontrol = (DATA / "scontrol_running.txt").read_text().replace("JobId=1 ", "JobId=5 ")
    with registry(tmp_path) as reg:
        first, second = _two_jobs_with_id_5(tmp_path, reg)
        runner = FakeRunner(scontrol)
        rows = listing.list_jobs(lambda *a: runner, reg, None)
        # Slurm's 5 is the newer job: its state is not written over the older one's.
        assert [(r.name, r.last_state) for r in reg.all()] == [
            ("second", "RUNNING"),
            ("elsewhere", "RUNNING"),
            ("first", "COMPLETED"),
        ]
        assert [(r["name"], r["state"], r["live"], r["id_reused"]) for r in rows] == [
            ("second", "RUNNING", True, False),
            ("elsewhere", "RUNNING", True, False),
            ("first", "COMPLETED", False, True),
        ]
        assert set(reg.superseded()) == {first.seq}
        runner = FakeRunner(scontrol)
        view = commands.status(runner, reg, reg.by_seq(first.seq), None)
        assert (view["state"], view["exit_code"], runner.calls) == ("COMPLETED", 0, [])
        assert "the id 5 now names a later job, 'second' submitted" in view["notes"][0]
        assert reg.by_seq(first.seq).last_state == "COMPLETED"


def test_a_bare_reused_id_means_the_newest_job_and_a_note_names_the_older(tmp_path, capsys):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "first-5.out").write_text("0: old run\n")
    (tmp_path / "logs" / "second-5.out").write_text("0: new run\n")
    path = tmp_path / "jobs.sqlite"
    with Registry.open(path, create=True) as reg:
        _two_jobs_with_id_5(tmp_path, reg)
    code, out, err = run(capsys, "logs", "5", "--registry", str(path))
    assert (code, out) == (0, "[rank 0] new run\n"), err
    assert err.startswith("slurmgen: note: 3 registered jobs have the id 5; this is the newest, 'second' submitted ")
    assert (
        "older: 'elsewhere' submitted" in err and " on c2 " in err and "; 'first' submitted" in err and " on c1 " in err
    )
    code, out, err = run(capsys, "logs", "first", "--registry", str(path))  # the older one, by its name
    assert (code, out, err) == (0, "[rank 0] old run\n", "")


def test_cancel_refuses_a_job_whose_id_a_later_job_has(tmp_path, capsys, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("scancel", "scontrol"):  # stand-ins that only record that they ran
        (bin_dir / tool).write_text(f"#!/bin/sh\necho {tool} >> {tmp_path}/called\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    path = tmp_path / "jobs.sqlite"
    with Registry.open(path, create=True) as reg:
        _two_jobs_with_id_5(tmp_path, reg)
    code, out, err = run(capsys, "cancel", "first", "--registry", str(path))
    assert (code, out, err.count("\n")) == (2, "", 1) and "nothing was cancelled" in err, err
    assert "the id 5 now names a later job, 'second'" in err and not (tmp_path / "called").exists()


# --- JOB lookup -----------------------------------------------------------------------------------
def test_find_by_id_task_name_and_dir(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "job.yaml").write_text("nodes: 1\n")
    monkeypatch.chdir(tmp_path)
    with registry(tmp_path) as reg:
        reg.add_many([record("5", tmp_path), record("6", tmp_path)])
        assert find(reg, "5") == (reg.get("5"), None)
        reg.add(record("8", tmp_path, array=4))
        assert find(reg, "8_3") == (reg.get("8"), "3")
        assert find(reg, "rec")[0].job_id == "8" and find(reg, "out")[0].job_id == "8"
        for ref, words in [
            ("0", "not a job id"),
            ("5_", "not a job id"),
            ("5_3", "5 is not an array job"),
            ("9", "not in the registry"),
            ("nope", "no registered job"),
            (str(tmp_path), "holds no job.yaml"),
        ]:
            with pytest.raises(SlurmgenError, match=words):
                find(reg, ref)


def test_a_folder_named_like_a_job_does_not_hide_the_job(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bt").mkdir()  # any folder, not a slurmgen output dir
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "bt-5.out").write_text("0: hello\n")
    path = tmp_path / "jobs.sqlite"
    with Registry.open(path, create=True) as reg:
        reg.add(record("5", tmp_path, name="bt"))
    code, out, err = run(capsys, "logs", "bt", "--registry", str(path))
    assert (code, out) == (0, "[rank 0] hello\n") and "is the name of job 5" in err, err
    with Registry.open(path) as reg:
        notes: list[str] = []
        assert find(reg, "bt", notes.append)[0].job_id == "5"
        assert notes == [
            "'bt' is the name of job 5, which is meant; for a job submitted from the directory 'bt', give it as ./bt"
        ]
        with pytest.raises(SlurmgenError, match=r"directory './bt' holds no job.yaml"):
            find(reg, "./bt")  # a path: the directory only
        (tmp_path / "other").mkdir()
        with pytest.raises(
            SlurmgenError, match=r"no registered job is named 'other', and directory 'other' holds no job"
        ):
            find(reg, "other")
        (tmp_path / "other" / "job.yaml").write_text("nodes: 1\n")
        with pytest.raises(
            SlurmgenError, match=r"no registered job is named 'other', and no job was submitted from dir"
        ):
            find(reg, "other")


# --- the commands, with the stand-in runner -------------------------------------------------------
def test_status_of_a_failed_job_names_the_task_and_its_code(tmp_path):
    scontrol = (DATA / "scontrol_failed.txt").read_text()
    log = (DATA / "log_fail.txt").read_text()
    rec = record("7", tmp_path, name="fail")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "slurmgen-7.attempts.jsonl").write_text(
        '{"event": "start", "attempt": 1}\n{"event": "end", "attempt": 1, "exit_code": 3, "action": "stop"}\n{"cut'
    )
    runner = FakeRunner(
        scontrol,
        {
            str(tmp_path / "logs" / "fail-7.out"): log,
            str(tmp_path / "logs" / "slurmgen-7.attempts.jsonl"): (
                tmp_path / "logs" / "slurmgen-7.attempts.jsonl"
            ).read_text(),
        },
    )
    with registry(tmp_path) as reg:
        reg.add(rec)
        view = commands.status(runner, reg, rec, None)
        assert reg.get("7").last_state == "FAILED"
    assert (view["state"], view["exit_code"], view["nodes"]) == ("FAILED", 3, "node[1-2]")
    assert view["first_failure"] == {
        "job": "7",
        "state": "FAILED",
        "exit_code": 3,
        "node": "node1",
        "task": 1,
        "rank": None,
        "what": "Exited with exit code 3",
    }
    assert [a["event"] for a in view["attempts"]] == ["start", "end"]
    text = "\n".join(format_view(view))
    assert "failed: 7 FAILED (exit code 3) task 1 on node1: Exited with exit code 3" in text
    assert "attempt 1: exit 3 -> stop" in text


def test_an_attempt_a_requeue_ended_is_described_as_requeued(tmp_path):
    """The program requeued its job (Lightning on USR1): Slurm killed the batch shell "DUE TO JOB
    REQUEUE" before it wrote attempt 1's end. Once attempt 2 started, attempt 1 has an end, derived,
    saying why (issue 34 item 5), for `status` and the run page; the running attempt 2 has none."""
    from slurmgen.coordinator.web.run_detail import slurm_attempts

    scontrol = (DATA / "scontrol_running.txt").read_text().replace("JobId=1 ", "JobId=7 ")
    rec = record("7", tmp_path, name="pl")
    attempts = tmp_path / "logs" / "slurmgen-7.attempts.jsonl"
    attempts.parent.mkdir()
    attempts.write_text(
        '{"event": "start", "job": "7", "attempt": 1, "time": 100.0, "host": "node1"}\n'
        '{"event": "start", "job": "7", "attempt": 2, "time": 190.0, "host": "node2"}\n'
    )
    runner = FakeRunner(scontrol, {str(attempts): attempts.read_text()})
    with registry(tmp_path) as reg:
        reg.add(rec)
        view = commands.status(runner, reg, rec, None)
    assert [(a["event"], a["attempt"]) for a in view["attempts"]] == [("start", 1), ("end", 1), ("start", 2)]
    end = view["attempts"][1]
    assert (end["cause"], end["derived"], end["time"], end.get("exit_code"), end.get("action")) == (
        "requeued",
        True,
        None,
        None,
        None,
    )
    text = "\n".join(format_view(view))
    assert "  attempt 1: requeued\n" in text + "\n" and "attempt 2:" not in text, text
    rows = slurm_attempts(view["attempts"])
    assert [(r["number"], r["state"], r["cause"]) for r in rows] == [(1, "preempted", "requeued"), (2, "running", None)]


def test_status_names_the_failing_rank_from_its_note_not_the_nodes_agent(tmp_path):
    # torchrun: srun reports node1's agent (task 0); rank 1's own note says what failed first.
    log = (
        "0: slurmgen-exit: rank 1 on node1 (task 0) exited with code 3 at 1763900000.5\n"
        "srun: error: node1: task 0: Exited with exit code 1\n"
    )
    rec = record("7", tmp_path, name="fail")
    runner = FakeRunner((DATA / "scontrol_failed.txt").read_text(), {str(tmp_path / "logs" / "fail-7.out"): log})
    with registry(tmp_path) as reg:
        reg.add(rec)
        view = commands.status(runner, reg, rec, None)
    assert view["first_failure"] == {
        "job": "7",
        "state": "FAILED",
        "exit_code": 3,
        "node": "node1",
        "task": 0,
        "rank": 1,
        "what": "rank 1 exited with code 3",
    }


def test_status_of_a_sweep_shows_the_grid(tmp_path):
    from slurmgen import tracking

    run = tracking.init(str(tmp_path / "runs" / "train" / "tracking"), group="slurm-4_1")  # as array task 1's trainer
    run.log(type="train", metrics={"loss": 0.25}, step=10)
    run.finish()
    grid = sweep.grid_jsonl(sweep.points({"lr": [1, 2], "bs": [8, 16]}))
    rec = record("4", tmp_path, array=4, sweep_file=str(tmp_path / "out" / "sweep.jsonl"))
    # Task 1 runs as job 6 (its SLURM_JOB_ID names its attempts file); id 4 is the array's and, until
    # the last task starts, that of the tasks still pending: none of them has attempts yet.
    attempts = {
        str(
            tmp_path / "logs" / f"slurmgen-{i}.attempts.jsonl"
        ): f'{{"event": "end", "job": "{i}", "attempt": 1, "exit_code": 75, "action": "requeue"}}\n'
        for i in (4, 6)
    }
    attempts[str(tmp_path / "logs" / "slurmgen-5.attempts.jsonl")] = (
        '{"event": "end", "attempt": 1, "exit_code": 0, "action": "finished"}\n'
    )
    runner = FakeRunner((DATA / "scontrol_array.txt").read_text(), {rec.info["sweep_file"]: grid, **attempts})
    with registry(tmp_path) as reg:
        reg.add(rec)
        view = commands.status(runner, reg, rec, None)
    assert view["state"] == "RUNNING"
    assert [(t["job"], t["state"], t["params"]) for t in view["tasks"]] == [
        ("4_0", "RUNNING", {"lr": 1, "bs": 8}),
        ("4_1", "RUNNING", {"lr": 1, "bs": 16}),
        ("4_2", "PENDING", {"lr": 2, "bs": 8}),
        ("4_3", "PENDING", {"lr": 2, "bs": 16}),
    ]
    assert view["tasks"][2]["reason"] == "JobArrayTaskLimit"
    assert view["tasks"][1]["run"]["loss"] == 0.25 and "run" not in view["tasks"][0]
    assert [len(t.get("attempts", [])) for t in view["tasks"]] == [1, 1, 0, 0] and "attempts" not in view
    text = "\n".join(format_view(view))
    assert "4_1  RUNNING     loss 0.25  lr=1 bs=16\n              attempt 1: preempted -> requeue" in text, text
    assert text.count("attempt") == 1, text  # task 0 ran once and finished: nothing to say in the grid


def test_status_of_an_array_task_the_controller_forgot_shows_its_steps(tmp_path):
    recorded = (DATA / "sacct_array.txt").read_text().partition("\n#STDERR\n")[0]
    rec = record("5", tmp_path, name="sweep", array=3)
    runner = FakeRunner("", sacct=recorded)  # scontrol lists nothing: only accounting knows array 5
    with registry(tmp_path) as reg:
        reg.add(rec)
        view = commands.status(runner, reg, rec, "1")
    assert (view["job"], view["state"], view["exit_code"], view["source"]) == ("5_1", "FAILED", 2, "sacct")
    assert view["steps"] == [
        {"step": "batch", "state": "FAILED", "exit_code": 2},
        {"step": "0", "state": "FAILED", "exit_code": 2},
    ]
    assert [c[0] for c in runner.calls] == ["scontrol", "sacct"] and view["notes"] == []
    assert "step 0: FAILED exit code 2" in "\n".join(format_view(view))


def test_status_of_an_array_the_controller_forgot_shows_each_tasks_attempts(tmp_path):
    # Only sacct's JobIDRaw still names the tasks' own ids (5_0 ran as 7, 5_1 as 8, 5_2 as 5),
    # which their attempts files are named after.
    recorded = (DATA / "sacct_array.txt").read_text().partition("\n#STDERR\n")[0]
    rec = record("5", tmp_path, name="sweep", array=3)
    logs = tmp_path / "logs"
    files = {
        str(logs / f"slurmgen-{i}.attempts.jsonl"): f'{{"event": "end", "job": "{i}", "attempt": 1, "exit_code": 0, '
        f'"action": "finished"}}\n'
        for i in (5, 7)
    }
    files[str(logs / "slurmgen-8.attempts.jsonl")] = (
        '{"event": "end", "job": "8", "attempt": 1, "exit_code": 2, "node": "node1", "task": 0, "action": "stop"}\n'
    )
    runner = FakeRunner("", files, sacct=recorded)  # scontrol lists nothing: only accounting knows array 5
    with registry(tmp_path) as reg:
        reg.add(rec)
        view = commands.status(runner, reg, rec, None)
        one = commands.status(runner, reg, rec, "1")
    assert [(t["job"], [a["job"] for a in t.get("attempts", [])]) for t in view["tasks"]] == [
        ("5_0", ["7"]),
        ("5_1", ["8"]),
        ("5_2", ["5"]),
    ]
    assert (one["job"], [a["exit_code"] for a in one["attempts"]]) == ("5_1", [2])
    text = "\n".join(format_view(view))
    assert "5_1  FAILED     exit 2  loss -\n              attempt 1: bad input (task 0 on node1) -> stop" in text, text
    assert text.count("attempt") == 1, text  # tasks 0 and 2 ran once and finished


def test_jobs_asks_slurm_once_for_a_thousand_jobs_and_remembers_states(tmp_path):
    with registry(tmp_path) as reg:
        reg.add_many([record(str(i), tmp_path) for i in range(1, 1001)])
        runner = FakeRunner((DATA / "scontrol_running.txt").read_text())
        rows = listing.list_jobs(lambda *a: runner, reg, None)
        assert runner.calls == [["scontrol", "show", "job", "-o"]]
        assert len(rows) == 1000 and rows[-1]["state"] == "RUNNING" and rows[0]["state"] == "UNKNOWN"
        assert reg.get("1").last_state == "RUNNING"


def test_the_list_shows_each_slurm_jobs_attempt_as_slurm_last_gave_it(tmp_path, monkeypatch, capsys):
    """A Slurm job's attempt (restart count + 1, once started) is kept in its row when `jobs` asks
    Slurm, so the page's list (one SELECT, never asking Slurm) and `jobs` show it, also once the
    controller has forgotten the job; with its end time, and exit 75 as preempted."""
    from slurmgen.coordinator.web.runs_page import run_view

    array = (DATA / "scontrol_array.txt").read_text().replace("ArrayTaskId=1 ", "ArrayTaskId=1 Restarts=1 ", 1)
    array = re.sub(r"(ArrayTaskId=1 Restarts=1 .*?) Restarts=0", r"\1", array)  # task 1 (job 6) was requeued once
    answer = "\n".join(
        [
            scontrol_as("scontrol_pending_held.txt", "1"),
            scontrol_as("scontrol_running.txt", "2"),
            scontrol_as("scontrol_running.txt", "3", JobState="PENDING", Reason="BeginTime", Restarts="1"),
            scontrol_as("scontrol_completed.txt", "7", JobState="FAILED", ExitCode="75:0", Restarts="2"),
            array,
        ]
    )
    with registry(tmp_path) as reg:
        reg.add_many([record(i, tmp_path) for i in ("1", "2", "3", "7")] + [record("4", tmp_path, 8.0, array=4)])
        shown = {r["job"]: r["attempts"] for r in listing.list_jobs(lambda *a: FakeRunner(answer), reg, None)}
    # Held since submission: no attempt yet; running: 1; pending after a requeue: its 2nd waits;
    # ended after two requeues: 3; an array: its furthest task's.
    expected = {"1": 0, "2": 1, "3": 2, "7": 3, "4": 2}
    assert shown == expected, shown
    with Registry.open(tmp_path / "jobs.sqlite") as reg:  # what the page reads, from the file
        rows = list_rows(reg)
        assert {r["job_id"]: r["attempts"] for r in rows} == expected
        views = {r["job_id"]: run_view(r, 2e9) for r in rows}
        assert (views["7"]["state"], views["7"]["attempts"], views["7"]["ended"]) == ("preempted", 3, True), views["7"]
        forgotten = {r["job"]: r["attempts"] for r in listing.list_jobs(lambda *a: FakeRunner(""), reg, None)}
    assert forgotten == expected, forgotten
    # `slurmgen jobs` says it too, and what Slurm's FAILED of exit 75 means.
    monkeypatch.setattr(Runners, "__call__", lambda self, *a: FakeRunner(answer))
    _, out, _ = run(capsys, "jobs", "--registry", str(tmp_path / "jobs.sqlite"))
    lines = {line.split()[1]: line for line in out.splitlines()}
    assert "  PENDING    attempt 2  " in lines["3"] and "attempt" not in lines["2"], out
    assert "  FAILED     exit 75 (preempted: checkpointed, resumable) attempt 3  " in lines["7"], out


def test_wait_polls_until_the_end_and_returns_the_code(tmp_path):
    answers = [
        (DATA / "scontrol_running.txt").read_text(),
        (DATA / "scontrol_failed.txt").read_text().replace("JobId=7", "JobId=1"),
    ]
    runner = FakeRunner()
    naps = []

    def nap(seconds):
        naps.append(seconds)
        runner.scontrol = answers[1]

    runner.scontrol = answers[0]
    with registry(tmp_path) as reg:
        reg.add(rec := record("1", tmp_path))
        assert commands.wait(runner, rec, sleep=nap, registry=reg) == ("FAILED", 3)
    assert naps == [commands.POLL]
    with reg_again(tmp_path) as reg:  # `submit --wait` keeps what the list shows: state, end, attempt
        (row,) = list_rows(reg)
    assert (row["state"], row["last_exit"], row["attempts"], row["ended"] is not None) == ("failed", 3, 1, True), row


def test_submit_registers_what_sbatch_said(tmp_path):
    rendered = render(build_spec({"output_dir": "out", "sweep": {"lr": [1, 2, 3]}, "job_name": "s"}))
    runner = FakeRunner()
    with registry(tmp_path) as reg:
        rec = commands.submit(runner, reg, rendered, str(tmp_path), ["--parsable", "--hold"], None, {})
        assert reg.get("77").info["array"] == 3
    assert runner.calls == [["sbatch", "--parsable", "--hold", "out/run_slurm.sh"]]
    assert (rec.output_dir, rec.info["sweep_file"]) == (str(tmp_path / "out"), str(tmp_path / "out" / "sweep.jsonl"))
    with pytest.raises(SlurmgenError, match="sbatch: error: Batch job submission failed: Invalid partition"):
        commands.job_id_from("", "sbatch: error: Batch job submission failed: Invalid partition name specified\n", 1)


# --- the command line: bad input is one line, exit 2, registry untouched ---------------------------
@pytest.mark.parametrize(
    "args, words",
    [
        (["status", "12.5"], "job: '12.5' is not a job id"),
        (["logs", "0"], "job: '0' is not a job id"),
        (["cancel", "999"], "job: 999 is not in the registry"),
        (["status", "nosuchjob"], "no registered job has the id, name or output dir 'nosuchjob'"),
        (["cancel", "5", "--signal", "USR1;x"], "signal: expected a signal name or number"),
        (["logs", "5", "--rank", "1", "--node", "0"], "give --rank or --node, not both"),
        # A rank the job does not have printed nothing and exited 0: name the ranks it has.
        (["logs", "5", "--rank", "7"], "rank: job 5 has ranks 0-3 (got 7)"),
    ],
)
def test_bad_job_references(capsys, tmp_path, args, words):
    path = tmp_path / "jobs.sqlite"
    with Registry.open(path, create=True) as reg:
        reg.add(record("5", tmp_path))
    before = path.read_bytes()
    code, out, err = run(capsys, *args, "--registry", str(path))
    assert (code, out, err.count("\n")) == (2, "", 1) and words in err, err
    assert path.read_bytes() == before


@pytest.mark.parametrize("command", [["status"], ["jobs"], ["logs", "5"], ["cancel", "5"], ["status", "5", "--json"]])
def test_a_registry_that_is_not_a_database_is_refused_untouched(capsys, tmp_path, command):
    path = tmp_path / "jobs.sqlite"
    path.write_bytes(b"certainly not SQLite\n" * 100)
    mtime = path.stat().st_mtime_ns
    code, out, err = run(capsys, *command, "--registry", str(path))
    assert (code, out, err.count("\n")) == (2, "", 1) and "is not a job registry" in err, err
    assert path.read_bytes() == b"certainly not SQLite\n" * 100 and path.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs.sqlite"]  # no journal left beside it


def test_submit_refuses_bad_input_before_writing_or_submitting(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for args, words in [
        (["--dependency", "afterok:12;rm"], "dependency: expected sbatch's form"),
        (["--sweep", "lr=1", "--sweep-file", "p.jsonl"], "give --sweep or --sweep-file, not both"),
        (["--nodes", "0"], "nodes:"),
    ]:
        code, _, err = run(capsys, "submit", "--registry", "r.sqlite", *args)
        assert code == 2 and words in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_create_dry_run_shows_the_sweep_grid(capsys):
    code, out, _ = run(capsys, "create", "--dry-run", "--sweep", "lr=1,2", "--sweep-args", "{key}={value}")
    assert code == 0 and "#SBATCH --array=0-1" in out and "0) cmd+=(lr=1) ;;" in out
    assert '{"task": 1, "params": {"lr": "2"}}' in out


# --- code snapshots for --remote ------------------------------------------------------------------
def test_snapshots_are_content_addressed_and_follow_git(tmp_path):
    from slurmgen.jobs.snapshot import take

    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "train.py").write_text("print(1)\n")
    (code / ".gitignore").write_text("data/\n")
    (code / "data").mkdir()
    (code / "data" / "huge.bin").write_text("never shipped")
    with pytest.raises(SlurmgenError, match="not in a git work tree"):
        take(code, whole_dir=False)
    assert take(code, whole_dir=True).files == 3  # --code DIR outside git: everything under it
    git = ["git", "-C", str(code), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "x"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    clean = take(code, whole_dir=False)
    assert (clean.files, clean.dirty, clean.diff, len(clean.commit)) == (2, False, "", 40)
    os.utime(code / "pkg" / "train.py", (1, 1))  # times are not content: same digest
    assert take(code, whole_dir=False).digest == clean.digest
    (code / "pkg" / "train.py").write_text("print(2)\n")
    dirty = take(code, whole_dir=False)
    assert dirty.dirty and "+print(2)" in dirty.diff and dirty.digest != clean.digest


def test_logs_follow_with_tail_prints_the_last_lines_of_a_rank_then_follows(tmp_path, capsys):
    from slurmgen.jobs.cli import _print_logs

    rec = record("1", tmp_path)
    path = str(tmp_path / "logs" / "rec-1.out")
    done = (DATA / "scontrol_completed.txt").read_text().split("\n#RC")[0]
    runner = FakeRunner(files={path: "0: a0\n1: a1\n1: b1\n0: b0\n1: c1\n1: cut"})
    states = iter(["", done])

    def scontrol_then_grow(argv, **kw):  # the job writes on while it is followed, then ends
        if argv[:3] == ["scontrol", "show", "job"]:
            runner.files[path] += " short\n1: d1\n0: d0\n"
            return Result(0, next(states), "")
        return FakeRunner.run(runner, argv, **kw)

    runner.run = scontrol_then_grow
    _print_logs(runner, rec, None, 1, None, True, 2, False)
    assert capsys.readouterr().out.splitlines() == ["[rank 1] b1", "[rank 1] c1", "[rank 1] cut short", "[rank 1] d1"]


class ShellAsLogin:
    """Runs argv here with real sh, as a login node would: `where` makes status take the remote path."""

    where = "login1"

    def __init__(self):
        self.calls = []

    def run(self, argv, *, cwd=None, stdin=b"", timeout=60):
        self.calls.append(argv[:2])
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        return Result(done.returncode, done.stdout, done.stderr)


def test_run_records_on_a_login_node_read_the_same_as_here(tmp_path):
    from slurmgen import tracking
    from slurmgen.jobs.remote_records import by_group

    ckpt = tmp_path / "work" / "ck" / "step_30.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"x")
    for group in ("slurm-7", "slurm-70", "slurm-7_1"):  # slurm-70 is another job: never read
        run = tracking.init(str(tmp_path / "work" / "out dir" / "tracking"), group=group)
        for step in range(10, 40, 10):
            run.log(type="train", metrics={"loss": 1 / step}, step=step)
        run.mark_output(run.create_artifact("ckpt", "checkpoint").add_file(str(ckpt)))
        run.finish()
    (tmp_path / "work" / "out dir" / "tracking" / "slurm-7_1" / "main" / "metrics.jsonl").open("a").write('{"cut')
    (tmp_path / "work" / "runs" / "slurm-7_2" / "main").mkdir(parents=True)
    (tmp_path / "work" / "runs" / "slurm-7_2" / "main" / "run.json").write_text("{not json")
    command = ["python", "--out-dir", "out dir", "--out-dir", str(tmp_path / "work" / "out dir")]  # relative, absolute
    wanted = {"slurm-7", "slurm-7_1", "slurm-7_2", "slurm-70"}
    here = by_group(FakeRunner(), str(tmp_path / "work"), command, "7", wanted)
    login = ShellAsLogin()
    there = by_group(login, str(tmp_path / "work"), command, "7", wanted)
    assert login.calls == [["sh", "-c"]]  # one command over the connection, whatever the number of runs
    assert sorted(there) == ["slurm-7", "slurm-7_1"] and there == {k: v for k, v in here.items() if k != "slurm-70"}
    assert there["slurm-7_1"] == {
        "step": 30,
        "loss": 1 / 30,
        "status": "finished",
        "checkpoint": str(ckpt),
        "dir": str(tmp_path / "work" / "out dir" / "tracking" / "slurm-7_1" / "main"),
    }
    assert by_group(login, str(tmp_path / "nowhere"), command, "7", wanted) == {}


def test_wait_rides_out_a_failing_scontrol_call(tmp_path):
    runner = FakeRunner((DATA / "scontrol_failed.txt").read_text().replace("JobId=7", "JobId=1"))
    answers = iter([Result(1, "", "slurm_load_jobs error: Socket timed out on send/recv operation\n")])

    def flaky(argv, **kw):
        return next(answers, None) or FakeRunner.run(runner, argv, **kw)

    runner.run = flaky
    assert commands.wait(runner, record("1", tmp_path), sleep=lambda s: None) == ("FAILED", 3)


# --- cancel, signals, steps, pending -----------------------------------------------------------
class CancelRunner(FakeRunner):
    """scontrol answers from `answers` in turn (the last one stays); scancel succeeds and is counted."""

    def __init__(self, answers: list[str], sacct: str | None = None):
        super().__init__(answers[0], sacct=sacct)
        self.answers = list(answers)

    def run(self, argv, **kw):
        if argv[0] == "scancel":
            self.calls.append(list(argv))
            return Result(0, "", "")
        if argv[:3] == ["scontrol", "show", "job"]:
            self.scontrol = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return FakeRunner.run(self, argv, **kw)


def scontrol_as(name: str, job_id: str, **fields: str) -> str:
    """A recorded `scontrol show job -o` line under another id, with some fields replaced."""
    text = (DATA / name).read_text().partition("\n#")[0]
    for key, value in {"JobId": job_id, **fields}.items():
        text = re.sub(rf"\b{key}=\S*", f"{key}={value}", text, count=1)
    return text


@pytest.mark.parametrize(
    "scontrol, sacct, said",
    [
        (scontrol_as("scontrol_completed.txt", "4"), None, "job 4 had already ended: COMPLETED, exit code 0"),
        # Forgotten by the controller, no accounting: the registry's last state, never "CANCELLED".
        ("", None, "job 4 had already ended: Slurm no longer knows it; last seen COMPLETED, exit code 0"),
    ],
)
def test_cancel_leaves_an_ended_job_alone_and_says_how_it_ended(tmp_path, scontrol, sacct, said):
    rec = record("4", tmp_path)
    runner = CancelRunner([scontrol], sacct=sacct)
    with registry(tmp_path) as reg:
        reg.add(rec)
        reg.remember_states({rec.seq: ("COMPLETED", 0)})
        rec = reg.get("4")
        result = stopping.cancel(runner, reg, rec, None, None, sleep=lambda s: None)
    assert (result["said"], result["ended"], result["already_ended"]) == (said, True, True)
    assert not [c for c in runner.calls if c[0] == "scancel"]


def test_cancel_waits_for_the_end_and_tells_a_requeue_from_an_end(tmp_path):
    running = scontrol_as("scontrol_running.txt", "4")
    rec = record("4", tmp_path)
    ended = CancelRunner([running, running, scontrol_as("scontrol_running.txt", "4", JobState="CANCELLED")])
    requeued = CancelRunner([running, scontrol_as("scontrol_running.txt", "4", JobState="PENDING", Restarts="1")])
    with registry(tmp_path) as reg:
        reg.add(rec)
        done = stopping.cancel(ended, reg, rec, None, None, sleep=lambda s: None)
        again = stopping.cancel(requeued, reg, rec, None, None, sleep=lambda s: None)
    assert (done["said"], done["ended"]) == ("job 4: CANCELLED", True) and ["scancel", "4"] in ended.calls
    assert (again["state"], again["ended"]) == ("PENDING", False) and "requeued instead of ending" in again["said"]


@pytest.mark.parametrize(
    "command, info, signal, warned",
    [
        (["bash", "-c", "sleep 60"], {}, "USR2", True),
        (["bash", "-c", "sleep 60"], {}, "12", True),
        (["bash", "-c", "sleep 60"], {}, "TERM", False),  # meant to stop it
        (["python", "-m", "slurmgen.train", "--max-steps", "9"], {}, "USR2", False),
        (["python", "-m", "slurmgen.train"], {}, "SIGUSR1", True),  # not its preempt_signal: it dies of it
        (["python", "-m", "slurmgen.train"], {"preempt_signal": "USR1"}, "SIGUSR1", False),
        (["/venv/bin/slurmgen", "train"], {}, "USR2", False),
        (["python", "mine.py"], {"preempt_contract": True}, "USR2", False),
    ],
)
def test_cancel_signal_warns_when_the_program_may_die_of_it(tmp_path, command, info, signal, warned):
    warning = stopping.signal_warning(record("4", tmp_path, command=command, **info), signal)
    assert (warning is not None) == warned, warning
    if warned:
        assert warning.startswith(f"job 4 runs `{' '.join(command)}`, which did not declare that it handles")


def test_status_says_the_user_signalled_a_program_that_had_no_handler(tmp_path):
    # scancel --signal=USR2 on `bash -c 'sleep 60'`: every rank died of it, 128 + 12.
    log = (
        "0: slurmgen-exit: rank 0 on node1 (task 0) exited with code 140 at 1763900000.5\n"
        "1: slurmgen-exit: rank 1 on node2 (task 1) exited with code 140 at 1763900000.6\n"
    )
    rec = record("7", tmp_path, name="fail", command=["bash", "-c", "sleep 60"])
    runner = CancelRunner(
        [scontrol_as("scontrol_running.txt", "7"), scontrol_as("scontrol_failed.txt", "7", ExitCode="140:0")]
    )
    runner.files = {str(tmp_path / "logs" / "fail-7.out"): log}
    with registry(tmp_path) as reg:
        reg.add(rec)
        assert stopping.cancel(runner, reg, rec, None, "USR2")["said"] == "sent USR2 to 7"
        rec = reg.get("7")
        view = commands.status(runner, reg, rec, None)
    assert view["signalled"]["signal"] == "USR2" and view["signalled"]["exit_code"] == 140
    text = "\n".join(format_view(view))
    assert (
        "failed: 7 FAILED, signalled by the user (USR2, slurmgen cancel --signal), which the program did not "
        "handle: killed by signal 12 (USR2) (exit code 140)"
    ) in text
    assert "rank 0 exited" not in text, text


def test_steps_ended_by_a_signal_say_so():
    recorded = (
        "9|9|j|CANCELLED by 0|0:0|00:00:01|00:05:00|node1|/w\n9.batch|9.batch|batch|CANCELLED|0:15|00:00:01||node1|\n"
        "9.0|9.0|bash|FAILED|15:0|00:00:01||node1|\n9.1|9.1|bash|FAILED|3:0|00:00:01||node1|\n"
    )
    from slurmgen.jobs.slurm import QueryResult, parse_sacct
    from slurmgen.jobs.view import job_view

    jobs, steps = parse_sacct(recorded)
    snap = QueryResult(steps=steps)
    view = job_view(JobRecord("9", "j", "/o", 1.0), snap, [{"job": "9", "state": "CANCELLED", "exit_code": 143}], [])
    text = format_view(view)
    assert "  step batch: CANCELLED killed by signal 15 (TERM)" in text
    assert "  step 0: FAILED exit code 15 or 143 (killed by signal 15 (TERM)): sacct writes both as 15" in text
    assert "  step 1: FAILED exit code 3" in text
    assert view["steps"][0] == {"step": "batch", "state": "CANCELLED", "exit_code": 143, "signal": 15}


def test_pending_after_a_requeue_says_when_it_becomes_eligible(tmp_path):
    line = scontrol_as(
        "scontrol_running.txt",
        "4",
        JobState="PENDING",
        Reason="BeginTime",
        Restarts="1",
        EligibleTime="2026-11-23T12:27:21",
    )
    rec = record("4", tmp_path)
    with registry(tmp_path) as reg:
        reg.add(rec)
        view = commands.status(CancelRunner([line]), reg, rec, None)
    now = datetime.fromisoformat("2026-11-23T12:25:44").timestamp()
    assert view["eligible"] == "2026-11-23T12:27:21"
    assert "  pending: requeued, eligible at 12:27:21 (in 97 s)" in format_view(view, now=now)
    assert "  pending: JobHeldUser" in format_view(
        commands.status(CancelRunner([scontrol_as("scontrol_pending_held.txt", "4")]), reg_again(tmp_path), rec, None),
        now=now,
    )


def reg_again(tmp_path: Path) -> Registry:
    return Registry.open(tmp_path / "jobs.sqlite")


class RequeueRunner(CancelRunner):
    """scontrol show answers from `answers`; `scontrol requeue` answers `requeue` and is counted."""

    def __init__(self, answers: list[str], requeue: Result = Result(0, "", "")):
        super().__init__(answers)
        self.requeue = requeue

    def run(self, argv, **kw):
        if argv[:2] == ["scontrol", "requeue"]:
            self.calls.append(list(argv))
            return self.requeue
        return super().run(argv, **kw)


def test_requeue_sends_scontrol_requeue_for_a_failed_job_only(tmp_path):
    rec = record("4", tmp_path)
    failed = RequeueRunner([scontrol_as("scontrol_running.txt", "4", JobState="FAILED")])
    running = RequeueRunner([scontrol_as("scontrol_running.txt", "4")])
    refused = RequeueRunner(
        [scontrol_as("scontrol_running.txt", "4", JobState="PREEMPTED")],
        Result(1, "", "Requested operation is presently disabled for job 4\n"),
    )
    with registry(tmp_path) as reg:
        reg.add(rec)
        done, said = stopping.requeue(failed, reg, rec)
        assert done and said.startswith("requeued job 4 (it was FAILED)")
        assert ["scontrol", "requeue", "4"] in failed.calls and reg.get("4").info["requeued"][0]["from"] == "FAILED"
        assert stopping.requeue(running, reg, rec) == (
            False,
            "job 4 was not requeued: the job is RUNNING, not ended: only a failed or preempted job is requeued",
        )
        assert not [c for c in running.calls if c[:2] == ["scontrol", "requeue"]]
        assert stopping.requeue(refused, reg, rec) == (
            False,
            "job 4 was not requeued: scontrol: Requested operation is presently disabled for job 4",
        )


def test_status_says_where_each_in_job_restart_went_on():
    # The attempts record of a job with --restarts --spare-nodes: node3 took node2's place.
    records = [
        {"event": "start", "attempt": 1, "nodes": "node1,node2", "restart": 0},
        {
            "event": "end",
            "attempt": 1,
            "exit_code": 137,
            "rank": 1,
            "node": "node2",
            "action": "restart",
            "exclude": "node2",
        },
        {"event": "start", "attempt": 2, "nodes": "node1,node3", "restart": 1},
        {"event": "end", "attempt": 2, "exit_code": 0, "action": "finished"},
    ]
    text = "\n".join(
        format_view({"job": "7", "name": "x", "state": "COMPLETED", "output_dir": "o", "attempts": records})
    )
    assert (
        "attempt 1: killed by signal 9 (rank 1 on node2) -> restart on node1,node3"
        " (node2 left out, spare node3 took its place)\n" in text
    )
    assert text.endswith("attempt 2: ok -> finished")


def test_status_says_when_an_in_job_restart_went_on_in_a_smaller_world():
    # --nodes 2 --min-nodes 1 --restarts 1, no spare: node2 was lost, the next step ran on node1 alone.
    records = [
        {"event": "start", "attempt": 1, "nodes": "node1,node2", "restart": 0},
        {"event": "end", "attempt": 1, "exit_code": 143, "rank": 2, "node": "node2", "action": "restart",
         "exclude": "node2"},
        {"event": "start", "attempt": 2, "nodes": "node1", "restart": 1, "min_nodes": 1},
        {"event": "end", "attempt": 2, "exit_code": 0, "action": "finished"},
    ]  # fmt: skip
    text = "\n".join(
        format_view({"job": "7", "name": "x", "state": "COMPLETED", "output_dir": "o", "attempts": records})
    )
    assert "-> restart on node1 (2 -> 1 nodes: node2 lost, --min-nodes 1)\n" in text, text
    # A spare and a smaller world at once (3 nodes, 1 spare, 2 lost): both are said.
    records[0]["nodes"], records[2]["nodes"], records[2]["min_nodes"] = "n1,n2,n3", "n1,n4", 2
    text = "\n".join(
        format_view({"job": "7", "name": "x", "state": "COMPLETED", "output_dir": "o", "attempts": records})
    )
    assert "-> restart on n1,n4 (3 -> 2 nodes: n2,n3 lost, spare n4 took a place, --min-nodes 2)\n" in text, text


def test_status_and_the_run_page_say_each_warm_restart_inside_its_attempt():
    # --restarts 2 --restart-mode warm: rank 1 started anew in attempt 1 (a recovery line), then a
    # second failure too soon after it: a cold restart, attempt 2. The recovery ends no attempt.
    what = "warm restart 1: rank 1 started anew after rank 1 exited with code 137 on node1"
    lines = [
        {"event": "start", "job": "7", "attempt": 1, "time": 1.0, "nodes": "node1,node2", "restart": 0},
        {"event": "recovery", "job": "7", "attempt": 1, "time": 2.0, "generation": 1, "rank": 1, "node": "node1",
         "exit_code": 137, "what": what},
        {"event": "end", "job": "7", "attempt": 1, "time": 3.0, "exit_code": 1, "rank": 3, "node": "node2",
         "action": "restart", "exclude": None},
        {"event": "start", "job": "7", "attempt": 2, "time": 4.0, "nodes": "node1,node2", "restart": 2},
        {"event": "end", "job": "7", "attempt": 2, "time": 5.0, "exit_code": 0, "action": "finished"},
    ]  # fmt: skip
    text = "\n".join(json.dumps(line) for line in lines)
    records = parse_attempts(text)
    assert [r["event"] for r in records] == ["start", "recovery", "end", "start", "end"], "no requeue end derived"
    said = "\n".join(
        format_view({"job": "7", "name": "x", "state": "COMPLETED", "output_dir": "o", "attempts": records})
    )
    assert f"  attempt 1: {what}\n  attempt 1: failed (rank 3 on node2) -> restart on node1,node2\n" in said, said
    from slurmgen.coordinator.web.run_detail import slurm_attempts

    rows = slurm_attempts(records, State.SUCCEEDED)
    assert [(r["number"], r["next"]) for r in rows] == [(1, f"{what}; restarted on node1,node2"), (2, None)], rows
    # One warm restart alone: the attempt that went on says it, and no restart follows.
    rows = slurm_attempts([records[0], records[1], {**records[4], "attempt": 1}], State.SUCCEEDED)
    assert [(r["number"], r["state"], r["next"]) for r in rows] == [(1, "succeeded", what)], rows
