"""Checkpoints in the background (slurmgen/train/checkpoint/writer.py) and the start-up meeting."""

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as tdist

from slurmgen.train import dist
from slurmgen.train.checkpoint import files as ckpt
from slurmgen.train.checkpoint import writer as ckpt_writer
from slurmgen.train.checkpoint.writer import CheckpointWriter, one_intra_op_thread, snapshot
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


class CopyWatched(torch.Tensor):
    """A tensor that notes torch's intra-op thread count whenever it is copied from."""

    counts: list[int] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.copy_:
            cls.counts.append(torch.get_num_threads())
        return super().__torch_function__(func, types, args, kwargs or {})


def test_snapshot_copies_on_one_intra_op_thread_and_gives_the_count_back_also_after_an_error():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        state = {
            "model": {"a": torch.arange(4.0).as_subclass(CopyWatched), "b": torch.ones(2).as_subclass(CopyWatched)}
        }
        first = snapshot(state)
        snapshot(state, into=first)
        assert CopyWatched.counts == [1] * 4 and torch.get_num_threads() == 3
        assert first["model"]["a"].tolist() == [0.0, 1, 2, 3]
        with pytest.raises(RuntimeError, match="copy failed"), one_intra_op_thread():
            assert torch.get_num_threads() == 1
            raise RuntimeError("copy failed")
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


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


def test_every_job_runs_in_one_thread_started_once_which_ends_with_its_writer(tmp_path):
    def threads_named():
        return [t for t in threading.enumerate() if t.name.startswith("slurmgen-checkpoint")]

    before = threads_named()
    writer = CheckpointWriter(tmp_path, keep_last=2, describe=lambda step, path: threading.current_thread())
    state = {"format": ckpt.FORMAT, "step": 1, "model": {"w": torch.ones(3)}}
    writer.prepare(state)
    written = {writer.submit(step, {**state, "step": step}) for step in (1, 2, 3)} | {writer.wait()}
    ran_in = {w.record for w in written if w is not None}
    assert len(ran_in) == 1 and threading.current_thread() not in ran_in
    (thread,) = ran_in
    assert thread.is_alive() and [t for t in threads_named() if t not in before] == [thread]
    del writer, written
    thread.join(10)
    assert not thread.is_alive()


def test_a_failed_background_write_is_raised_by_wait_and_leaves_no_temporary(tmp_path):
    writer = CheckpointWriter(tmp_path, keep_last=2)
    writer.submit(1, {"format": ckpt.FORMAT, "bad": lambda: 0})
    with pytest.raises(Exception):  # noqa: B017  (pickling a lambda: the error's type varies across Python versions)
        writer.wait()
    assert list(tmp_path.iterdir()) == [] and not writer.busy


def test_inline_writer_returns_the_checkpoint_it_wrote(tmp_path):
    done = CheckpointWriter(tmp_path, keep_last=2, background=False).submit(4, {"format": ckpt.FORMAT, "step": 4})
    assert done.step == 4 and ckpt.find_latest(tmp_path)[1]["step"] == 4


