"""The heartbeat file contract that launchers and watchers rely on (slurmgen/train/logs.py)."""

import json

from slurmgen import exitcodes
from slurmgen.train.logs import HEARTBEAT_DIR_ENV, Heartbeat


def test_heartbeat_goes_to_the_launchers_directory_when_it_names_one(tmp_path, monkeypatch):
    node_local = tmp_path / "node-local"
    monkeypatch.setenv(HEARTBEAT_DIR_ENV, str(node_local))
    Heartbeat(tmp_path / "out", rank=3, every=1.0).beat(step=7)
    record = json.loads((node_local / "rank-00003.json").read_text())
    assert (record["rank"], record["step"], record["status"]) == (3, 7, "running")
    assert not (tmp_path / "out").exists()


def test_heartbeat_defaults_to_the_run_directory(tmp_path, monkeypatch):
    monkeypatch.delenv(HEARTBEAT_DIR_ENV, raising=False)
    Heartbeat(tmp_path / "out", rank=0, every=1.0).beat(step=1)
    assert (tmp_path / "out" / "heartbeats" / "rank-00000.json").is_file()


def test_exit_codes_are_described_in_words():
    assert exitcodes.describe(exitcodes.PREEMPTED) == "preempted"
    assert exitcodes.describe(137) == "killed by signal 9"
    assert exitcodes.describe(-15) == "killed by signal 15"
    assert exitcodes.describe(3) == "exit 3"
