"""The heartbeat writer publishes its learned timeout per phase and answers the stack signal
(observe/heartbeat.py; the rule is contract/hangs.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from slurmgen.contract import envvars, files, hangs
from slurmgen.observe.heartbeat import Heartbeat


def _read(tmp_path, rank=0):
    return json.loads((tmp_path / f"rank-{rank:05d}.json").read_text())


def _writer(tmp_path, **env):
    environ = {envvars.HEARTBEAT_DIR: str(tmp_path), envvars.HANG_FLOOR: "0", **env}
    return Heartbeat(None, 0, 0.0, environ=environ, timeline=False)


def test_start_up_has_no_timeout_then_steps_learn_one(tmp_path, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    hb = _writer(tmp_path)
    real_beat = hb.beat

    def beat(step, status="running", bounded=True):  # 1 s between calls
        now[0] += 1
        real_beat(step, status, bounded=bounded)

    hb.beat = beat
    hb.beat(0)
    hb.beat(1)  # the first step: start-up, not a sample
    assert "timeout" not in _read(tmp_path)
    for step in range(2, 2 + hangs.LEAST_STEPS):
        hb.beat(step)
    assert _read(tmp_path)["timeout"] == 3.0  # 0 s period + 3 x 1 s
    for phase in ("checkpointing", "evaluating"):
        for _ in range(2):
            hb.beat(22, status=phase)
            assert "timeout" not in _read(tmp_path)  # not learned before two of them
            hb.beat(22, status="running")
        hb.beat(22, status=phase)
        assert _read(tmp_path)["timeout"] == 3.0  # 3 x 1 s, each one's length
        hb.beat(22, status="running")
    hb.beat(23, status="checkpointing", bounded=False)  # the wait for a whole write at the end
    assert "timeout" not in _read(tmp_path)


def test_a_checkpoint_is_learned_whole_and_the_wait_for_a_whole_write_is_not_a_sample(tmp_path, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    hb = _writer(tmp_path)
    for t, status, bounded in [
        (0.0, "checkpointing", True),
        (2.0, "checkpointing", True),  # the same stall, beating on: one sample of 4 s
        (4.0, "running", True),
        (5.0, "checkpointing", False),  # a whole write (settle): 100 s, no sample
        (105.0, "running", True),
        (106.0, "checkpointing", True),
        (107.0, "running", True),
    ]:
        now[0] = t
        hb.beat(1, status, force=True, bounded=bounded)
    now[0] = 108.0
    hb.beat(1, "checkpointing", force=True)
    assert _read(tmp_path)["timeout"] == 12.0  # 3 x p99 of (4 s, 1 s): the 100 s wait is not in it


def test_a_slow_first_step_after_a_restart_does_not_count(tmp_path, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    hb = _writer(tmp_path, **{envvars.HANG_FACTOR: "2"})
    for step, t in enumerate([0.0, 100.0] + [100.0 + 0.5 * i for i in range(1, 40)]):
        now[0] = t
        hb.beat(step)
    assert _read(tmp_path)["timeout"] == 1.0  # 2 x 0.5 s: the 100 s warm-up is not in it


def test_learning_off_and_no_launcher_write_no_timeout(tmp_path):
    hb = _writer(tmp_path, **{envvars.HANG_FACTOR: "0"})
    for step in range(40):
        hb.beat(step)
    assert "timeout" not in _read(tmp_path)


PROGRAM = """
import os, sys, time
from slurmgen.observe.heartbeat import Heartbeat
hb = Heartbeat(None, 3, 1.0, environ=os.environ, timeline=False)
hb.beat(0)
print("up", flush=True)
def stuck_here():
    time.sleep(60)
stuck_here()
"""


def test_a_stopped_writer_dumps_its_stack_on_the_signal_once_continued(tmp_path):
    env = {**os.environ, envvars.HEARTBEAT_DIR: str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "up\n"
        assert _read(tmp_path, 3)["stack"] is True
        time.sleep(0.2)
        proc.send_signal(signal.SIGSTOP)
        proc.send_signal(getattr(signal, f"SIG{hangs.STACK_SIGNAL}"))
        proc.send_signal(signal.SIGCONT)
        stack = tmp_path / (files.STACK_NAME % 3)
        deadline = time.monotonic() + 5
        while "stuck_here" not in stack.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 'File "<string>", line 8 in stuck_here' in stack.read_text()
        assert proc.poll() is None  # the signal did not kill it
    finally:
        proc.kill()
        proc.wait()
