"""`submit --shapes ... --earliest` (issue 36, item 2): each shape asked of `sbatch --test-only`,
the table, the soonest submitted, and the trainer's global batch kept across shapes. Slurm here is
a stand-in `sbatch` on PATH answering --test-only as Slurm 22.05.8 did on the test cluster (the
lines below were recorded there); the real one is asked in tests/integration/test_earliest_slurm.py."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

import pytest
from helpers import run

from slurmgen.errors import SlurmgenError
from slurmgen.jobs import shapes, test_only
from slurmgen.train.config import ConfigError, TrainConfig

# Recorded on the test cluster (Slurm 22.05.8), node1 held by another job until 10:27:56.
STARTS_LATER = (
    "sbatch: Job 3 to start at 2026-11-28T10:27:56 using 2 processors on nodes node[1-2] in partition debug\n"
)
STARTS_NOW = "sbatch: Job 4 to start at 2026-11-28T10:24:57 using 1 processors on nodes node2 in partition debug\n"
NEVER = "allocation failure: Requested node configuration is not available\n"
NO_PARTITION = (
    "sbatch: error: invalid partition specified: nosuch\nallocation failure: Invalid partition name specified\n"
)


def test_the_answers_of_sbatch_test_only_are_read():
    later = test_only.parse(STARTS_LATER, 0)
    assert (later.start, later.partition, later.nodes, later.error) == (
        datetime(2026, 11, 28, 10, 27, 56),
        "debug",
        "node[1-2]",
        None,
    )
    assert test_only.parse(NEVER, 1) == test_only.Estimate(error="Requested node configuration is not available")
    assert test_only.parse(NO_PARTITION, 1).error == "Invalid partition name specified"
    assert test_only.parse("", 1).error == "sbatch --test-only exited with code 1"


@pytest.mark.parametrize("text", ["", "2x", "2x4,x8", "0x8", "2*4", "2x4,2x4"])
def test_shapes_that_do_not_parse_are_one_line(text):
    with pytest.raises(SlurmgenError) as exc:
        shapes.parse(text)
    assert exc.value.exit_code == 2 and str(exc.value).startswith("shapes: "), str(exc.value)


def test_the_soonest_shape_is_chosen_and_the_table_says_why_not_sooner():
    rows = [
        shapes.Row(shapes.Shape(2, 2), test_only.parse(STARTS_LATER, 0)),
        shapes.Row(shapes.Shape(1, 8), test_only.parse(NEVER, 1)),
        shapes.Row(shapes.Shape(1, 2), test_only.parse(STARTS_NOW, 0)),
    ]
    chosen = shapes.soonest(rows)
    assert chosen is rows[2]
    lines = shapes.table(rows, datetime(2026, 11, 28, 10, 24, 50), chosen)
    assert lines[0].split() == ["shape", "partition", "expected", "start", "why", "not", "sooner"]
    assert "busy until then" in lines[1] and "2026-11-28 10:27:56" in lines[1]
    assert lines[2].startswith("1x8 ") and "never: Requested node configuration is not available" in lines[2]
    assert lines[3].startswith("1x2 *") and lines[3].endswith("free now")
    assert shapes.soonest(rows[1:2]) is None
    assert "1x8: Requested node configuration" in str(shapes.never(rows[1:2]))


TRAIN = ["python", "-m", "slurmgen.train", "--batch-size", "4"]


def test_the_trainer_keeps_its_global_batch_across_shapes_or_the_shape_is_refused():
    two = [shapes.Shape(2, 4), shapes.Shape(1, 4)]
    assert shapes.batch_notes([*TRAIN, "--global-batch", "64"], two) == [
        "the trainer keeps its global batch of 64 on every shape: accumulation steps 2 on 2x4, 4 on 1x4"
    ]
    with pytest.raises(SlurmgenError) as exc:
        shapes.batch_notes([*TRAIN, "--global-batch", "48"], [*two, shapes.Shape(1, 3)])
    assert exc.value.problems == [
        "shapes: 2x4: --global-batch 48 is not a multiple of --batch-size 4 x 8 processes (= 32): "
        "no whole number of accumulation steps gives it"
    ]
    assert "changes with the shape" in shapes.batch_notes(TRAIN, two)[0]
    assert shapes.batch_notes(["python", "train.py"], two) == []
    # The trainer applies the same rule when it starts, on the world it finds.
    cfg = TrainConfig(batch_size=4, global_batch=64)
    assert cfg.at_world(4).grad_accum == 4 and cfg.at_world(8).grad_accum == 2
    with pytest.raises(ConfigError, match="not a multiple"):
        cfg.at_world(3)
    with pytest.raises(ConfigError, match="drop --grad-accum 2"):
        TrainConfig(global_batch=64, grad_accum=2).validate()


def fake_slurm(tmp_path: Path, monkeypatch) -> Path:
    """sbatch answering --test-only by the #SBATCH --nodes line of the script on stdin (2 nodes:
    later; 1 node of 8: never; else now), and --parsable with job 77, logging what it was given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        "#!/bin/bash\n"
        f'echo "$*" >>"{bin_dir}/calls"\n'
        "if [[ $1 == --test-only ]]; then script=$(cat)\n"
        f'  case "$script" in\n'
        f"    *'--nodes=2'*) printf '%s' '{STARTS_LATER}' >&2; exit 0 ;;\n"
        f"    *'--ntasks-per-node=8'*) printf '%s' '{NEVER}' >&2; exit 1 ;;\n"
        f"    *) printf '%s' '{STARTS_NOW}' >&2; exit 0 ;;\n"
        "  esac\nfi\necho 77\n"
    )
    (bin_dir / "date").write_text("#!/bin/sh\necho 2026-11-28T10:24:50\n")
    for name in ("sbatch", "date"):
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir


