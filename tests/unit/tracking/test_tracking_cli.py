"""`slurmgen runs` and `slurmgen plot` on run records written by the library."""

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from slurmgen import tracking
from slurmgen.cli import main


def cli(capsys, *args):
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    return info.value.code, out, err


def make_runs(root: Path) -> None:
    a = tracking.init(root, name="baseline", environ={"SLURM_JOB_ID": "11"}, config={"lr": 1e-3})
    for step in range(10, 210, 10):
        a.log("train", {"loss": 3 * math.exp(-step / 60) + 0.3, "lr": 1e-3}, step=step)
        if step % 50 == 0:
            a.log("val", {"loss": 3 * math.exp(-step / 60) + 0.45}, step=step)
    a.finish()
    b = tracking.init(root, name="bigger-lr", environ={"SLURM_JOB_ID": "12"})
    b.log("train", {"loss": 2.0}, step=10)
    b.finish("preempted", 75)


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_runs_table_and_json(tmp_path, capsys):
    make_runs(tmp_path)
    code, out, _ = cli(capsys, "runs", str(tmp_path))
    assert code == 0
    header, first, second = out.splitlines()
    assert header.split()[:5] == ["name", "group", "job", "type", "status"]
    assert first.split()[:6] == ["baseline", "slurm-11", "main", "finished", "200", "0.407"]
    assert second.split()[:6] == ["bigger-lr", "slurm-12", "main", "preempted", "10", "2"]
    code, out, _ = cli(capsys, "runs", str(tmp_path), "--json")
    rows = json.loads(out)
    assert [(r["name"], r["status"], r["steps"]) for r in rows] == [
        ("baseline", "finished", 200),
        ("bigger-lr", "preempted", 10),
    ]
    assert rows[0]["duration"] >= 0 and rows[0]["id"] == "slurm-11/main"


def test_damaged_run_records_are_named_and_the_rest_listed(tmp_path, capsys):
    make_runs(tmp_path)
    records = sorted(tmp_path.rglob("run.json"))
    assert len(records) == 2
    records[0].write_text('{"id": "cut')  # a writer killed mid-file
    (tmp_path / "x" / "y").mkdir(parents=True)
    (tmp_path / "x" / "y" / "run.json").write_bytes(b"\xff\xfe")  # not text at all
    code, out, err = cli(capsys, "runs", str(tmp_path))
    assert code == 0 and "bigger-lr" in out and "baseline" not in out
    assert err.splitlines() == [
        f"slurmgen: warning: skipped a damaged run record: {records[0]} is damaged "
        "(not valid JSON: Unterminated string starting at: line 1 column 8 (char 7))",
        f"slurmgen: warning: skipped a damaged run record: {tmp_path}/x/y/run.json is damaged (not UTF-8 text)",
    ]
    code, _, err = cli(capsys, "plot", str(records[0].parent))
    assert code == 2 and err == (
        f"slurmgen: error: plot: {records[0]} is damaged "
        "(not valid JSON: Unterminated string starting at: line 1 column 8 (char 7))\n"
    )
    code, _, err = cli(capsys, "plot", "bigger-lr", "--dir", str(tmp_path), "-o", str(tmp_path / "p.png"))
    assert code == 0 and err.count("slurmgen: warning: skipped a damaged run record: ") == 2


def test_runs_errors_and_empty(tmp_path, capsys):
    code, _, err = cli(capsys, "runs", str(tmp_path / "nope"))
    assert code == 2 and err.startswith("slurmgen: error: runs: no such directory") and err.count("\n") == 1
    code, out, _ = cli(capsys, "runs", str(tmp_path))
    assert code == 0 and out == f"no runs under {tmp_path}\n"


