"""`slurmgen.integrations`' framework-neutral reporter in real processes (no framework): what each
rank writes, and that naming the package costs nothing. The callbacks themselves train under a
real launcher in tests/integration/test_frameworks.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from slurmgen.tracking.records import find_runs
from slurmgen.train.logs import read_heartbeats

PROGRAM = """
import sys
from slurmgen.integrations.report import Reporter
assert not {"torch", "pytorch_lightning", "transformers"} & set(sys.modules), "the reporter imports no framework"
report = Reporter()
report.start(0, {"lr": 0.1})
for step in range(1, 6):
    report.step(step)
    report.logged(step, 0.0, {"loss": 1.0 / step, "lr": 0.1, "skipped": None})
report.phase("checkpoint")
report.logged(5, 0.0, {"loss": 0.5}, "val")
report.finish()
"""


def test_every_rank_beats_and_only_rank_0_keeps_metrics_and_the_run_record(tmp_path):
    tl = tmp_path / "slurmgen-9.timeline.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURMGEN_")}
    env.update(SLURMGEN_HEARTBEAT_DIR=str(tmp_path / "hb"), SLURMGEN_TIMELINE_FILE=str(tl), WORLD_SIZE="2")
    for rank in (0, 1):
        proc = subprocess.run(
            [sys.executable, "-c", PROGRAM],
            cwd=tmp_path,
            env={**env, "RANK": str(rank)},
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
    beats = read_heartbeats(tmp_path / "hb")
    assert {r: (b["step"], b["status"]) for r, b in beats.items()} == {0: (5, "done"), 1: (5, "done")}
    lines = [json.loads(x) for x in tl.read_text().splitlines()]
    for rank in (0, 1):
        # The phases said, in order: step samples ("steps") are the timeline's, not the reporter's.
        said = [x["event"] for x in lines if x["rank"] == rank and not x.get("inferred") and x["event"] != "steps"]
        assert said[:4] == ["process", "imports", "first_step", "checkpoint"] and said[-1] == "end", said
    metrics = [json.loads(x) for x in (tmp_path / "slurmgen-9.metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["loss"], m["lr"]) for m in metrics] == [(s, 1.0 / s, 0.1) for s in range(1, 6)]
    (run,) = find_runs(tmp_path / "runs")  # rank 1 made none
    assert run.steps == 5 and run.last("loss") == 0.2 and run.last("loss", ("val",)) == 0.5
    assert run.get("status") == "finished"


def test_without_a_launcher_only_the_run_record_is_written(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURMGEN_")}
    proc = subprocess.run([sys.executable, "-c", PROGRAM], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert {p.relative_to(tmp_path).parts[0] for p in tmp_path.rglob("*") if p.is_file()} == {"runs"}


def test_naming_the_package_imports_nothing():
    code = "import sys, slurmgen.integrations; print(sorted(m for m in sys.modules if m.startswith('slurmgen')))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    found = proc.stdout.strip()
    assert found == str(["slurmgen", "slurmgen.contract", "slurmgen.contract.phases", "slurmgen.contract.version",
                         "slurmgen.integrations"])  # fmt: skip
