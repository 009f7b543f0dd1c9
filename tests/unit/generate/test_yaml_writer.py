"""job.yaml's plain writer (generate/yaml_writer.py) against PyYAML's (yaml12.dump): the same
bytes wherever the plain writer decides, over specs as people write them, the examples and
thousands of awkward strings; what it leaves to PyYAML, PyYAML writes; and `create` with a spec of plain
values imports no PyYAML."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ODD_ARGUMENTS

from slurmgen.generate import yaml12, yaml_writer
from slurmgen.generate.specfile import build_spec, dump_yaml, load_yaml
from slurmgen.generate.written import WrittenFloat, WrittenInt

# What PyYAML or a YAML reader treats apart: indicators, spaces at the ends, words and numbers
# of YAML 1.1 and 1.2, dates, quotes, and characters outside printable ASCII.
AWKWARD = [
    *"#,[]{}&*!|>'\"%@`?:-=<~. \t\\/",
    "yes", "No", "ON", "off", "y", "n", "true", "False", "null", "NULL", "~", "<<", "=",
    "0", "07", "0o7", "0x1f", "0b101", "1_000", "1:30", "1:30:00", "3.0", "1e3", "1.5e-3", ".inf", "-.inf", ".nan",
    "2024-01-01", "2024-1-1 10:00:00", "---", "...", "- ", ": ", " #", "64G", "2-00:00:00", "a b", "é", "\n", "\x85",
]  # fmt: skip
WORDS = ["x", "train.py", "--lr", "-m", "NCCL_DEBUG", "/data", "gpu[01-02]", "it's", "a:b", "%j"]


def awkward(rng: random.Random) -> str:
    return "".join(rng.choice(AWKWARD + WORDS) for _ in range(rng.randint(0, 4)))


def both(data: dict) -> tuple[str | None, str]:
    return yaml_writer.dump(data), yaml12.dump(data)


EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
# Specs as people write them (the render tests' golden ones among them), each written here.
PLAIN_SPECS = {
    "default": {},
    "nccl_2x4": {
        "nodes": 2,
        "gpus": 4,
        "backend": "nccl",
        "time": "2-00:00:00",
        "partition": "gpu",
        "cpus_per_task": 8,
        "mem": "480G",
        "exclusive": True,
        "env": {"NCCL_DEBUG": "WARN", "NCCL_IB_HCA": "mlx5", "FLAG": "on", "EMPTY": ""},
        "setup": ["module load cuda/12.4"],
        "requeue": True,
        "sbatch_extra": ["--mail-type=END,FAIL"],
    },
    "pyxis": {"container": {"image": "nvcr.io#nvidia/pytorch:24.05-py3", "mounts": ["/data:/data:ro"]}},
    "request_fields": {
        "nodes": 2,
        "gpu_request": "gres",
        "gpu_type": "a100",
        "time_min": "12:00:00",
        "nodelist": "gpu[01-02]",
        "exclude": "gpu[07,09]",
    },
    "healing": {"heartbeat_timeout": 2.5, "retries": 2, "retry_on": "1,124,143", "log_dir": "logs of 'run' $1"},
    "chain": {"chain": 3, "time": "1-00", "job_name": "job 'q' $(x) #1", "master_port": 29400},
}


@pytest.mark.parametrize("name", sorted(PLAIN_SPECS))
def test_specs_as_people_write_them_are_written_without_pyyaml_as_pyyaml_writes_them(name):
    plain, pyyaml = both(build_spec(PLAIN_SPECS[name]).resolved())
    assert plain == pyyaml


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_the_examples_and_odd_commands_are_written_as_pyyaml_writes_them(example):
    spec = build_spec(load_yaml(EXAMPLES / example))
    for command in (None, ["python", "train.py", "--note", "a b; $(rm -rf /) `x` 'y' \"z\" #", *ODD_ARGUMENTS]):
        resolved = spec.resolved() if command is None else {**spec.resolved(), "command": command}
        plain, pyyaml = both(resolved)
        assert plain in (None, pyyaml)


def test_thousands_of_awkward_values_are_written_as_pyyaml_writes_them():
    rng = random.Random(32)
    decided = 0
    for _ in range(3000):
        data = {
            awkward(rng) or "k": awkward(rng),
            "env": {awkward(rng): awkward(rng) for _ in range(rng.randint(0, 3))},
            "command": [awkward(rng) for _ in range(rng.randint(0, 3))],
            "nested": {"mounts": [awkward(rng)], "n": rng.choice([0, -7, 10**20, True, 2.5, 1e-7, 1e22])},
        }
        plain, pyyaml = both(data)
        if plain is not None:
            decided += 1
            assert plain == pyyaml, data
    assert decided > 300, decided  # the comparison is not vacuous


def test_numbers_as_yaml12_reads_them_back_and_what_is_left_to_pyyaml():
    data = {"a": WrittenInt(5), "b": WrittenFloat(3e-4), "c": 1e17, "d": -0.0, "e": 12345678901234567890}
    plain, pyyaml = both(data)
    assert plain == pyyaml
    for odd in ({"x": float("nan")}, {"x": float("inf")}, {"x": [[1]]}, {"x": [{"a": 1}]}, {1: "a"}, {"x": None}):
        assert yaml_writer.dump(odd) is None, odd
    assert yaml_writer.dump({"x": "y" * 1000}) is None  # PyYAML folds long lines
    assert yaml_writer.dump({}) is None


def test_a_sweep_spec_falls_back_to_pyyaml_and_reads_back(tmp_path):
    spec = build_spec({"sweep": {"lr": [0.1, 0.01], "bs": [8, 16]}, "env": {"A": "é"}})
    text = dump_yaml(spec)
    assert yaml_writer.dump(spec.resolved()) is None
    (tmp_path / "job.yaml").write_text(text)
    assert build_spec(load_yaml(tmp_path / "job.yaml")) == spec


def test_create_with_plain_values_imports_no_pyyaml(tmp_path):
    probe = (
        "import sys; from slurmgen.cli import main\n"
        "try:\n    main(['create', '--nodes', '2', '--gpus', '4', '--time', '1:00:00', '--env', 'A=on', '--force'])\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "print(sorted(m for m in sys.modules if m == 'yaml' or m.startswith('yaml.')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "[]"
    assert "time: '1:00:00'" in (tmp_path / "out" / "job.yaml").read_text()