def test_plot_draws_train_and_val_curves(tmp_path, capsys):
    image = pytest.importorskip("matplotlib.image")
    make_runs(tmp_path)
    code, out, err = cli(capsys, "plot", "baseline", "--dir", str(tmp_path))
    assert code == 0, err
    png = tmp_path / "slurm-11" / "main" / "metrics.png"
    assert out == f"wrote {png}\n"
    width, height = png_size(png)
    assert width > 1000 and height > 400 and png.stat().st_size > 20_000
    pixels = image.imread(png)[..., :3]

    def count(hex_colour: str) -> int:
        rgb = [int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
        return int((abs(pixels - rgb).max(axis=-1) < 0.05).sum())

    assert count("#1f77b4") > 1500 and count("#d62728") > 300  # the train and val curves are really there
    code, _, err = cli(capsys, "plot", str(tmp_path / "slurm-11" / "main"), "-o", str(tmp_path / "lr.png"), "-m", "lr")
    assert code == 0 and png_size(tmp_path / "lr.png")[0] < width  # one panel: narrower


def test_plot_errors(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    make_runs(tmp_path)
    code, _, err = cli(capsys, "plot", "nope", "--dir", str(tmp_path))
    assert (
        code == 2
        and err
        == f"slurmgen: error: plot: no run 'nope': not a run directory, nor an id, name or group under '{tmp_path}'\n"
    )
    code, _, err = cli(capsys, "plot", "main", "--dir", str(tmp_path))  # two runs have job type main, but not that name
    assert code == 2
    code, _, err = cli(capsys, "plot", "baseline", "--dir", str(tmp_path), "-m", "accuracy")
    assert code == 2 and "has no metrics to plot among accuracy (have: loss, lr)" in err


def test_plot_without_matplotlib_is_one_line_exit_2(tmp_path):
    make_runs(tmp_path)
    probe = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from slurmgen.cli import main\n"
        f"main(['plot', 'baseline', '--dir', {str(tmp_path)!r}])"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == (
        "slurmgen: error: plot: needs matplotlib, which is not installed (hint: pip install 'slurmgen[plot]')\n"
    )


def make_sweep(root: Path, submit_dir: Path, name: str | None = None) -> None:
    """A 2x2 sweep as run_slurm.sh runs it: array 40, each task its own job and group, the grid beside
    the script; task 2's directory sorts before task 10's siblings would, so the order is checked too."""
    from slurmgen.contract.grid import grid_jsonl, points

    (submit_dir / "out").mkdir(parents=True)
    (submit_dir / "out" / "sweep.jsonl").write_text(grid_jsonl(points({"lr": ["1e-3", "3e-4"], "batch_size": [8, 16]})))
    for task in (3, 0, 2, 1):
        env = {
            "SLURM_JOB_ID": str(41 + task),
            "SLURM_ARRAY_JOB_ID": "40",
            "SLURM_ARRAY_TASK_ID": str(task),
            "SLURMGEN_GROUP": f"slurm-40_{task}",
            "SLURMGEN_SWEEP_INDEX": str(task),
            "SLURMGEN_SWEEP_FILE": "out/sweep.jsonl",
            "SLURM_SUBMIT_DIR": str(submit_dir),
        }
        run = tracking.init(root / f"t{9 - task}", name=name or f"task{task}", environ=env)
        for step in (10, 20):
            run.log("train", {"loss": 1.0 / (task + 1) / step}, step=step)
        run.finish() if task != 3 else run.finish("failed", 1)


def test_runs_shows_a_sweep_as_one_group_with_each_tasks_parameters(tmp_path, capsys):
    make_runs(tmp_path / "runs")
    make_sweep(tmp_path / "runs", tmp_path)
    code, out, _ = cli(capsys, "runs", str(tmp_path / "runs"))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:6] == ["name", "group", "task", "params", "job", "type"]
    assert [line.split()[:2] for line in lines[1:3]] == [["baseline", "slurm-11"], ["bigger-lr", "slurm-12"]]
    assert [line.split()[:8] for line in lines[3:]] == [
        ["task0", "slurm-40", "0", "lr=1e-3", "batch_size=8", "main", "finished", "20"],
        ["task1", "slurm-40", "1", "lr=1e-3", "batch_size=16", "main", "finished", "20"],
        ["task2", "slurm-40", "2", "lr=3e-4", "batch_size=8", "main", "finished", "20"],
        ["task3", "slurm-40", "3", "lr=3e-4", "batch_size=16", "main", "failed", "20"],
    ]
    rows = json.loads(cli(capsys, "runs", str(tmp_path / "runs"), "--json")[1])
    assert [(r["group"], r["sweep"]) for r in rows[2:4]] == [
        ("slurm-40_0", {"id": "slurm-40", "task": 0, "params": {"lr": "1e-3", "batch_size": 8}}),
        ("slurm-40_1", {"id": "slurm-40", "task": 1, "params": {"lr": "1e-3", "batch_size": 16}}),
    ]
    assert rows[0]["sweep"] is None and rows[0]["id"] == "slurm-11/main"  # runs outside a sweep: as before


def test_a_run_outside_slurm_or_with_an_unreadable_grid_is_still_recorded(tmp_path):
    plain = tracking.init(tmp_path / "a", environ={"SLURMGEN_SWEEP_INDEX": "1"})  # not an array task: no sweep
    assert "sweep" not in plain.meta
    lost = tracking.init(
        tmp_path / "b",
        environ={
            "SLURM_ARRAY_JOB_ID": "5",
            "SLURMGEN_SWEEP_INDEX": "1",
            "SLURMGEN_SWEEP_FILE": str(tmp_path / "gone.jsonl"),
        },
    )
    assert lost.meta["sweep"] == {"id": "slurm-5", "task": 1, "params": None}


def test_plot_compares_the_tasks_of_a_sweep(tmp_path, capsys):
    image = pytest.importorskip("matplotlib.image")
    make_sweep(tmp_path / "runs", tmp_path)
    code, out, err = cli(capsys, "plot", "slurm-40", "--dir", str(tmp_path / "runs"))
    png = tmp_path / "runs" / "slurm-40.png"
    assert (code, out) == (0, f"wrote {png}\n"), err
    pixels = image.imread(png)[..., :3]

    def count(hex_colour: str) -> int:
        rgb = [int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
        return int((abs(pixels - rgb).max(axis=-1) < 0.05).sum())

    assert all(count(c) > 100 for c in ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")), "a curve per task"
    code, _, err = cli(capsys, "plot", "slurm-40_2", "--dir", str(tmp_path / "runs"), "-o", str(tmp_path / "one.png"))
    assert code == 0 and (tmp_path / "one.png").is_file()  # one task alone, by its group
    make_sweep(tmp_path / "same", tmp_path / "same", name="train")  # the trainer names a run after its --out-dir
    code, _, err = cli(capsys, "plot", "train", "--dir", str(tmp_path / "same"))
    assert code == 2 and err.endswith(
        ": give a run directory or id, or the id of their sweep (slurm-40) to compare them\n"
    ), err
