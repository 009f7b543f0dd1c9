"""A chatty launch whose registry sits on a small disk: the launch's log (kept beside the registry
for the run page) stops at its limit, so the registry still has room for the verdict.

Found by trying it: on a 200 KB tmpfs a launch printing a few MB filled the disk with its log, and
its row stayed "running" after it had ended well. Mounting needs root (under CI a skip fails).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import PY, local_plan, recorded_launch, tmpfs

from slurmgen.runs.model import find_by_ref
from slurmgen.runs.registry import Registry

pytestmark = pytest.mark.integration

# 3 MB of output: 30,000 lines of 100 bytes.
CHATTY = "import sys\nline = 'x' * 99 + '\\n'\nfor _ in range(30000):\n    sys.stdout.write(line)\n"


@pytest.fixture
def disk(tmp_path: Path):
    """A 1 MB tmpfs: the registry's disk."""
    with tmpfs(tmp_path, "1m") as mnt:
        yield mnt


def test_a_chatty_launch_cannot_fill_the_registry_s_disk_with_its_log(tmp_path, disk):
    registry = disk / "jobs.sqlite"
    plan = local_plan(tmp_path, [PY, "-c", CHATTY], slots=(1, 1))
    plan.env.update({"SLURMGEN_LAUNCH_ID": "L9", "SLURMGEN_GROUP": "launch-L9"})
    code, launcher = recorded_launch(registry, plan, CHATTY, log_limit=256 * 1024)
    assert code == 0, launcher.err.getvalue()
    with Registry.open(registry) as reg:
        row = find_by_ref(reg, "L9")
    assert row is not None and (row["state"], row["last_exit"]) == ("succeeded", 0)
    log = disk / "launch-logs" / "launch-L9.log"
    assert 200 * 1024 < log.stat().st_size <= 256 * 1024 + 200
    assert log.read_text().splitlines()[-1].startswith("slurmgen: ----- this log stops here")
    for rank in (0, 1):  # the nodes' own logs have every line
        assert len((tmp_path / "out" / "logs" / f"rank-{rank}.log").read_text().splitlines()) == 30001
