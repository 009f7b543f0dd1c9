"""What the launchers say and record for any program (issue 34, items 7 and 8), run for real:
run_slurm.sh (srun and scontrol stand-ins) writes each rank's `process` and `end` to the job's
timeline as launch_multi_node.sh does, and launch_multi_node.sh warns, before any rank starts, of a
hostname that resolves to a loopback address."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from helpers import write

from slurmgen.contract import files, phases
from slurmgen.generate.render import LAUNCH_SCRIPT


def test_run_slurm_records_each_ranks_process_and_end_for_any_program(tmp_path, fake_slurm):
    # The rank wrapper writes them (the same wrapper under srun and under torchrun's workers).
    out = write(tmp_path, nodes=2, gpus=2, command=["bash", "-c", "exit $((RANK == 3 ? 5 : 0))"])
    result = fake_slurm(out)
    assert result.returncode == 5, result.stderr
    (timeline,) = Path(tmp_path / "out" / "logs").glob(files.TIMELINE_NAME.format(job_id="4242"))
    lines = [json.loads(line) for line in timeline.read_text().splitlines()]
    by_rank = {}
    for line in lines:
        assert line["by"] == phases.BY_LAUNCHER and line["attempt"] == 1 and line["host"], line
        by_rank.setdefault(line["rank"], []).append(line["event"])
    assert by_rank == {r: [phases.PROCESS, phases.END] for r in range(4)}, by_rank
    ends = {line["rank"]: (line["status"], line["code"]) for line in lines if line["event"] == phases.END}
    assert ends == {0: ("done", 0), 1: ("done", 0), 2: ("done", 0), 3: ("failed", 5)}, ends


def fake_getent(tmp_path: Path, answers: dict[str, str]) -> dict[str, str]:
    """A PATH whose `getent ahosts NAME` answers `answers[NAME]` (as glibc's first line does)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    cases = "".join(f"  {name}) echo '{addr}      STREAM {name}' ;;\n" for name, addr in answers.items())
    (bin_dir / "getent").write_text(f"#!/usr/bin/env bash\ncase $2 in\n{cases}  *) exit 2 ;;\nesac\n")
    (bin_dir / "getent").chmod(0o755 | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOSTNAME": "gn7", "SLURMGEN_LINK": "off"}


@pytest.mark.parametrize(
    "own, master, warned",
    [
        ("127.0.1.1", "10.9.9.9", True),  # Debian's default /etc/hosts on a real node
        ("10.9.9.7", "10.9.9.9", False),  # the node's own address
        ("127.0.1.1", "127.0.0.1", False),  # every node on this host: loopback is right
    ],
)
def test_a_hostname_on_loopback_is_said_before_any_rank_starts(tmp_path, own, master, warned):
    out = write(tmp_path, command=["true"])
    env = fake_getent(tmp_path, {"gn7": own, master: master})
    # Node 1 of 2 without the link: it runs its rank (`true`) and ends; the warning comes first.
    result = subprocess.run(
        ["bash", str(out / LAUNCH_SCRIPT), master, "2", "1", "1"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    said = "resolves to 127.0.1.1, a loopback address" in result.stderr
    assert said == warned, result.stderr
    if warned:
        assert "set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME)" in result.stderr, result.stderr
