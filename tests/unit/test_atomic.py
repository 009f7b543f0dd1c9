"""slurmgen.atomic: a failed write leaves no temporary file; a resume sweeps a killed writer's.

The real fault (a full tmpfs under a 2-rank run) is tests/integration/test_faults_disk.py;
these are the fast checks of the pieces.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from slurmgen import atomic
from slurmgen.contract.files import STACK_NAME

NOT_A_PID = 4194304  # PID_MAX_LIMIT on Linux: no process ever has it


def test_a_failed_write_removes_its_temporary_file_and_keeps_the_old_one(tmp_path: Path):
    target = tmp_path / "run.json"
    target.write_text("old")

    def half_then_enospc(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        atomic.replace(target, half_then_enospc)
    assert sorted(os.listdir(tmp_path)) == ["run.json"] and target.read_text() == "old"


def test_write_text_replaces_the_file(tmp_path: Path):
    atomic.write_text(tmp_path / "a", "one")
    atomic.write_text(tmp_path / "a", "two", fsync=False)
    assert os.listdir(tmp_path) == ["a"] and (tmp_path / "a").read_text() == "two"


def test_write_text_with_a_mode_creates_the_file_private_from_its_first_byte(tmp_path: Path):
    path = tmp_path / "stop"
    atomic.write_text(path, "asked\n", fsync=False, mode=0o600)
    assert path.read_text() == "asked\n" and path.stat().st_mode & 0o777 == 0o600
    atomic.write_text(path, "again\n", fsync=False)  # no mode: the umask's, as before
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stop"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_remove_stale_takes_only_old_files_of_dead_writers_with_the_given_names(tmp_path: Path):
    old = time.time() - 3600

    def leftover(name: str, mtime: float = old) -> Path:
        (tmp_path / name).write_text("")
        os.utime(tmp_path / name, (mtime, mtime))
        return tmp_path / name

    stale = leftover(f".rank-00000.json.tmp.{NOT_A_PID}")
    kept = [
        leftover(f".rank-00000.json.tmp.{os.getpid()}"),  # a live writer
        leftover(f".rank-00000.json.tmp.{NOT_A_PID - 1}", mtime=time.time()),  # fresh
        leftover(f".rank-00001.json.tmp.{NOT_A_PID}"),
    ]  # another name
    assert atomic.remove_stale(tmp_path, ["rank-00000.json"]) == [stale]
    assert all(p.exists() for p in kept)


def test_a_heartbeat_removes_its_killed_predecessors_temporaries(tmp_path: Path):
    from slurmgen.train.logs import Heartbeat

    beat = Heartbeat(tmp_path / "out", rank=0, every=1.0, environ={"SLURMGEN_HEARTBEAT_DIR": str(tmp_path / "hb")})
    beat.dir.mkdir(parents=True)
    left = beat.dir / f".{beat.path.name}.tmp.{NOT_A_PID}"
    left.write_text("")
    os.utime(left, (time.time() - 3600,) * 2)
    beat.beat(0, force=True)
    # the temporary is gone; beside the heartbeat only the rank's stack file (contract/hangs.py)
    assert sorted(os.listdir(beat.dir)) == sorted([beat.path.name, STACK_NAME % 0])
