"""The training loop in one process (no process group): learning, accumulation, dtypes, resume."""

import json
import math
import os
import signal

import pytest
import torch
import torch.nn.functional as F

from slurmgen.train.checkpoint import files as ckpt
from slurmgen.train.config import EXIT_OK, EXIT_PREEMPTED, ConfigError, TrainConfig
from slurmgen.train.data import build_datasets
from slurmgen.train.env import LaunchFlags, detect
from slurmgen.train.logs import read_heartbeats
from slurmgen.train.models import build_model
from slurmgen.train.optim import lr_at
from slurmgen.train.trainer import Trainer

SINGLE = detect({}, LaunchFlags(backend="gloo"), 0)
TINY_GPT = dict(model="gpt", n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32, synthetic_samples=256)


def make(tmp_path, loss_fn=None, **kw):
    base = dict(
        out_dir=str(tmp_path),
        model="mlp",
        mlp_in=8,
        mlp_hidden=16,
        mlp_classes=4,
        synthetic_samples=256,
        max_steps=10,
        log_every=1,
        progress="none",
        warmup_steps=2,
        eval_iters=2,
    )
    cfg = TrainConfig(**{**base, **kw}).validate()
    torch.manual_seed(cfg.seed)
    model = build_model(cfg)
    train, val = build_datasets(cfg)
    return Trainer(model, train, SINGLE, cfg, eval_dataset=val, loss_fn=loss_fn)


def params(trainer):
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def metrics(tmp_path):
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_loss_falls_and_metrics_are_recorded(tmp_path):
    result = make(tmp_path, max_steps=40, lr=3e-3).fit()
    assert result.exit_code == EXIT_OK and result.step == 40
    rows = metrics(tmp_path)
    train = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 41))
    assert train[-1]["loss"] < train[0]["loss"]
    assert set(train[0]) >= {"step", "epoch", "split", "loss", "lr", "tokens_per_sec", "wall_time"}
    assert [r["step"] for r in rows if r["split"] == "val"] == [40]
    assert result.checkpoint.endswith("ckpt-000000040.pt")
    beat = read_heartbeats(tmp_path / "heartbeats")[0]
    assert beat["step"] == 40 and beat["status"] == "done" and beat["pid"] == os.getpid()


def test_grad_accumulation_matches_one_big_batch(tmp_path):
    big = make(tmp_path / "a", batch_size=8, grad_accum=1, max_steps=3, dropout=0.0)
    big.fit()
    small = make(tmp_path / "b", batch_size=4, grad_accum=2, max_steps=3, dropout=0.0)
    small.fit()
    for k, v in params(big).items():
        torch.testing.assert_close(params(small)[k], v, rtol=1e-5, atol=1e-6)


def _preempting_loss(at_call):
    calls = {"n": 0}

    def loss_fn(out, targets):
        calls["n"] += 1
        if calls["n"] == at_call:
            os.kill(os.getpid(), signal.SIGUSR2)  # arrives mid-step; acted on at the step boundary
        return F.cross_entropy(out.reshape(-1, out.size(-1)).float(), targets.reshape(-1))

    return loss_fn


def test_preempt_then_resume_is_bit_identical(tmp_path):
    kw = dict(TINY_GPT, dropout=0.1, max_steps=12, save_every=0, eval_every=4)
    reference = make(tmp_path / "ref", loss_fn=_preempting_loss(10**9), **kw)
    reference.fit()
    first = make(tmp_path / "run", loss_fn=_preempting_loss(5), **kw)
    stopped = first.fit()
    assert stopped.exit_code == EXIT_PREEMPTED and stopped.step == 5
    assert stopped.checkpoint.endswith("ckpt-000000005.pt")
    resumed = make(tmp_path / "run", loss_fn=_preempting_loss(10**9), **kw)
    done = resumed.fit()
    assert done.exit_code == EXIT_OK and done.step == 12
    ref, got = params(reference), params(resumed)
    assert all(torch.equal(ref[k], got[k]) for k in ref), "resumed run differs from the uninterrupted one"
    assert [r["step"] for r in metrics(tmp_path / "run") if r["split"] == "train"] == list(range(1, 13))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_reduced_precision(tmp_path, dtype):
    result = make(tmp_path, dtype=dtype, max_steps=4, **{k: v for k, v in TINY_GPT.items()}).fit()
    assert result.exit_code == EXIT_OK and math.isfinite(result.train_loss) and math.isfinite(result.val_loss)
    state = ckpt.find_latest(tmp_path / "checkpoints")[1]
    assert bool(state["scaler"]) == (dtype == "float16")  # a GradScaler only for float16


