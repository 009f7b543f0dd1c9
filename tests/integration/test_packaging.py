"""The wheel carries the templates: slurmgen works from a plain install, away from the repo."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_wheel_ships_templates_and_renders_from_anywhere(tmp_path):
    # Built from a clean copy: setuptools reuses a build/ directory left in the tree, whose stale
    # files would ship (or hide a package missing from pyproject's list).
    source = tmp_path / "source"
    anywhere = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "test-artifacts")

    def ignore(directory: str, names: list[str]) -> set[str]:
        # A quick start's or a test's outputs at the top only: slurmgen/runs/ is a package.
        top = {"out", "runs"} & set(names) if Path(directory) == REPO else set()
        return set(anywhere(directory, names)) | top

    shutil.copytree(REPO, source, ignore=ignore)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = tmp_path.glob("slurmgen-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "slurmgen/templates/run_slurm.sh.j2" in names
    assert "slurmgen/templates/launch_multi_node.sh.j2" in names
    for template in (REPO / "templates").glob("*.j2"):  # remote_find.sh.j2 too, which `status` renders
        assert f"slurmgen/templates/{template.name}" in names
    assert not any(n.startswith("templates/") for n in names)
    # Every subpackage of the source tree ships (pyproject lists them by hand).
    for init in (REPO / "slurmgen").rglob("__init__.py"):
        assert init.relative_to(REPO).as_posix() in names, f"{init.parent.name} is missing from the wheel"
    # The coordinator's page: its templates and the vendored browser code, nothing fetched at run time.
    for page_file in (
        "templates/overview.html",
        "static/app.js",
        "static/vendor/htmx.min.js",
        "static/vendor/uPlot.iife.min.js",
        "static/vendor/VERSIONS.txt",
    ):
        assert f"slurmgen/coordinator/web/{page_file}" in names

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # The unpacked wheel comes first on sys.path, ahead of the editable install of the repo.
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = (
        "import slurmgen, sys; from slurmgen.cli import main; print('FROM', slurmgen.__file__); "
        "main(['create', '--nodes', '2', '--gpus', '4'])"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=elsewhere, capture_output=True, text=True, env=env, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert f"FROM {site}" in run.stdout
    assert "#SBATCH --nodes=2" in (elsewhere / "out" / "run_slurm.sh").read_text()
