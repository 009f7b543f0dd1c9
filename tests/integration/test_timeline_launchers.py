"""A complete per-rank timeline for every launcher (issue 23), of a nanoGPT-style program patched
with only `from slurmgen import beat` and `beat(step=..., loss=...)` (examples/nanogpt_beat.py):
under Slurm (2x2), over SSH with `slurmgen launch`, by hand with launch_multi_node.sh and as a
coordinator group. Each run is found by its id through `slurmgen status ID --timeline --json`
(launch_multi_node.sh by hand has no registry: its file is read directly)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import Coord, base_args, free_port, sg, wait_for

from slurmgen.cli import main
from slurmgen.contract import phases
from slurmgen.observe.report import analyse

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PY = sys.executable
NANOGPT = str(Path(__file__).parents[2] / "examples" / "nanogpt_beat.py")
ITERS = 8


def assert_complete(found: dict, ranks: int, attempt: int) -> None:
    """Every rank has every phase, in order, and each phase's slowest rank is named; the attempt
    is numbered by the one rule (contract/attempts.py: from 1), whichever launcher ran it."""
    (att,) = [a for a in found["attempts"] if a["ranks"]]
    assert att["attempt"] == attempt, found
    rows = {r["rank"]: r for r in att["ranks"]}
    assert sorted(rows) == list(range(ranks)), att
    for r in rows.values():
        times = [r[p] for p in phases.PHASES]
        assert None not in times and times == sorted(times), r
        assert r["status"] == "done" and r["last_step"] == ITERS, r
    assert set(att["slowest"]) == set(phases.PHASES), att


def test_nanogpt_2x2_under_slurm(cluster, tmp_path):
    job = sg(
        cluster,
        tmp_path,
        "submit",
        "--nodes",
        "2",
        "--gpus",
        "2",
        "--backend",
        "gloo",
        "--time",
        "5",
        "-o",
        "ng",
        "--wait",
        "--",
        "python",
        NANOGPT,
        str(ITERS),
    ).stdout.strip()
    found = json.loads(sg(cluster, tmp_path, "status", job, "--timeline", "--json").stdout)
    assert_complete(found, 4, 1)  # Slurm's restart count 0 is attempt 1 (contract/attempts.py)
    assert 0 < found["goodput"]["goodput"] < 1 and found["goodput"]["breakdown"]["startup"] > 0, found["goodput"]


def test_nanogpt_over_slurmgen_launch(cluster, tmp_path):
    if len(cluster.nodes) < 2:
        pytest.skip("needs 2 nodes")
    reg = tmp_path / "jobs.sqlite"
    proc = subprocess.run(
        [
            PY,
            "-m",
            "slurmgen",
            "launch",
            *base_args(cluster, tmp_path),
            "--registry",
            str(reg),
            "--hosts",
            "node1,node2",
            "--gpus",
            "2",
            "--",
            PY,
            NANOGPT,
            str(ITERS),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **cluster.env()},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(sg(cluster, tmp_path, "jobs", "--json").stdout)
    found = json.loads(sg(cluster, tmp_path, "status", row["job"], "--timeline", "--json").stdout)
    assert_complete(found, 4, 1)
    assert found["goodput"]["goodput"] > 0, found
    text = sg(cluster, tmp_path, "status", row["job"]).stdout
    assert text.startswith(f"launch {row['job']} ") and "goodput " in text, text


def test_nanogpt_by_hand_with_launch_multi_node(tmp_path):
    with pytest.raises(SystemExit):
        main(
            [
                "create",
                "--nodes",
                "2",
                "--gpus",
                "2",
                "--backend",
                "gloo",
                "-o",
                str(tmp_path / "o"),
                "--force",
                "--",
                PY,
                NANOGPT,
                str(ITERS),
            ]
        )
    tl = tmp_path / "timeline.jsonl"
    logs = tmp_path / "logs"  # the ranks' logs here, not under the working directory
    env = {
        **os.environ,
        "MASTER_PORT": str(free_port()),
        "SLURMGEN_TIMELINE_FILE": str(tl),
        "SLURMGEN_LOG_DIR": str(logs),
    }
    procs = [
        subprocess.Popen(
            [str(tmp_path / "o" / "launch_multi_node.sh"), "127.0.0.1", "2", "2", str(n)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in (0, 1)
    ]
    codes = [p.wait(240) for p in procs]
    assert codes == [0, 0], [p.stderr.read() for p in procs] + [
        f.read_text()[-1500:] for f in sorted(logs.glob("rank-*.log"))
    ]
    found = analyse(tl.read_text(), [], None, time.time())
    assert_complete(found["timeline"], 4, 1)  # no launcher numbered it: the first attempt
    lines = [json.loads(x) for x in tl.read_text().splitlines()]
    assert sorted(x["rank"] for x in lines if x.get("by") == "launcher" and x["event"] == "end") == [0, 1, 2, 3]


def test_nanogpt_as_a_coordinator_group(cluster, tmp_path, monkeypatch):
    reg = tmp_path / "jobs.sqlite"
    monkeypatch.setenv("SLURMGEN_REGISTRY", str(reg))  # the server's registry
    coord = Coord(cluster, tmp_path)
    try:
        coord.form_group()
        coord.call(
            "PUT",
            "/api/groups/exp1/config",
            json={
                "master": "node1",
                "backend": "gloo",
                "cwd": str(tmp_path),
                "argv": [PY, NANOGPT, str(ITERS)],
                "stop_grace": 3,
            },
        )
        coord.call("POST", "/api/groups/exp1/start")
        g = coord.wait({"succeeded", "failed"}, 240)
        assert g["state"] == "succeeded", coord.logs()
    finally:
        coord.close()
    wait_for(lambda: reg.exists(), 5, "the registry")
    proc = subprocess.run(
        [PY, "-m", "slurmgen", "status", "--registry", str(reg), "exp1", "--timeline", "--json"],
        capture_output=True,
        text=True,
        env=cluster.env(),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert_complete(json.loads(proc.stdout), 4, 1)
