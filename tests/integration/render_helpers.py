"""Shared by the integration tests: render a job with the real CLI and lint what it wrote."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def render_and_lint(out: Path, *args: str, command: list[str]) -> Path:
    """`slurmgen create ARGS -o OUT -- COMMAND`; every rendered script must pass shellcheck (issue 3, test 5)."""
    proc = subprocess.run(
        [sys.executable, "-m", "slurmgen", "create", *args, "-o", str(out), "--", *command],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, f"slurmgen create failed:\n{proc.stdout}\n{proc.stderr}"
    scripts = sorted(out.glob("*.sh"))
    assert [s.name for s in scripts] == ["launch_multi_node.sh", "run_slurm.sh"]
    lint = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, f"shellcheck on rendered scripts:\n{lint.stdout}{lint.stderr}"
    return out
