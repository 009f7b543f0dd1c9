"""A run's checkpoints as one object (slurmgen/train/checkpoint/checkpoints.py), used without the loop:
the seam a sharded strategy replaces must save, keep the last K, find the latest and put
every part of the state back by itself."""

import pytest

torch = pytest.importorskip("torch")

from slurmgen.train.checkpoint import files as ckpt  # noqa: E402
from slurmgen.train.checkpoint.checkpoints import Checkpointing  # noqa: E402
from slurmgen.train.config import TrainConfig  # noqa: E402
from slurmgen.train.data import ShardedBatches, build_datasets  # noqa: E402
from slurmgen.train.env import LaunchFlags, detect  # noqa: E402
from slurmgen.train.logs import Heartbeat  # noqa: E402
from slurmgen.train.models import build_model  # noqa: E402
from slurmgen.train.optim import build_optimizer, build_scheduler  # noqa: E402
from slurmgen.train.track import Tracking  # noqa: E402

SINGLE = detect({}, LaunchFlags(backend="gloo"), 0)


def checkpointing(tmp_path, seed: int, **kw) -> Checkpointing:
    base = dict(
        out_dir=str(tmp_path), model="mlp", mlp_in=8, mlp_hidden=16, mlp_classes=4, synthetic_samples=64, keep_last=2
    )
    cfg = TrainConfig(**{**base, **kw}).validate()
    torch.manual_seed(seed)
    model = build_model(cfg)
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2))
    batches = ShardedBatches(build_datasets(cfg)[0], 1, 0, cfg.batch_size, cfg.grad_accum, cfg.seed)
    return Checkpointing(
        cfg,
        SINGLE,
        Heartbeat(tmp_path, 0, cfg.heartbeat_every, 0, 0),
        batches,
        model,
        optimizer,
        build_scheduler(optimizer, cfg.lr, cfg.effective_min_lr, cfg.warmup_steps, 10),
        torch.amp.GradScaler("cpu", enabled=False),
        tracking=Tracking,
    )


def step(c: Checkpointing) -> None:
    loss = c.model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    c.optimizer.step()
    c.optimizer.zero_grad()
    c.scheduler.step()


@pytest.mark.parametrize("background", [True, False], ids=["async", "inline"])
def test_saves_keeps_the_last_k_and_a_fresh_one_resumes_the_latest_state_and_random_stream(tmp_path, background):
    first = checkpointing(tmp_path, seed=1, checkpoint_async=background)
    for s in range(1, 5):
        step(first)
        first.prepare(s)
        first.save(s)
    first.settle(4)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "checkpoints")] == [3, 4]
    assert first.last == str(tmp_path / "checkpoints" / ckpt.checkpoint_name(4))
    expected, draw = {k: v.clone() for k, v in first.model.state_dict().items()}, torch.rand(3)

    second = checkpointing(tmp_path, seed=2, checkpoint_async=background)
    resumed = second.resume()
    assert (resumed.step, resumed.path, second.last) == (4, first.last, first.last)
    assert all(torch.equal(expected[k], v) for k, v in second.model.state_dict().items())
    assert second.optimizer.state_dict()["state"].keys() == first.optimizer.state_dict()["state"].keys()
    assert second.scheduler.last_epoch == first.scheduler.last_epoch == 4
    assert torch.equal(torch.rand(3), draw), "the random stream did not continue from the checkpoint"


def test_resume_never_starts_afresh_and_a_checkpoint_of_another_model_is_one_line(tmp_path):
    c = checkpointing(tmp_path, seed=1)
    step(c)
    c.save(1)
    c.settle(1)
    assert checkpointing(tmp_path, seed=1, resume="never").resume() is None
    other = checkpointing(tmp_path, seed=1, mlp_hidden=24)
    with pytest.raises(ValueError, match=r"does not fit this model: "):
        other.resume()
