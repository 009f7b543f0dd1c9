"""Checkpoints in the background (slurmgen/train/ckpt_writer.py) and the start-up meeting."""

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as tdist

from slurmgen.train import checkpoint as ckpt
from slurmgen.train import ckpt_writer, dist
from slurmgen.train.ckpt_writer import CheckpointWriter, snapshot
from slurmgen.train.env import DistEnv


def test_snapshot_is_a_private_copy_that_keeps_tied_tensors_tied_and_reuses_its_buffers():
    w = torch.arange(6.0)
    state = {"model": {"a": w, "tied": w.view(6), "b": torch.ones(2)}, "step": 3, "rng": [torch.zeros(1)]}
    first = snapshot(state)
    w.add_(100)
    assert first["model"]["a"].tolist() == [0.0, 1, 2, 3, 4, 5] and first["step"] == 3
    assert first["model"]["tied"] is first["model"]["a"]
    second = snapshot(state, into=first)
    assert second["model"]["b"] is first["model"]["b"] and second["model"]["a"][0].item() == 100.0


def test_one_write_in_flight_and_the_next_submit_waits_for_it(tmp_path, monkeypatch):
    release, started, real_save = threading.Event(), threading.Event(), ckpt.save

    def slow_save(*args, **kw):
        started.set()
        assert release.wait(10)
        return real_save(*args, **kw)

    monkeypatch.setattr(ckpt_writer.ckpt, "save", slow_save)
    writer = CheckpointWriter(tmp_path, keep_last=5, describe=lambda step, path: f"record of {step}")
    state = {"format": ckpt.FORMAT, "step": 1, "model": {"w": torch.ones(3)}}
    assert writer.submit(1, state) is None and started.wait(10)
    state["model"]["w"].mul_(7)  # the loop goes on changing its state: the copy is what gets written
    assert writer.busy and not writer.finished() and ckpt.list_checkpoints(tmp_path) == []
    threading.Timer(0.2, release.set).start()
    done = writer.submit(2, {**state, "step": 2})  # waits for step 1's write first
    assert (done.step, done.path.name, done.record) == (1, ckpt.checkpoint_name(1), "record of 1")
    assert ckpt.load(done.path)["model"]["w"].tolist() == [1.0, 1.0, 1.0]
    last = writer.wait()
    assert last.step == 2 and not writer.busy and writer.wait() is None
    assert (tmp_path / "latest").read_text().strip() == ckpt.checkpoint_name(2)
    assert ckpt.load(last.path)["model"]["w"].tolist() == [7.0, 7.0, 7.0]


def test_a_failed_background_write_is_raised_by_wait_and_leaves_no_temporary(tmp_path):
    writer = CheckpointWriter(tmp_path, keep_last=2)
    writer.submit(1, {"format": ckpt.FORMAT, "bad": lambda: 0})
    with pytest.raises(Exception):
        writer.wait()
    assert list(tmp_path.iterdir()) == [] and not writer.busy


def test_inline_writer_returns_the_checkpoint_it_wrote(tmp_path):
    done = CheckpointWriter(tmp_path, keep_last=2, background=False).submit(4, {"format": ckpt.FORMAT, "step": 4})
    assert done.step == 4 and ckpt.find_latest(tmp_path)[1]["step"] == 4


def env(rank: int, world: int) -> DistEnv:
    return DistEnv(rank, rank, 0, world, world, "127.0.0.1", 1, "gloo", "cpu", "manual")


def test_meeting_releases_every_rank_when_the_last_arrives():
    store, errors = tdist.HashStore(), []

    def rank(r: int) -> None:
        try:
            dist._meet(store, env(r, 3), timeout=20)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (2, 1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and store.get("slurmgen/all-arrived") == b"1"


def test_meeting_names_how_many_arrived_when_one_is_missing():
    store = tdist.HashStore()
    store.set_timeout(timedelta(seconds=5))
    with pytest.raises(dist.DistSetupError, match="only 1 of WORLD_SIZE=2 ranks arrived"):
        dist._meet(store, env(0, 2), timeout=0.3)
