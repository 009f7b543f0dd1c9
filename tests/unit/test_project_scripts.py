"""The project's own shell scripts lint clean, like the ones it generates."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_project_scripts_pass_shellcheck():
    scripts = sorted(REPO.glob("scripts/**/*.sh")) + [REPO / ".ci" / "run"]
    assert scripts
    for script in scripts:
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, script
    if shutil.which("shellcheck") is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck is not installed (scripts/setup.sh --test installs it)")
        pytest.skip("shellcheck is not installed")
    result = subprocess.run(["shellcheck", "-x", *map(str, scripts)], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout[-4000:]
