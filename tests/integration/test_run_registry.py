"""One registry of runs on the real test cluster (issue 22): a job `slurmgen submit` sent to
Slurm, two `slurmgen launch` runs over SSH (one fails) and a coordinator group all recorded in
one registry file, and listed by `slurmgen jobs --json` with their kind and state.

Every step goes through the real command line in a subprocess; the registry is the test's own
file (SLURMGEN_REGISTRY, inherited by the server, which records into the registry of the
machine it runs on).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import COMMAND, PY, Run, assert_nodes_clean, base_args, sg

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def listed(cluster, cwd: Path, *args: str) -> list[dict]:
    return json.loads(sg(cluster, cwd, "jobs", "--json", *args).stdout)


def test_submit_launch_and_a_group_show_in_one_list(cluster, tmp_path, monkeypatch):
    if len(cluster.nodes) < 2:
        pytest.skip("needs 2 nodes")
    assert_nodes_clean(cluster, timeout=15)
    registry = tmp_path / "jobs.sqlite"
    monkeypatch.setenv("SLURMGEN_REGISTRY", str(registry))  # for launch and serve; sg passes --registry too

    job = sg(
        cluster, tmp_path, "submit", "--nodes", "2", "--backend", "gloo", "--time", "5", "-o", "one", "--wait", *COMMAND
    ).stdout.strip()
    ok = Run(
        [*base_args(cluster, tmp_path), "--hosts", "node1,node2", "--gpus", "2", "--", "bash", "-c", "echo rank $RANK"]
    )
    assert ok.finish(120) == 0, ok.text()
    bad = Run(
        [
            *base_args(cluster, tmp_path),
            "--hosts",
            "node1,node2",
            "--gpus",
            "2",
            "--",
            "bash",
            "-c",
            "if [[ $RANK == 3 ]]; then exit 3; fi; sleep 30",
        ]
    )
    assert bad.finish(120) == 3, bad.text()

    rows = listed(cluster, tmp_path)
    assert [(r["kind"], r["state"], r["run_state"], r["exit_code"]) for r in rows] == [
        ("launch", "failed", "failed", 3),
        ("launch", "succeeded", "succeeded", 0),
        ("slurm", "COMPLETED", "succeeded", 0),
    ], rows
    failed, done, slurm = rows
    assert slurm["job"] == job and (slurm["nodes"], slurm["ranks"], slurm["run_id"]) == (2, 2, f"slurm-{job}")
    assert slurm["attempts"] == 1, slurm  # it ran once (Slurm's restart count 0), as a launch's first attempt
    assert (failed["nodes"], failed["ranks"], failed["attempts"]) == (2, 4, 1)
    assert (failed["first_failure"]["rank"], failed["first_failure"]["node"], failed["first_failure"]["code"]) == (
        3,
        "node2",
        3,
    ), failed
    assert done["run_id"] == f"launch-{done['job']}" and done["ended"] >= done["started"]
    assert [log["node"] for log in done["logs"]] == ["node1", "node2"]
    assert [r["kind"] for r in listed(cluster, tmp_path, "--kind", "launch", "--state", "failed")] == ["launch"]
    assert [r["job"] for r in listed(cluster, tmp_path, "--kind", "slurm")] == [job]

    _a_group_runs_and_fails(cluster, tmp_path)
    rows = listed(cluster, tmp_path, "--kind", "group")
    assert [(r["name"], r["state"], r["exit_code"], r["nodes"], r["ranks"]) for r in rows] == [
        ("exp1", "failed", 4, 2, 4)
    ], rows
    assert (rows[0]["first_failure"]["rank"], rows[0]["first_failure"]["code"]) == (2, 4), rows
    text = sg(cluster, tmp_path, "jobs").stdout.splitlines()
    assert [line.split()[0] for line in text] == ["group", "launch", "launch", "slurm"], text


def _a_group_runs_and_fails(cluster, tmp_path: Path) -> None:
    """Serve and two agents (as test_coordinator_cluster starts them); rank 2 of the group exits 4."""
    pytest.importorskip("fastapi", reason="the serve extra is not installed: run scripts/setup.sh --test")
    from helpers import Coord, wait_for

    coord = Coord(cluster, tmp_path)
    try:
        names = [f"{n}-{i}" for n in ("node1", "node2") for i in (0, 1)]
        wait_for(lambda: sorted(w["name"] for w in coord.call("GET", "/api/workers")) == names, 30, "4 workers")
        coord.call("POST", "/api/groups", json={"name": "exp1"})
        coord.call("POST", "/api/workers/move", json={"workers": names, "group": "exp1"})
        coord.run(PY, "-c", "import os, sys, time; time.sleep(1); sys.exit(4 if os.environ['RANK'] == '2' else 0)")
        assert coord.wait({"succeeded", "failed"}, 60)["state"] == "failed", coord.logs()
    finally:
        coord.close()
