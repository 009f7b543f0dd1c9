"""The bundled trainer's run record, in one process: config as hyperparameters, the trainer's
own metrics, checkpoints as outputs with their hashes, statuses from exit codes, resume."""

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from slurmgen.tracking.records import find_runs  # noqa: E402
from slurmgen.train.config import EXIT_OK, EXIT_PREEMPTED, ConfigError, TrainConfig  # noqa: E402
from slurmgen.train.data import build_datasets  # noqa: E402
from slurmgen.train.env import LaunchFlags, detect  # noqa: E402
from slurmgen.train.models import build_model  # noqa: E402
from slurmgen.train.trainer import Trainer  # noqa: E402

SINGLE = detect({}, LaunchFlags(backend="gloo"), 0)


def make(tmp_path, **kw):
    base = dict(
        out_dir=str(tmp_path / "out"),
        model="mlp",
        mlp_in=8,
        mlp_hidden=16,
        mlp_classes=4,
        synthetic_samples=256,
        max_steps=8,
        log_every=2,
        eval_every=4,
        save_every=4,
        progress="none",
        warmup_steps=2,
        eval_iters=2,
    )
    cfg = TrainConfig(**{**base, **kw}).validate()
    torch.manual_seed(cfg.seed)
    train, val = build_datasets(cfg)
    return Trainer(build_model(cfg), train, SINGLE, cfg, eval_dataset=val)


def the_run(tmp_path):
    (run,) = find_runs(tmp_path / "out" / "tracking")
    return run


def test_a_finished_run_records_config_metrics_and_checkpoints(tmp_path):
    result = make(tmp_path).fit()
    assert result.exit_code == EXIT_OK
    run = the_run(tmp_path)
    assert result.run_dir == str(run.dir)
    assert (run.get("status"), run.get("name"), run.get("job_type"), run.get("restart_count")) == (
        "finished",
        "out",
        "main",
        0,
    )
    assert run.hparams["lr"] == 1e-3 and run.hparams["max_steps"] == 8 and run.hparams["track"] == "rank0"
    trainer_rows = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["type"], r["step"], r["metrics"]["loss"]) for r in run.metrics] == [
        (r["split"], r["step"], r["loss"]) for r in trainer_rows
    ]
    assert set(run.metrics[0]["metrics"]) == {"loss", "lr", "tokens_per_sec"}
    outputs = run.artifacts
    # An asynchronous checkpoint is recorded once durable, a step or two later: its own step is in metadata.
    assert [(a["name"], a["type"], a["metadata"]["step"]) for a in outputs] == [
        ("ckpt-000000004", "checkpoint", 4),
        ("ckpt-000000008", "checkpoint", 8),
        ("model", "model", 8),
    ]
    for artifact in outputs:
        (entry,) = artifact["files"]
        assert entry["sha256"] == hashlib.sha256(Path(entry["path"]).read_bytes()).hexdigest()


def test_preempted_then_resumed_continues_the_same_run(tmp_path):
    trainer = make(tmp_path, max_steps=12)
    original = trainer.train_step

    def step_then_signal(ddp):
        out = original(ddp)
        if trainer.step == 6:
            os.kill(os.getpid(), signal.SIGUSR2)
        return out

    trainer.train_step = step_then_signal
    assert trainer.fit().exit_code == EXIT_PREEMPTED
    first = the_run(tmp_path)
    assert first.get("status") == "preempted" and first.get("exit_code") == EXIT_PREEMPTED
    assert make(tmp_path, max_steps=12).fit().exit_code == EXIT_OK
    run = the_run(tmp_path)
    assert run.get("id") == first.get("id") and run.get("restart_count") == 1 and run.get("status") == "finished"
    steps = [r["step"] for r in run.metrics if r["type"] == "train"]
    assert steps == [2, 4, 6, 8, 10, 12]  # continuous, nothing twice
    assert [(a["status"], a.get("resumed_at_step")) for a in run.get("attempts")] == [("preempted", 0), ("finished", 6)]


def test_track_off_writes_no_record_and_per_process_one_per_rank(tmp_path):
    assert make(tmp_path, track="off").fit().run_dir is None
    assert not (tmp_path / "out" / "tracking").exists()
    make(tmp_path / "pp", track="per-process").fit()
    (run,) = find_runs(tmp_path / "pp" / "out" / "tracking")
    assert run.get("job_type") == "node_0_rank_0" and run.get("mode") == "per-process"


def test_tracker_in_config_and_on_the_command_line():
    with pytest.raises(ConfigError, match=r"--track must be one of rank0, per-process, off \(got 'all'\)"):
        TrainConfig(track="all").validate()
    with pytest.raises(
        ConfigError, match=r"--tracker: must be one of tensorboard, wandb, mlflow, swanlab \(got 'neptune'\)"
    ):
        TrainConfig(tracker="neptune").validate()
    cases = [
        (
            ["--tracker", "neptune"],
            "argument --tracker: must be one of tensorboard, wandb, mlflow, swanlab (got 'neptune')",
        ),
        (["--track", "off", "--tracker", "wandb"], "argument --tracker: 'wandb' needs a run record: drop --track off"),
    ]
    for args, line in cases:
        done = subprocess.run(
            [sys.executable, "-m", "slurmgen.train", *args], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2 and done.stderr == f"slurmgen train: error: {line}\n"


def test_a_tracker_that_is_not_installed_fails_before_torch_is_imported(tmp_path):
    probe = (
        "import sys; sys.modules['wandb'] = None\n"
        "from slurmgen.train.cli import main\n"
        "code = main(['--tracker', 'wandb', '--out-dir', sys.argv[1]])\n"
        "print(code, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "2 False"
    assert (
        done.stderr
        == "slurmgen train: error: argument --tracker: wandb is not installed: pip install 'slurmgen[wandb]'\n"
    )


def test_a_bad_run_name_template_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURMGEN_JOB_TYPE", "{gpu}")
    with pytest.raises(ConfigError, match=r"^run record: job_type: unknown placeholder 'gpu'"):
        make(tmp_path, track="per-process").fit()
