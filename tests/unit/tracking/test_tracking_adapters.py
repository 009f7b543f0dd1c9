"""Every tracker adapter that can run offline, fed by the same calls and read back with the
tracker's own reader (or its documented file format). Nothing here may reach a server: W&B and
SwanLab run in offline mode, MLflow in a file store, telemetry off; the tests check the modes."""

import hashlib
import importlib.util
import json
import struct
import sys
from pathlib import Path

import pytest

from slurmgen import tracking
from slurmgen.tracking import TrackerUnavailableError
from slurmgen.tracking.adapters import REGISTRY, Adapter
from slurmgen.tracking.records import read_run


def need(module: str, extra: str):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed: pip install 'slurmgen[{extra}]' (the test extra has it)")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    for key in ("WANDB_MODE", "SWANLAB_MODE", "MLFLOW_TRACKING_URI", "WANDB_PROJECT"):
        monkeypatch.delenv(key, raising=False)  # the adapters' own defaults are what is tested
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    monkeypatch.setenv("WANDB_SILENT", "true")


def two_attempts(root, tracker, tmp_path):
    """A run that logs, records artifacts, is preempted at step 6 with its checkpoint at 4, and
    resumes; returns the second attempt's Run and the checkpoint file."""
    ckpt = tmp_path / "ckpt-4.pt"
    ckpt.write_bytes(b"weights" * 100)
    env = {"SLURMGEN_GROUP": "g"}
    run = tracking.init(root, trackers=tracker, environ=env, config={"model": {"n_layer": 2}, "lr": 0.1})
    for step in range(1, 7):
        run.log("train", {"loss": 1.0 / step}, step=step, epoch=0)
        if step == 4:
            run.log("val", {"loss": 0.75}, step=4)
    run.mark_output(run.create_artifact("ckpt-4", "checkpoint").add_file(ckpt))
    run.finish("preempted", 75)
    again = tracking.init(root, trackers=tracker, environ=env, resume_step=4)
    for step in range(5, 9):
        again.log("train", {"loss": 0.1 * step}, step=step, epoch=1)
    again.finish()
    return again, ckpt


