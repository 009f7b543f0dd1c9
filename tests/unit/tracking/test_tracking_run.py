"""The tracking library end to end in one process: files, checks, modes, resume, exit handling."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from slurmgen import tracking
from slurmgen.tracking import (
    ArtifactFileError,
    MetricValueError,
    NoOpRun,
    RunStateError,
    TrackingError,
    UnknownTypeError,
)
from slurmgen.tracking.records import find_runs, read_run

ENV = {"SLURM_JOB_ID": "77", "SLURM_JOB_NAME": "tiny"}


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_a_run_is_a_directory_a_person_can_read(tmp_path):
    config = {"model": {"n_layer": 2, "dropout": 0.0}, "lr": 3e-4, "out": Path("/x"), "sizes": [1, 2], "yes": True}
    run = tracking.init(tmp_path, config=config, description="baseline", tags="tiny,cpu", environ=ENV)
    run.log(type="train", metrics={"loss": 2.5, "lr": 3e-4}, step=10, epoch=0)
    run.log(type="val", metrics={"loss": 2.7}, step=10, epoch=0)
    run.finish()
    assert run.dir == tmp_path / "slurm-77" / "main"
    meta = json.loads((run.dir / "run.json").read_text())
    assert (meta["id"], meta["name"], meta["group"], meta["job_type"], meta["status"]) == (
        "slurm-77/main",
        "tiny",
        "slurm-77",
        "main",
        "finished",
    )
    assert meta["description"] == "baseline" and meta["tags"] == ["tiny", "cpu"] and meta["restart_count"] == 0
    assert meta["slurm"] == {"job_id": "77", "job_name": "tiny"} and meta["world"]["world_size"] == 1
    assert meta["versions"]["python"] and "torch" in meta["versions"] and meta["versions"]["slurmgen"]
    assert meta["start"] <= meta["end"] and meta["summary"] == {
        "train": {"loss": 2.5, "lr": 3e-4},
        "val": {"loss": 2.7},
    }
    assert yaml.safe_load((run.dir / "hparams.yaml").read_text()) == {
        "model.n_layer": 2,
        "model.dropout": 0.0,
        "lr": 3e-4,
        "out": "/x",
        "sizes": [1, 2],
        "yes": True,
    }
    assert [(r["type"], r["step"], r["epoch"], r["metrics"]) for r in lines(run.dir / "metrics.jsonl")] == [
        ("train", 10, 0, {"loss": 2.5, "lr": 3e-4}),
        ("val", 10, 0, {"loss": 2.7}),
    ]


def test_numbers_in_every_form_a_loop_produces_them(tmp_path):
    np = pytest.importorskip("numpy")
    run = tracking.init(tmp_path, environ=ENV)
    run.log("train", {"a": np.float32(0.5), "b": np.int64(3), "c": np.array(1.5), "d": float("nan")}, step=1)
    run.log("train", {"a": 0.25})  # no step: one past the last
    records = list(read_run(run.dir).metrics)
    assert records[0]["metrics"]["a"] == 0.5 and records[0]["metrics"]["b"] == 3 and records[0]["metrics"]["c"] == 1.5
    assert records[1]["step"] == 2


@pytest.mark.parametrize(
    "call, error, message",
    [
        (
            dict(type="trian", metrics={"loss": 1}),
            UnknownTypeError,
            "type: must be one of train, val, test (got 'trian')",
        ),
        (
            dict(type="train", metrics={"loss": "abc"}),
            MetricValueError,
            "metrics['loss']: must be a number (got 'abc')",
        ),
        (dict(type="train", metrics={"loss": None}), MetricValueError, "metrics['loss']: must be a number (got None)"),
        (dict(type="train", metrics={"ok": True}), MetricValueError, "metrics['ok']: must be a number (got True)"),
        (dict(type="train", metrics={}), MetricValueError, "metrics: must not be empty (got {})"),
        (dict(type="train", metrics=[0.5]), MetricValueError, "metrics: must be a dict of name -> number (got [0.5])"),
        (dict(type="train", metrics={"loss": 1}, step=-1), TrackingError, "step: must be a whole number >= 0 (got -1)"),
        (
            dict(type="train", metrics={"loss": 1}, step=1.5),
            TrackingError,
            "step: must be a whole number >= 0 (got 1.5)",
        ),
        (dict(type="train", metrics={"loss": 1}, epoch="one"), MetricValueError, "epoch: must be a number (got 'one')"),
    ],
)
def test_bad_log_calls_fail_on_one_line_naming_field_and_value(tmp_path, call, error, message):
    for run in (tracking.init(tmp_path, environ=ENV), NoOpRun()):  # every rank fails alike
        with pytest.raises(error) as info:
            run.log(**call)
        assert str(info.value) == message and isinstance(info.value, ValueError)
    assert not (tmp_path / "slurm-77" / "main" / "metrics.jsonl").exists()


def test_array_metrics_are_refused_with_their_shape(tmp_path):
    np = pytest.importorskip("numpy")
    with pytest.raises(
        MetricValueError,
        match=r"^metrics\['loss'\]: must be a single number, not an array \(got 'ndarray of shape \(3,\)'\)$",
    ):
        NoOpRun().log("train", {"loss": np.ones(3)})


def test_artifacts_record_hash_and_size(tmp_path):
    run = tracking.init(tmp_path / "runs", environ=ENV)
    data = tmp_path / "train.bin"
    data.write_bytes(os.urandom(3000))
    ckpt = tmp_path / "ckpt.pt"
    ckpt.write_bytes(b"weights" * 1000)
    run.mark_input(tracking.create_artifact("tokens", "dataset").add_file(data))
    run.log("train", {"loss": 1.0}, step=5)
    run.mark_output(run.create_artifact("ckpt-5", "checkpoint", metadata={"step": 5}).add_file(ckpt))
    run.finish()
    records = read_run(run.dir).artifacts
    assert [(r["role"], r["name"], r["type"], r["step"]) for r in records] == [
        ("input", "tokens", "dataset", None),
        ("output", "ckpt-5", "checkpoint", 5),
    ]
    for record, path in zip(records, (data, ckpt)):
        (entry,) = record["files"]
        assert entry["path"] == str(path) and entry["size"] == path.stat().st_size
        assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert read_run(run.dir).meta["artifacts"] == {"inputs": 1, "outputs": 1}


def test_bad_artifact_calls(tmp_path):
    with pytest.raises(ArtifactFileError, match=r"^add_file path: no such file \(got '.*missing.pt'\)$"):
        tracking.create_artifact("x", "checkpoint").add_file(tmp_path / "missing.pt")
    with pytest.raises(ArtifactFileError, match=r"^add_file path: is not a regular file"):
        tracking.create_artifact("x", "checkpoint").add_file(tmp_path)
    with pytest.raises(UnknownTypeError, match=r"^artifact type: must be one of checkpoint, model, dataset"):
        tracking.create_artifact("x", "weights")
    run = tracking.init(tmp_path / "r", environ=ENV)
    with pytest.raises(
        TrackingError, match=r"^artifact: has no files: call add_file\(\) before marking it \(got 'empty'\)$"
    ):
        run.mark_output(run.create_artifact("empty", "model"))
    with pytest.raises(
        TrackingError, match=r"^mark_output: expects an Artifact from create_artifact\(\) \(got 'str'\)$"
    ):
        run.mark_output("ckpt.pt")
    # A no-op run never touches files: on other nodes the checkpoint may not even exist.
    NoOpRun().mark_output(NoOpRun().create_artifact("c", "checkpoint").add_file(tmp_path / "only-on-node-0.pt"))


def test_finish_and_state_errors(tmp_path):
    run = tracking.init(tmp_path, environ=ENV)
    run.finish("preempted", exit_code=75)
    run.finish("failed")  # a second finish changes nothing
    meta = read_run(run.dir).meta
    assert (meta["status"], meta["exit_code"], meta["attempts"][-1]["status"]) == ("preempted", 75, "preempted")
    with pytest.raises(RunStateError, match=r"^log: run 'slurm-77/main' is already preempted$"):
        run.log("train", {"loss": 1.0})
    with pytest.raises(UnknownTypeError, match=r"^status: must be one of finished, failed, preempted \(got 'done'\)$"):
        run.finish("done")


def test_context_manager_maps_exits_to_statuses(tmp_path):
    with tracking.init(tmp_path / "a", environ=ENV) as run:
        pass
    assert run.status == "finished"
    with pytest.raises(RuntimeError), tracking.init(tmp_path / "b", environ=ENV) as run:
        raise RuntimeError("boom")
    assert run.status == "failed"
    with pytest.raises(SystemExit), tracking.init(tmp_path / "c", environ=ENV) as run:
        raise SystemExit(75)
    assert run.status == "preempted"


def test_rank0_mode_records_only_on_rank_0(tmp_path):
    env = {**ENV, "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h0", "MASTER_PORT": "1"}
    for rank in range(4):
        run = tracking.init(tmp_path, environ={**env, "RANK": str(rank), "NODE_RANK": str(rank // 2)}, config={"a": 1})
        assert isinstance(run, NoOpRun) == (rank != 0)
        run.log("train", {"loss": 1.0}, step=1)
        run.finish()
    (only,) = find_runs(tmp_path)
    assert only.meta["world"] == {
        "rank": 0,
        "local_rank": 0,
        "node_rank": 0,
        "world_size": 4,
        "local_world_size": 2,
        "master_addr": "h0",
        "master_port": 1,
        "nodes": 2,
    }


def test_per_process_mode_one_run_per_rank_in_one_group(tmp_path):
    env = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h0", "MASTER_PORT": "1", "SLURMGEN_GROUP": "g1"}
    for rank in range(4):
        run = tracking.init(
            tmp_path,
            mode="per-process",
            environ={**env, "RANK": str(rank), "LOCAL_RANK": str(rank % 2), "NODE_RANK": str(rank // 2)},
        )
        run.log("train", {"loss": float(rank)}, step=1)
        run.finish()
    runs = list(find_runs(tmp_path))
    assert {r.get("group") for r in runs} == {"g1"}
    assert sorted(r.get("job_type") for r in runs) == [
        "node_0_rank_0",
        "node_0_rank_1",
        "node_1_rank_2",
        "node_1_rank_3",
    ]


def test_environment_names_the_run(tmp_path):
    env = {
        "SLURMGEN_GROUP": "ablation",
        "SLURMGEN_JOB_TYPE": "{role}",
        "SLURMGEN_RUN_NAME": "lr-3e-4",
        "SLURMGEN_DESCRIPTION": "lower lr",
        "SLURMGEN_TRACKERS": "none",
    }
    run = tracking.init(tmp_path, mode="per-process", environ=env)
    assert (run.group, run.job_type, run.name, run.meta["description"]) == ("ablation", "main", "lr-3e-4", "lower lr")
    assert run.dir == tmp_path / "ablation" / "main-rank0"
    explicit = tracking.init(tmp_path, mode="per-process", environ=env, group="other", job_type="eval", name="n")
    assert (explicit.group, explicit.job_type, explicit.name) == ("other", "eval", "n")


def test_resume_continues_the_same_run_without_duplicate_steps(tmp_path):
    first = tracking.init(tmp_path, environ=ENV, config={"lr": 1})
    for step in range(1, 8):
        first.log("train", {"loss": 1.0 / step}, step=step)
    first.log("val", {"loss": 0.5}, step=4)
    # killed after step 7; the checkpoint is at step 5: the requeued job resumes there
    again = tracking.init(tmp_path, environ=ENV, resume_step=5)
    assert again.id == first.id and again.restart_count == 1
    again.log("train", {"loss": 9.0}, step=5)  # already recorded by the first attempt: dropped
    for step in range(6, 10):
        again.log("train", {"loss": 0.1}, step=step)
    again.finish()
    record = read_run(again.dir)
    steps = [r["step"] for r in record.metrics if r["type"] == "train"]
    assert steps == list(range(1, 10))
    assert [r["metrics"]["loss"] for r in record.metrics if r["step"] == 5] == [0.2]
    attempts = record.meta["attempts"]
    assert [(a["attempt"], a["status"], a.get("resumed_at_step")) for a in attempts] == [
        (1, "lost", None),
        (2, "finished", 5),
    ]
    assert record.hparams == {"lr": 1}  # kept from the first attempt


def test_a_cut_last_line_is_skipped_and_repaired_on_resume(tmp_path):
    run = tracking.init(tmp_path, environ=ENV)
    run.log("train", {"loss": 1.0}, step=1)
    with open(run.dir / "metrics.jsonl", "a") as f:
        f.write('{"type": "train", "step": 2, "metr')  # a kill -9 mid-write
    assert [r["step"] for r in read_run(run.dir).metrics] == [1]
    again = tracking.init(tmp_path, environ=ENV)
    again.log("train", {"loss": 0.5}, step=2)
    assert [r["step"] for r in read_run(run.dir).metrics] == [1, 2]


PROGRAM = """
import os, signal, sys
from slurmgen import tracking
run = tracking.init(sys.argv[1], environ={"SLURMGEN_GROUP": "g"})
run.log("train", {"loss": 1.0}, step=1)
how = sys.argv[2]
if how == "raise":
    raise RuntimeError("boom")
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("how, status", [("return", "finished"), ("raise", "failed"), ("kill", "running")])
def test_a_process_that_forgets_finish(tmp_path, how, status):
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(tmp_path), how], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == {"return": 0, "raise": 1, "kill": -signal.SIGKILL}[how], done.stderr
    assert read_run(tmp_path / "g" / "main").meta["status"] == status