def test_submit_earliest_submits_the_soonest_shape(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bin_dir = fake_slurm(tmp_path, monkeypatch)
    code, out, err = run(capsys, "submit", "--registry", "r.sqlite", "--shapes", "2x2,1x8,1x2", "--earliest")
    assert (code, out) == (0, "77\n"), err
    assert "1x2 *" in err and "never: Requested node configuration" in err, err
    assert "submitting 1x2" in err
    assert "#SBATCH --nodes=1\n" in (tmp_path / "out" / "run_slurm.sh").read_text()
    assert "#SBATCH --ntasks-per-node=2\n" in (tmp_path / "out" / "run_slurm.sh").read_text()
    calls = (bin_dir / "calls").read_text().splitlines()
    assert calls[:3] == ["--test-only"] * 3 and calls[3].startswith("--parsable"), calls


def test_dry_run_prints_the_table_and_submits_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bin_dir = fake_slurm(tmp_path, monkeypatch)
    code, out, err = run(capsys, "submit", "--shapes", "2x2,1x2", "--dry-run")
    assert code == 0, err
    assert out.splitlines()[0].startswith("shape") and "would submit 1x2" in out, out
    assert (bin_dir / "calls").read_text().splitlines() == ["--test-only"] * 2
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--shapes", "2x4,1y8", "--earliest"], "shapes: expected NODESxGPUS"),
        (["--shapes", "2x4"], "needs --earliest"),
        (["--earliest"], "earliest: --earliest picks among shapes"),
        (["--shapes", "1x8", "--earliest"], "shapes: Slurm can start none of them: 1x8: Requested node"),
        (
            ["--shapes", "2x4,1x3", "--earliest", "--", "python", "-m", "slurmgen.train", "--global-batch", "64"],
            "shapes: 1x3: --global-batch 64 is not a multiple",
        ),
    ],
)
def test_bad_shapes_are_one_line_and_nothing_is_submitted(tmp_path, capsys, monkeypatch, argv, said):
    monkeypatch.chdir(tmp_path)
    bin_dir = fake_slurm(tmp_path, monkeypatch)
    code, out, err = run(capsys, "submit", "--registry", "r.sqlite", *argv)
    errors = [line for line in err.splitlines() if line.startswith("slurmgen: error: ")]
    assert code == 2 and len(errors) == 1 and said in errors[0] and "Traceback" not in err, err
    calls = (bin_dir / "calls").read_text() if (bin_dir / "calls").exists() else ""
    assert "--parsable" not in calls


def test_the_python_api_trains_the_global_batch_on_its_world(tmp_path, capfd, monkeypatch):
    """train_ddp applies global_batch as the CLI does: one process of 4 samples accumulates 4."""
    import torch
    import torch.nn.functional as F

    from slurmgen.train import train_ddp

    for k in list(os.environ):
        if k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") or k.startswith("SLURM_"):
            monkeypatch.delenv(k)
    xs = torch.randn(64, 3, generator=torch.Generator().manual_seed(0))
    data = [(x, x.sum(dim=0, keepdim=True)) for x in xs]
    result = train_ddp(
        model=torch.nn.Linear(3, 1),
        train_dataset=data,
        loss_fn=F.mse_loss,
        config={"out_dir": str(tmp_path), "max_steps": 2, "progress": "none", "track": "off"},
        batch_size=4,
        global_batch=16,
        threads=torch.get_num_threads(),
    )
    said = capfd.readouterr().err
    assert result.exit_code == 0
    assert "global batch: 16 samples (4 per process x 4 accumulation x 1 processes)" in said, said


def test_earliest_remote_asks_and_submits_on_the_login_node(tmp_path, capsys, monkeypatch, login_node):
    """--test-only, the clock and the submit go over the one connection of --remote; the soonest
    shape's scripts are the ones shipped into the job directory there."""
    monkeypatch.chdir(tmp_path)
    bin_dir = fake_slurm(tmp_path, monkeypatch)
    (tmp_path / "code").mkdir()
    remote = ["--remote", "login1", "--remote-setup", "true", "--code", "code", "--registry", "r.sqlite"]
    code, out, err = run(capsys, "submit", "--shapes", "2x2,1x2", "--dry-run", *remote)
    assert code == 0 and "would submit 1x2" in out, err
    assert list((tmp_path / "login").iterdir()) == [] and not (tmp_path / "out").exists()  # nothing shipped
    code, out, err = run(capsys, "submit", "--shapes", "2x2,1x8,1x2", "--earliest", *remote)
    assert (code, out) == (0, "77\n") and "submitting 1x2" in err, err
    unpacking = [line for line in login_node.lines if not line.startswith("true && ")]  # ship's own: no setup
    assert len(login_node.opened) == 2 and all(line.startswith("mkdir -p ") for line in unpacking), unpacking
    (script,) = (tmp_path / "login" / ".slurmgen" / "jobs").glob("*/out/run_slurm.sh")
    assert "#SBATCH --nodes=1\n" in script.read_text() and "#SBATCH --ntasks-per-node=2\n" in script.read_text()
    calls = (bin_dir / "calls").read_text().splitlines()
    assert calls[:5] == ["--test-only"] * 5 and calls[5].startswith("--parsable") and len(calls) == 6, calls