def test_tensorboard_event_files_read_back(tmp_path):
    need("tensorboard", "tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, _ = two_attempts(tmp_path, "tensorboard", tmp_path)
    acc = EventAccumulator(str(run.dir / "tensorboard"))
    acc.Reload()
    assert {"train/loss", "val/loss", "train/epoch"} <= set(acc.Tags()["scalars"])
    # The second attempt's event file joins the first: steps 5 and 6 were logged twice, and
    # TensorBoard keeps the newest (purging the orphaned ones, as it does for any restart).
    steps = [e.step for e in acc.Scalars("train/loss")]
    assert steps[:4] == [1, 2, 3, 4] and steps[-4:] == [5, 6, 7, 8]
    assert [e.value for e in acc.Scalars("val/loss")] == [0.75]
    assert "n_layer" in acc.Tensors("run/hparams")[0].tensor_proto.string_val[0].decode()


def wandb_records(path):
    """The records of a .wandb file (LevelDB log format: a 7-byte header, 32 KiB blocks, each
    record a 7-byte header and a protobuf `Record`), so the test needs no W&B server or sync."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, buf, block = path.read_bytes(), 7, b"", 32768
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (length == 0 and kind == 0):
            pos += left
            continue
        buf, pos = buf + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a full record or the last piece of one
            record = pb.Record()
            record.ParseFromString(buf)
            buf = b""
            yield record


def test_wandb_offline_run_read_back(tmp_path):
    need("wandb", "wandb")
    run, ckpt = two_attempts(tmp_path, "wandb", tmp_path)
    state = run.meta["adapters"]["wandb"]
    assert state["mode"] == "offline" and state["id"] == "g--main"
    files = sorted((run.dir / "wandb").glob("offline-run-*/run-g--main.wandb"))
    assert len(files) == 2  # one per attempt, same W&B run id: `wandb sync` joins them
    history, artifacts, runs = [], [], []
    for path in files:
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
            elif kind == "artifact":
                artifacts.append(record.artifact)
            elif kind == "run":
                runs.append((record.run.run_id, record.run.run_group, record.run.job_type))
    assert runs == [("g--main", "g", "main")] * 2
    last = {h["_step"]: h["train/loss"] for h in history[-4:]}
    assert last == pytest.approx({5: 0.5, 6: 0.6, 7: 0.7, 8: 0.8})
    assert [h.get("val/loss") for h in history if h["_step"] == 4] == [0.75]
    (artifact,) = artifacts
    assert artifact.name == "ckpt-4" and artifact.type == "checkpoint"
    assert hashlib.sha256(ckpt.read_bytes()).hexdigest() in artifact.metadata


def test_mlflow_file_store_read_back(tmp_path):
    need("mlflow", "mlflow")
    run, ckpt = two_attempts(tmp_path, "mlflow", tmp_path)
    from mlflow.tracking import MlflowClient

    state = run.meta["adapters"]["mlflow"]
    assert state["tracking_uri"] == f"file:{tmp_path / 'mlruns'}"
    client = MlflowClient(tracking_uri=state["tracking_uri"])
    found = client.get_run(state["run_id"])
    assert found.info.status == "FINISHED" and found.info.run_name == run.name
    assert found.data.params == {"model.n_layer": "2", "lr": "0.1"}
    assert found.data.tags["slurmgen.group"] == "g" and found.data.tags["slurmgen.restart_count"] == "1"
    history = client.get_metric_history(state["run_id"], "train/loss")
    by_step = {m.step: m.value for m in history}
    assert sorted(by_step) == list(range(1, 9)) and by_step[8] == pytest.approx(0.8)
    local = client.download_artifacts(state["run_id"], "slurmgen/outputs/ckpt-4.json", str(tmp_path / "dl"))
    record = json.loads(Path(local).read_text())
    assert record["files"][0]["sha256"] == hashlib.sha256(ckpt.read_bytes()).hexdigest()


def test_swanlab_offline_run_read_back(tmp_path):
    need("swanlab", "swanlab")
    run, ckpt = two_attempts(tmp_path, "swanlab", tmp_path)
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    assert run.meta["adapters"]["swanlab"]["mode"] == "offline"
    scalars, starts = [], []
    for path in sorted((run.dir / "swanlog").glob("run-*/run-*.swanlab")):
        reader = DataStoreReader()
        reader.open(str(path))
        for data in reader:
            record = Record()
            record.ParseFromString(data)
            if record.HasField("scalar"):
                scalars.append((record.scalar.key, record.scalar.step, record.scalar.value.number))
            if record.HasField("start"):
                starts.append((record.start.group, record.start.job_type))
        reader.close()
    assert starts == [("g", "main")] * 2
    assert [s for k, s, _ in scalars if k == "train/loss"] == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8]
    assert ("val/loss", 4, 0.75) in scalars
    configs = " ".join(p.read_text() for p in (run.dir / "swanlog").glob("run-*/files/config.yaml"))
    assert hashlib.sha256(ckpt.read_bytes()).hexdigest() in configs  # the first attempt's artifact


def test_missing_tracker_package_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "swanlab", None)  # as if the extra were not installed
    with pytest.raises(TrackerUnavailableError) as info:
        tracking.init(tmp_path, trackers="swanlab", environ={"SLURMGEN_GROUP": "g"})
    message = str(info.value)
    assert message.startswith("tracker: needs the swanlab package") and "pip install 'slurmgen[swanlab]'" in message
    assert "\n" not in message and not (tmp_path / "g" / "main" / "run.json").exists()


class Broken(Adapter):
    name = "broken"

    def log(self, *args):
        raise OSError("disk full")


def test_an_adapter_that_fails_later_is_switched_off_and_training_goes_on(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(REGISTRY, "broken", (__name__, "Broken", "none"))
    monkeypatch.setattr("slurmgen.tracking.start.create_adapter", lambda name, d, r: Broken(d, r))
    run = tracking.init(tmp_path, trackers="broken", environ={"SLURMGEN_GROUP": "g"})
    run.log("train", {"loss": 1.0}, step=1)
    run.log("train", {"loss": 0.5}, step=2)
    run.finish()
    assert [r["step"] for r in read_run(run.dir).metrics] == [1, 2]
    warnings = [r.getMessage() for r in caplog.records if "broken adapter failed" in r.getMessage()]
    assert len(warnings) == 1 and "OSError: disk full" in warnings[0]
