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
    assert [(r["name"], r["status"], r["steps"]) for r in rows] == [("baseline", "finished", 200), ("bigger-lr", "preempted", 10)]
    assert rows[0]["duration"] >= 0 and rows[0]["id"] == "slurm-11/main"


def test_damaged_run_records_are_named_and_the_rest_listed(tmp_path, capsys):
    make_runs(tmp_path)
    records = sorted(tmp_path.rglob("run.json"))
    assert len(records) == 2
    records[0].write_text('{"id": "cut')                 # a writer killed mid-file
    (tmp_path / "x" / "y").mkdir(parents=True)
    (tmp_path / "x" / "y" / "run.json").write_bytes(b"\xff\xfe")  # not text at all
    code, out, err = cli(capsys, "runs", str(tmp_path))
    assert code == 0 and "bigger-lr" in out and "baseline" not in out
    assert err.splitlines() == [
        f"slurmgen: warning: skipped a damaged run record: {records[0]} is damaged "
        "(not valid JSON: Unterminated string starting at: line 1 column 8 (char 7))",
        f"slurmgen: warning: skipped a damaged run record: {tmp_path}/x/y/run.json is damaged (not UTF-8 text)"]
    code, _, err = cli(capsys, "plot", str(records[0].parent))
    assert code == 2 and err == (f"slurmgen: error: plot: {records[0]} is damaged "
                                 "(not valid JSON: Unterminated string starting at: line 1 column 8 (char 7))\n")
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
        rgb = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        return int((abs(pixels - rgb).max(axis=-1) < 0.05).sum())

    assert count("#1f77b4") > 1500 and count("#d62728") > 300  # the train and val curves are really there
    code, _, err = cli(capsys, "plot", str(tmp_path / "slurm-11" / "main"), "-o", str(tmp_path / "lr.png"), "-m", "lr")
    assert code == 0 and png_size(tmp_path / "lr.png")[0] < width  # one panel: narrower


def test_plot_errors(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    make_runs(tmp_path)
    code, _, err = cli(capsys, "plot", "nope", "--dir", str(tmp_path))
    assert code == 2 and err == f"slurmgen: error: plot: no run 'nope': not a run directory, nor an id, name or group under '{tmp_path}'\n"
    code, _, err = cli(capsys, "plot", "main", "--dir", str(tmp_path))  # two runs have job type main, but not that name
    assert code == 2
    code, _, err = cli(capsys, "plot", "baseline", "--dir", str(tmp_path), "-m", "accuracy")
    assert code == 2 and "has no metrics to plot among accuracy (have: loss, lr)" in err


def test_plot_without_matplotlib_is_one_line_exit_2(tmp_path):
    make_runs(tmp_path)
    probe = ("import sys; sys.modules['matplotlib'] = None\n"
             "from slurmgen.cli import main\n"
             f"main(['plot', 'baseline', '--dir', {str(tmp_path)!r}])")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == ("slurmgen: error: plot: needs matplotlib, which is not installed "
                           "(hint: pip install 'slurmgen[plot]')\n")