KILLED_BEFORE_RENAME = """
import os, signal, sys
from slurmgen import tracking
from slurmgen import atomic
run = tracking.init(sys.argv[1], environ={"SLURMGEN_GROUP": "g"}, config={"lr": 1})
run.log("train", {"loss": 1.0}, step=1)
atomic.os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
run.finish()
"""
NOT_A_PID = 4194304  # PID_MAX_LIMIT on Linux: no process ever has it


def test_opening_a_run_removes_temporaries_of_killed_writers_only(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", KILLED_BEFORE_RENAME, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    run_dir = tmp_path / "g" / "main"
    (killed,) = run_dir.glob(".run.json.tmp.*")  # the writer's own leftover, its pid now dead
    hour_ago = time.time() - 3600

    def leftover(name: str, mtime: float = hour_ago) -> Path:
        (run_dir / name).write_text("half")
        os.utime(run_dir / name, (mtime, mtime))
        return run_dir / name

    os.utime(killed, (hour_ago, hour_ago))
    stale = [killed, leftover(f".hparams.yaml.tmp.{NOT_A_PID}"), leftover(f".metrics.jsonl.tmp.{NOT_A_PID}")]
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        kept = [
            leftover(f".run.json.tmp.{live.pid}"),  # its writer is alive (stopped, say): maybe still writing
            leftover(f".run.json.tmp.{NOT_A_PID - 1}", mtime=time.time()),  # fresh: maybe another host's writer
            leftover(f".ckpt-1.pt.tmp.{NOT_A_PID}"),
            leftover(f"notes.tmp.{NOT_A_PID}"),
        ]  # not the store's
        again = tracking.init(tmp_path, environ={"SLURMGEN_GROUP": "g"})
    finally:
        live.kill()
        live.wait()
    assert again.dir == run_dir and again.restart_count == 1
    assert [p.name for p in stale if p.exists()] == []
    assert [p.name for p in kept if not p.exists()] == []


def test_importing_the_library_stays_light():
    probe = (
        "import sys, slurmgen.tracking, slurmgen.tracking.records\n"
        "print([m for m in ('torch', 'numpy', 'yaml', 'matplotlib', 'paramiko', "
        "'slurmgen.generate.spec', 'slurmgen.generate.render', 'slurmgen.cli', 'slurmgen.train') "
        "if m in sys.modules], sys.excepthook is sys.__excepthook__)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[] True", done.stderr


def test_unknown_tracker_and_mode(tmp_path):
    with pytest.raises(
        UnknownTypeError, match=r"^tracker: must be one of tensorboard, wandb, mlflow, swanlab \(got 'neptune'\)$"
    ):
        tracking.init(tmp_path, trackers="tensorboard,neptune", environ={})
    with pytest.raises(TrackingError, match=r"^mode: must be one of rank0, per-process \(got 'all'\)$"):
        tracking.init(tmp_path, mode="all", environ={})
    assert not list(tmp_path.iterdir())  # nothing written before the arguments were checked
