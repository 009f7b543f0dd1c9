"""The checkpoint protocol in one process: atomic files, `latest`, pruning, fallbacks, RNG states."""

import os
import random

import numpy as np
import pytest
import torch

from slurmgen.train.checkpoint import files as ckpt


def state(step, value=0.0):
    return {"format": ckpt.FORMAT, "step": step, "model": {"w": torch.full((3,), value)}, "rng": [ckpt.capture_rng()]}


def test_save_writes_file_pointer_and_nothing_else(tmp_path):
    path = ckpt.save(tmp_path, 7, state(7, 1.5), keep_last=2)
    assert path.name == "ckpt-000000007.pt"
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000000007.pt", "latest"]
    assert (tmp_path / "latest").read_text().strip() == path.name
    found_path, loaded = ckpt.find_latest(tmp_path)
    assert found_path == path and loaded["step"] == 7 and torch.equal(loaded["model"]["w"], torch.full((3,), 1.5))


def test_keep_last_prunes_the_oldest(tmp_path):
    for s in range(1, 6):
        ckpt.save(tmp_path, s, state(s), keep_last=2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [4, 5]
    assert ckpt.find_latest(tmp_path)[1]["step"] == 5


def test_dangling_or_missing_pointer_falls_back_to_newest(tmp_path):
    for s in (1, 2):
        ckpt.save(tmp_path, s, state(s), keep_last=5)
    (tmp_path / "latest").write_text("ckpt-000000099.pt\n")
    assert ckpt.find_latest(tmp_path)[1]["step"] == 2
    (tmp_path / "latest").unlink()
    assert ckpt.find_latest(tmp_path)[1]["step"] == 2


def test_pointer_wins_over_a_newer_file(tmp_path):
    """A file renamed into place but not yet pointed at (kill between steps 2 and 3) is complete
    too, but `latest` is the contract: resume from what it names."""
    ckpt.save(tmp_path, 1, state(1), keep_last=5)
    ckpt.save(tmp_path, 2, state(2), keep_last=5)
    (tmp_path / "latest").write_text("ckpt-000000001.pt\n")
    assert ckpt.find_latest(tmp_path)[1]["step"] == 1


def test_unreadable_checkpoint_is_skipped_for_an_older_one(tmp_path, caplog):
    ckpt.save(tmp_path, 1, state(1), keep_last=5)
    ckpt.save(tmp_path, 2, state(2), keep_last=5)
    (tmp_path / "ckpt-000000002.pt").write_bytes(b"garbage")
    assert ckpt.find_latest(tmp_path)[1]["step"] == 1
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(
        f"resuming from {tmp_path}/ckpt-000000001.pt, the newest good checkpoint: "
        f"skipped {tmp_path}/ckpt-000000002.pt is damaged or not a checkpoint ("
    )
    assert "\n" not in line


def test_a_damaged_pointer_falls_back_to_the_newest(tmp_path, caplog):
    ckpt.save(tmp_path, 1, state(1), keep_last=5)
    ckpt.save(tmp_path, 2, state(2), keep_last=5)
    (tmp_path / "latest").write_bytes(b"\xff\xfe\x00")
    assert ckpt.find_latest(tmp_path)[1]["step"] == 2
    assert [r.getMessage() for r in caplog.records] == [f"{tmp_path}/latest is damaged; scanning for checkpoints"]


class Foreign:  # not a tensor or plain value: weights_only loading refuses it
    pass


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p.write_bytes(b"garbage"), "is damaged or not a checkpoint ("),
        (lambda p: p.write_bytes(b""), "is damaged or not a checkpoint ("),
        (
            lambda p: torch.save({"format": ckpt.FORMAT, "x": Foreign()}, p),
            "is not a slurmgen.train checkpoint: it holds objects other than tensors and plain values",
        ),
    ],
)
def test_a_damaged_checkpoint_is_one_line_naming_it(tmp_path, make, words):
    path = tmp_path / "ckpt-000000001.pt"
    make(path)
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.load(path)
    message = str(err.value)
    assert message.startswith(f"{path} {words}") and "\n" not in message
    assert "weights_only" not in message  # torch's advice to load unsafely is not passed on


