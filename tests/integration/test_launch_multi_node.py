"""launch_multi_node.sh as two nodes on this machine, running the torch.distributed probe on gloo."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port

from slurmgen.cli import main

pytestmark = pytest.mark.integration
pytest.importorskip("torch", reason="torch is not installed: run scripts/setup.sh")

PROBE = ["python", "-m", "slurmgen.train.probe", "--timeout", "60"]


def create(out: Path, *command: str, gpus=2):
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "create",
                "--nodes",
                "2",
                "--gpus",
                str(gpus),
                "--backend",
                "gloo",
                "-o",
                str(out),
                "--force",
                "--",
                *command,
            ]
        )
    assert exit_info.value.code == 0


def start_nodes(out: Path, gpus=2, env=None):
    port = free_port()
    # `python` in the generated command must be this interpreter, with torch and slurmgen.
    path = f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "MASTER_PORT": str(port), **(env or {})}
    return [
        subprocess.Popen(
            [str(out / "launch_multi_node.sh"), "127.0.0.1", "2", str(gpus), str(node)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        for node in (0, 1)
    ]


def finish(procs, timeout=90):
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    return results


def probe_lines(text):
    return [json.loads(line.split("SLURMGEN_PROBE ", 1)[1]) for line in text.splitlines() if "SLURMGEN_PROBE " in line]


def still_running(marker: str):
    result = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return result.stdout.split()


def test_two_nodes_agree_on_world_and_sum(tmp_path):
    create(tmp_path / "out", *PROBE)
    results = finish(start_nodes(tmp_path / "out"))
    assert [rc for rc, _, _ in results] == [0, 0], [err[-2000:] for _, _, err in results]
    rows = [row for _, out, _ in results for row in probe_lines(out)]
    assert sorted(r["rank"] for r in rows) == [0, 1, 2, 3]
    assert all(r["problems"] == [] and r["sum"] == 10 and r["world_size"] == 4 for r in rows)
    assert {(r["rank"], r["local_rank"], r["node_rank"]) for r in rows} == {(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)}
    assert {(r["master_addr"], r["master_port"]) for r in rows} == {("127.0.0.1", rows[0]["master_port"])}
    logs = sorted(p.name for p in (tmp_path / "out" / "logs").iterdir())
    assert logs == ["rank-0.log", "rank-1.log", "rank-2.log", "rank-3.log"]


def test_failing_rank_stops_its_node_fast_and_leaves_nothing(tmp_path):
    create(tmp_path / "out", *PROBE, "--fail-rank", "3", "--sleep", "1")
    procs = start_nodes(tmp_path / "out")
    started = time.monotonic()
    results = finish(procs)
    elapsed = time.monotonic() - started
    codes = [rc for rc, _, _ in results]
    assert codes[1] == 1, results[1][2][-2000:]
    assert codes[0] != 0  # node 0's ranks lose their peer and fail too
    assert "rank 3 (local rank 1) exited with code 1" in results[1][2]
    assert elapsed < 30, f"took {elapsed:.1f}s"
    assert "fails on purpose" in (tmp_path / "out" / "logs" / "rank-3.log").read_text()
    time.sleep(0.5)
    assert still_running(str(tmp_path / "out")) == []
    assert [pid for pid in still_running("slurmgen.train.probe --timeout 60 --fail-rank 3")] == []
