"""`slurmgen.beat` in a tiny program that never imports torch: heartbeats, the timeline and
metrics when a launcher asked for them, nothing at all otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from slurmgen.observe import timeline_writer
from slurmgen.observe.report import analyse
from slurmgen.train.logs import read_heartbeats

PROGRAM = """
import os, sys, time
import slurmgen
assert "slurmgen.observe.helper" not in sys.modules  # `import slurmgen` stays light
slurmgen.beat(phase="imports")
slurmgen.beat(phase="rendezvous")
slow = 0.03 if os.environ["RANK"] == "1" else 0.003
for step in range(1, 61):
    time.sleep(slow)
    slurmgen.beat(step=step, loss=1.0 / step)
    if step == 30:
        slurmgen.beat(phase="checkpoint")
        time.sleep(0.05)
assert "torch" not in sys.modules, "the helper must not import torch"
if os.environ.get("CRASH"):
    raise SystemExit("boom") if os.environ["CRASH"] == "exit" else RuntimeError("boom")
"""


def run(tmp_path, ranks, extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURMGEN_")}
    procs = [
        subprocess.Popen([sys.executable, "-c", PROGRAM], env={**env, "RANK": str(r), **(extra or {})})
        for r in range(ranks)
    ]
    codes = [p.wait(timeout=60) for p in procs]
    assert codes == [1 if (extra or {}).get("CRASH") else 0] * ranks


def test_two_lines_give_a_program_heartbeats_a_timeline_metrics_and_straggler_detection(tmp_path):
    tl = tmp_path / "logs" / "slurmgen-7.timeline.jsonl"
    tl.parent.mkdir()
    run(tmp_path, 3, {"SLURMGEN_HEARTBEAT_DIR": str(tmp_path / "hb"), "SLURMGEN_TIMELINE_FILE": str(tl)})
    beats = read_heartbeats(tmp_path / "hb")
    assert {r: (b["step"], b["status"]) for r, b in beats.items()} == {
        0: (60, "done"),
        1: (60, "done"),
        2: (60, "done"),
    }
    found = analyse(tl.read_text(), [], None, time.time())
    (attempt,) = found["timeline"]["attempts"]
    for r in attempt["ranks"]:
        assert None not in (r["process"], r["imports"], r["rendezvous"], r["first_step"], r["end"]), r
        assert (r["checkpoint_list"][0]["step"], r["status"], r["last_step"]) == (30, "done", 60) and r[
            "checkpoint_stall"
        ] >= 0.05, r
    assert [s["rank"] for s in found["stragglers"]] == [1], found["stragglers"]
    rows = [json.loads(line) for line in (tmp_path / "logs" / "slurmgen-7.metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 61)) and rows[-1]["loss"] == 1 / 60  # rank 0's only


def test_an_uncaught_exception_ends_the_rank_as_failed(tmp_path):
    tl = tmp_path / "t.jsonl"
    run(tmp_path, 1, {"SLURMGEN_TIMELINE_FILE": str(tl), "CRASH": "raise"})
    ends = [json.loads(line) for line in tl.read_text().splitlines() if '"end"' in line]
    assert [(e["event"], e["status"]) for e in ends] == [("end", "failed")]


def test_without_a_launcher_beat_writes_nothing(tmp_path):
    run(tmp_path, 1)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_process_start_is_read_back_through_the_uptime():
    stat = "123 (a prog) with spaces) S " + " ".join(["0"] * 18) + " 500 0"  # field 22 = 500 ticks
    hz = os.sysconf("SC_CLK_TCK")
    assert timeline_writer.process_start_time(stat, "100.25 3.0", now=1000.0) == 1000.0 - (100.25 - 500 / hz)
    assert timeline_writer.process_start_time("garbage", "1 1") is None
    # Attempts count from 1 (contract/attempts.py): Slurm's second requeue is the third attempt.
    assert (
        timeline_writer.attempt_of({"SLURM_RESTART_COUNT": "2"}) == 3
        and timeline_writer.attempt_of({"SLURMGEN_ATTEMPT": "3"}) == 3
    )
    assert timeline_writer.attempt_of({}) == 1