def test_nothing_to_resume(tmp_path):
    assert ckpt.find_latest(tmp_path / "missing") is None
    assert ckpt.find_latest(tmp_path) is None


def test_stale_temporaries_are_removed(tmp_path):
    ckpt.save(tmp_path, 1, state(1), keep_last=5)
    (tmp_path / ".ckpt-000000002.pt.tmp.123").write_bytes(b"half")
    (tmp_path / ".latest.tmp.123").write_bytes(b"x")
    assert ckpt.remove_stale_temporaries(tmp_path) == 2
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000000001.pt", "latest"]


def test_failed_write_leaves_no_temporary(tmp_path):
    with pytest.raises(Exception):  # noqa: B017  (pickling a lambda: the error's type varies across Python versions)
        ckpt.save(tmp_path, 1, {"format": ckpt.FORMAT, "bad": lambda: 0}, keep_last=2)
    assert os.listdir(tmp_path) == []


def test_files_load_with_weights_only_and_reject_foreign_ones(tmp_path):
    torch.save({"something": 1}, tmp_path / "ckpt-000000001.pt")
    with pytest.raises(ValueError, match="not a slurmgen.train checkpoint"):
        ckpt.load(tmp_path / "ckpt-000000001.pt")


def test_rng_round_trip():
    saved = ckpt.capture_rng()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    ckpt.restore_rng(saved)
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], got[0]) and np.array_equal(expected[1], got[1]) and expected[2] == got[2]


def test_rng_state_survives_a_weights_only_file(tmp_path):
    saved = ckpt.capture_rng()
    ckpt.save(tmp_path, 1, {"format": ckpt.FORMAT, "rng": [saved]}, keep_last=1)
    expected = torch.rand(2), np.random.rand(2), random.random()
    ckpt.restore_rng(ckpt.find_latest(tmp_path)[1]["rng"][0])
    assert torch.equal(torch.rand(2), expected[0]) and np.array_equal(np.random.rand(2), expected[1])
    assert random.random() == expected[2]


def test_resume_path_damaged_is_exit_1_and_missing_is_exit_2(tmp_path, capfd):
    from slurmgen.train.cli import main

    bad = tmp_path / "ckpt-000000001.pt"
    bad.write_bytes(b"garbage")
    args = ["--model", "mlp", "--max-steps", "1", "--out-dir", str(tmp_path / "run")]
    assert main([*args, "--resume", str(bad)]) == 1
    err = capfd.readouterr().err
    assert f"error: {bad} is damaged or not a checkpoint (" in err
    assert "Traceback" not in err and "weights_only" not in err
    assert main([*args, "--resume", str(tmp_path / "missing.pt")]) == 2
    assert f"error: --resume {tmp_path / 'missing.pt'}: no such file or directory" in capfd.readouterr().err


def test_the_size_estimate_covers_the_file_and_counts_tied_tensors_once(tmp_path):
    w = torch.zeros(1000, 100)
    big = {"format": ckpt.FORMAT, "step": 1, "model": {"w": w, "tied": w, "b": torch.zeros(10)}}
    path = ckpt.save(tmp_path, 1, big, keep_last=1)
    estimate, size = ckpt.estimated_size(big), path.stat().st_size
    assert size <= estimate < size + 200_000, (estimate, size)


def test_enospc_is_found_where_torch_hides_it():
    """torch.save on a full disk raises `basic_ios::clear: iostream error`; the OSError comes
    second, in the chain."""
    try:
        try:
            raise RuntimeError("basic_ios::clear: iostream error")
        except RuntimeError:
            raise OSError(28, "No space left on device")  # noqa: B904  (the implicit chain is what torch makes)
    except OSError as exc:
        chained = RuntimeError("unexpected pos")
        chained.__context__ = exc
    assert ckpt._no_space(chained) and not ckpt._no_space(RuntimeError("other"))