def tensors(tree):
    """The tensors of a state, in order."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        tree = list(tree.values())
    return [t for v in tree for t in tensors(v)] if isinstance(tree, (list, tuple)) else []


def same_objects(a, b):
    return len(a) == len(b) > 0 and all(x is y for x, y in zip(a, b))


def test_prepared_buffers_are_ready_before_the_first_submit_which_only_fills_them(tmp_path):
    w = torch.arange(4.0)
    state = {
        "format": ckpt.FORMAT,
        "step": 1,
        "model": {"w": w, "tied": w, "b": torch.ones(2, 3)},
        "optimizer": {"state": {0: {"exp_avg": torch.zeros(4), "step": torch.tensor(1.0)}}},
    }
    writer = CheckpointWriter(tmp_path, keep_last=2)
    assert writer.needs_buffers
    writer.prepare(state)
    assert writer.busy and not writer.needs_buffers
    w.add_(10)  # training goes on while the buffers are prepared
    assert writer.wait() is None and not writer.busy  # a preparation writes no checkpoint
    prepared = writer._buffers
    assert all(t.abs().sum() == 0 for t in tensors(prepared)) and prepared["model"]["tied"] is prepared["model"]["w"]
    writer.prepare(state)  # buffers exist: nothing to do
    assert not writer.busy
    writer.submit(1, state)
    assert same_objects(tensors(writer._buffers), tensors(prepared))
    saved = ckpt.load(writer.wait().path)
    assert saved["model"]["w"].tolist() == [10.0, 11, 12, 13] and saved["model"]["b"].tolist() == [[1.0] * 3] * 2
    assert saved["optimizer"]["state"][0]["step"].item() == 1.0


def test_a_state_that_changed_shape_dtype_or_tying_since_preparing_is_still_written_exactly(tmp_path):
    a = torch.arange(6.0)
    writer = CheckpointWriter(tmp_path, keep_last=2)
    writer.prepare({"format": ckpt.FORMAT, "model": {"a": a, "b": a, "c": torch.ones(3), "d": torch.ones(2)}})
    writer.wait()
    state = {
        "format": ckpt.FORMAT,
        "model": {
            "a": a,
            "b": a.clone().mul_(-1),  # no longer tied
            "c": torch.arange(5.0),  # another shape
            "d": torch.tensor([7, 8]),  # another dtype
            "e": torch.full((2,), 3.0),
        },
    }  # new
    writer.submit(1, state)
    saved = ckpt.load(writer.wait().path)["model"]
    for name, value in state["model"].items():
        assert saved[name].dtype == value.dtype and torch.equal(saved[name], value), name
    assert saved["b"].untyped_storage().data_ptr() != saved["a"].untyped_storage().data_ptr()


def test_a_failed_preparation_is_raised_to_the_next_checkpoint_and_writes_nothing(tmp_path, monkeypatch):
    def no_memory(state):
        raise MemoryError("cannot allocate the copy")

    monkeypatch.setattr(ckpt_writer, "buffers_for", no_memory)
    writer = CheckpointWriter(tmp_path / "ckpt", keep_last=2)
    writer.prepare({"format": ckpt.FORMAT, "model": {"w": torch.ones(2)}})
    with pytest.raises(MemoryError, match="cannot allocate"):
        writer.submit(1, {"format": ckpt.FORMAT, "step": 1, "model": {"w": torch.ones(2)}})
    assert not writer.busy and not (tmp_path / "ckpt").exists()


def test_an_inline_writer_prepares_nothing(tmp_path):
    writer = CheckpointWriter(tmp_path, keep_last=2, background=False)
    writer.prepare({"model": {"w": torch.ones(2)}})
    assert not writer.needs_buffers and not writer.busy


def test_the_trainer_prepares_the_buffers_once_adam_has_state_and_its_first_checkpoint_fills_them(
    tmp_path, monkeypatch
):
    from slurmgen.train.config import TrainConfig
    from slurmgen.train.data import build_datasets
    from slurmgen.train.env import LaunchFlags, detect
    from slurmgen.train.models import build_model
    from slurmgen.train.trainer import Trainer

    cfg = TrainConfig(
        out_dir=str(tmp_path),
        model="mlp",
        mlp_in=8,
        mlp_hidden=16,
        mlp_classes=4,
        synthetic_samples=64,
        max_steps=6,
        save_every=4,
        log_every=1,
        progress="none",
        eval_every=0,
    ).validate()
    trainer = Trainer(build_model(cfg), build_datasets(cfg)[0], detect({}, LaunchFlags(backend="gloo"), 0), cfg)
    prepared, snapshots, real_buffers_for, real_snapshot = [], [], ckpt_writer.buffers_for, ckpt_writer.snapshot

    def buffers_for(state):
        prepared.append((trainer.step, len(state["optimizer"]["state"]), real_buffers_for(state)))
        return prepared[-1][2]

    def snapshot(state, into=None):
        snapshots.append(real_snapshot(state, into))
        return snapshots[-1]

    monkeypatch.setattr(ckpt_writer, "buffers_for", buffers_for)
    monkeypatch.setattr(ckpt_writer, "snapshot", snapshot)
    trainer.fit()
    assert [(step, n) for step, n, _ in prepared] == [(1, len(list(trainer.model.parameters())))]
    first, buffers = snapshots[0], prepared[0][2]
    for part in ("model", "optimizer"):
        assert same_objects(tensors(first[part]), tensors(buffers[part])), part
    assert len(snapshots) == 2 and same_objects(tensors(snapshots[1]["model"]), tensors(first["model"]))
    assert ckpt.load(tmp_path / "checkpoints" / ckpt.checkpoint_name(6))["step"] == 6


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
