"""Every example config loads, validates and renders to clean scripts."""

import subprocess
from pathlib import Path

import pytest

from slurmgen.generate.render import LAUNCH_SCRIPT, SLURM_SCRIPT, render
from slurmgen.generate.specfile import spec_from_sources

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples").glob("*.yaml"))


def test_there_are_examples():
    assert {p.stem for p in EXAMPLES} >= {"nccl_2x4", "cpu_gloo", "container_pyxis"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_renders(path, tmp_path):
    files = render(spec_from_sources(path, {})).files
    for name in (SLURM_SCRIPT, LAUNCH_SCRIPT):
        script = tmp_path / name
        script.write_text(files[name])
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