def test_epochs_set_the_step_count(tmp_path):
    t = make(tmp_path, max_steps=None, epochs=2, synthetic_samples=64, batch_size=8)
    assert t.fit().step == 2 * 8


def test_resume_into_another_model_is_a_config_error(tmp_path):
    make(tmp_path, max_steps=2).fit()
    with pytest.raises(ConfigError, match="does not fit this model"):
        make(tmp_path, max_steps=4, mlp_hidden=32).fit()


def test_resume_never_and_explicit_path(tmp_path):
    make(tmp_path, max_steps=3, save_every=1, keep_last=5).fit()
    assert make(tmp_path, max_steps=3, resume="never").fit().step == 3
    t = make(tmp_path / "other", max_steps=3, resume=str(tmp_path / "checkpoints" / "ckpt-000000002.pt"))
    t.fit()
    assert [r["step"] for r in metrics(tmp_path / "other")] == [3, 3]  # train and val of step 3 only
    with pytest.raises(ConfigError, match="no such file or directory"):
        make(tmp_path / "x", resume=str(tmp_path / "nothing.pt")).fit()
    with pytest.raises(ConfigError, match="no checkpoint there"):
        make(tmp_path / "y", resume=str(tmp_path / "x")).fit()


def test_schedule():
    assert lr_at(0, 1.0, 0.1, warmup=4, total=10) == 0.25
    assert lr_at(3, 1.0, 0.1, warmup=4, total=10) == 1.0
    assert lr_at(4, 1.0, 0.1, warmup=4, total=10) == 1.0
    assert lr_at(10, 1.0, 0.1, warmup=4, total=10) == pytest.approx(0.1)
    assert lr_at(7, 1.0, 0.1, warmup=4, total=10) == pytest.approx(0.55)


def test_train_ddp_with_a_user_model(tmp_path, monkeypatch):
    for k in list(os.environ):
        if k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") or k.startswith("SLURM_"):
            monkeypatch.delenv(k)
    from slurmgen.train import train_ddp

    g = torch.Generator().manual_seed(0)
    xs = torch.randn(64, 3, generator=g)
    data = [(x, x.sum(dim=0, keepdim=True)) for x in xs]
    model = torch.nn.Linear(3, 1)
    result = train_ddp(
        model=model,
        train_dataset=data,
        eval_dataset=data[:16],
        loss_fn=F.mse_loss,
        config={"out_dir": str(tmp_path), "max_steps": 30, "lr": 0.05, "progress": "none"},
        batch_size=4,
        threads=torch.get_num_threads(),
    )
    assert result.exit_code == 0 and result.step == 30 and result.val_loss < 1.0
    assert (tmp_path / "checkpoints" / "latest").is_file()


def test_token_files_through_the_command_line(tmp_path, monkeypatch, capsys):
    """`--train-data/--val-data` nanoGPT files, end to end in this process (single rank)."""
    import numpy as np

    from slurmgen.train.cli import main

    for k in list(os.environ):
        if k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") or k.startswith("SLURM_"):
            monkeypatch.delenv(k)
    rng = np.random.default_rng(0)
    rng.integers(0, 100, size=5000, dtype=np.uint16).tofile(tmp_path / "train.bin")
    rng.integers(0, 100, size=1000, dtype=np.uint16).tofile(tmp_path / "val.bin")
    out = tmp_path / "run"
    code = main(
        [
            "--train-data",
            str(tmp_path / "train.bin"),
            "--val-data",
            str(tmp_path / "val.bin"),
            "--vocab-size",
            "128",
            "--n-layer",
            "1",
            "--n-embd",
            "16",
            "--block-size",
            "16",
            "--max-steps",
            "4",
            "--eval-every",
            "2",
            "--out-dir",
            str(out),
            "--progress",
            "bar",
            "--threads",
            str(torch.get_num_threads()),
        ]
    )
    assert code == 0
    rows = metrics(out)
    assert [(r["step"], r["split"]) for r in rows if r["split"] == "val"] == [(2, "val"), (4, "val")]
    assert "done: step 4" in capsys.readouterr().err


def test_failure_marks_the_heartbeat(tmp_path):
    def broken(out, targets):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        make(tmp_path, loss_fn=broken).fit()
    beat = read_heartbeats(tmp_path / "heartbeats")[0]
    assert beat["status"] == "failed" and beat["step"] == 0
