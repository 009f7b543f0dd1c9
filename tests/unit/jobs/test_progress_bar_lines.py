"""A progress bar in a rank's log (issue 34, item 2): tqdm (and Lightning's and transformers' bars,
which are tqdm's) redraws in place, each update after a "\\r", and ends its line with "\\n" only
when it closes. The log's line is the whole bar: split at "\\r" its pieces lost the `[rank R]`
label and `logs --rank R` dropped them. The bytes here are tqdm's own, run in the test (helpers.tqdm_bar);
srun's label is put before each line as `srun --label` does, the torchrun worker's tag by run_slurm.sh's
own `sed` command."""

from __future__ import annotations

import subprocess

from helpers import run, srun_label, tqdm_bar

from slurmgen.runs.log_lines import log_lines, shown
from slurmgen.runs.registry import JobRecord, Registry


def rank_tag(rank: int, text: str) -> str:
    """run_slurm.sh's torchrun worker tag, by the same sed command."""
    done = subprocess.run(["sed", "-u", f"s/^/[rank {rank}] /"], input=text.encode(), capture_output=True, check=True)
    return done.stdout.decode()  # not text=True, whose universal newlines would turn each "\r" into a line end


def record(tmp_path, launcher: str) -> JobRecord:
    info = {"log_dir": str(tmp_path / "logs"), "workdir": str(tmp_path), "command": ["x"], "array": None}
    return JobRecord(
        "1", "rec", str(tmp_path / "out"), 1.0, None, None, None, {**info, "nodes": 2, "gpus": 2, "launcher": launcher}
    )


def logs(capsys, tmp_path, text: str, *args: str, launcher: str = "srun") -> tuple[int, list[str], str]:
    """`slurmgen logs 1 ARGS` of a job whose log holds `text`: (exit code, its lines, stderr)."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rec-1.out").write_bytes(text.encode())
    path = tmp_path / "jobs.sqlite"
    with Registry.open(path, create=True) as reg:
        reg.add(record(tmp_path, launcher))
    code, out, err = run(capsys, "logs", "1", "--registry", str(path), *args)
    return code, out.split("\n")[:-1], err


def test_the_bytes_are_tqdms_a_line_of_updates_after_carriage_returns():
    bar = tqdm_bar()
    assert bar.startswith("\rEpoch 0:   0%") and bar.count("\n") == 3 and bar.count("\r") >= 4
    assert len(bar.splitlines()) > 3  # what split the line before


def test_a_line_ends_at_a_newline_only_and_shows_as_a_terminal_leaves_it():
    first, warned, last = log_lines(tqdm_bar())
    assert shown(first).startswith("Epoch 0:  50%|") and shown(first).endswith("prog.py:12: UserWarning: lr is large")
    assert shown(warned) == "  warnings.warn('lr is large')"
    assert shown(last).startswith("Epoch 0: 100%|") and "4/4" in shown(last)
    assert shown("done\r") == "done"  # a CRLF line end
    assert shown("\r 50%|#####|\r          \rEpoch 1 done") == "Epoch 1 done"  # a bar that cleared itself
    assert log_lines("a\fb\x1cc\u2028d\n") == ["a\fb\x1cc\u2028d"]
    assert log_lines("") == [] and log_lines("cut") == ["cut"]


def test_logs_of_a_rank_keep_its_progress_bar_and_the_warning_after_it(tmp_path, capsys):
    log = "slurmgen: job 1 starts\n" + srun_label(0, tqdm_bar()) + "1: rank 1 has no bar\n"
    code, out, err = logs(capsys, tmp_path, log, "--rank", "0")
    assert code == 0, err
    assert len(out) == 3 and all(line.startswith("[rank 0] Epoch 0: ") or "warnings.warn" in line for line in out)
    assert "| 2/4 [" in out[0] and out[0].endswith("]prog.py:12: UserWarning: lr is large")
    assert out[1] == "[rank 0]   warnings.warn('lr is large')" and "| 4/4 [" in out[2]
    assert not any("\r" in line for line in out)


def test_torchrun_worker_lines_keep_their_rank_through_a_progress_bar(tmp_path, capsys):
    log = srun_label(1, rank_tag(3, tqdm_bar())) + srun_label(1, "W1125 torchrun says\n")
    code, out, err = logs(capsys, tmp_path, log, "--rank", "3", launcher="torchrun")
    assert code == 0, err
    assert [line[:19] for line in out] == ["[rank 3] Epoch 0:  ", "[rank 3]   warnings", "[rank 3] Epoch 0: 1"]
    assert "UserWarning: lr is large" in out[0]
