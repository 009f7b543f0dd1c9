"""The fault matrix (docs/guides/faults.md) names real tests: every row names at least one, each
exists (its file defines the function), and they are what `-m fault` selects."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from helpers import FAULTS_DOC, fault_matrix

ROOT = FAULTS_DOC.parents[2]


def _defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_row_names_a_test_that_exists():
    rows = fault_matrix()
    assert len(rows) >= 15, rows
    missing = [fault for fault, nodes in rows if not nodes]
    assert not missing, f"rows that name no test: {missing}"
    absent = [
        node
        for _, nodes in rows
        for node in nodes
        if not (ROOT / node.split("::")[0]).is_file() or node.split("::")[1] not in _defined(ROOT / node.split("::")[0])
    ]
    assert not absent, f"the fault matrix names tests that do not exist: {absent}"


def test_the_fault_marker_selects_what_the_matrix_names():
    """Checked on the one unit-test file the matrix names (collecting the integration files
    imports torch: too slow here); the hook is the same for every file."""
    named = {node for _, nodes in fault_matrix() for node in nodes}
    path = "tests/unit/launch/test_launch_remote.py"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "fault", "-p", "no:cacheprovider", path],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    collected = {line.split("[")[0] for line in proc.stdout.splitlines() if "::" in line}
    assert collected == {n for n in named if n.startswith(path)} != set(), proc.stdout + proc.stderr
