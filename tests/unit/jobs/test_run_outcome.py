"""Issue 33: "Exit / first failure" showed 75 or 143 for a run a person stopped, as a failure, and a
cancel read "stopped by user" in one view and "stopped by you" in the rest. One rule
(runs/outcome.py) says how a run's end reads, and every view applies it: the run page and the runs
list, `slurmgen status`, `slurmgen jobs --json`."""

from __future__ import annotations

import json

import pytest
from helpers import run as run_cli

from slurmgen.contract.states import STOPPED_BY_YOU, State
from slurmgen.runs.model import Failure, NewRun, Recorder, list_rows
from slurmgen.runs.outcome import failure_of, outcome, stop_of, stopped_by_you
from slurmgen.runs.registry import Registry

FAILED = {"rank": 3, "node": "node2", "code": 1, "cause": "rank 3 exited with code 1"}
STOP = {"rank": None, "node": None, "code": 143, "cause": f"{STOPPED_BY_YOU} from the page"}


@pytest.mark.parametrize(
    ("state", "code", "failure", "said"),
    [
        ("failed", 1, FAILED, "1 — rank 3 on node2 code 1 (rank 3 exited with code 1)"),
        ("failed", None, {"cause": "node lost"}, "node lost"),
        ("succeeded", 0, None, "0"),
        ("running", None, None, "—"),
        # a person's stop: its words, its raw code beside them, never "143 — ..." as a failure
        ("stopped", 143, STOP, "stopped by you from the page (exit code 143)"),
        ("stopped", 75, None, "stopped by you (exit code 75)"),  # a Slurm job's checkpoint and stop
        ("stopped", None, {"cause": "killed"}, "stopped by you"),  # a cause of other words is not repeated
        # a stop still being carried out has not ended: nothing to say of its end yet
        ("stopping", None, None, "—"),
    ],
)
def test_a_runs_end_reads_by_one_rule(state, code, failure, said):
    assert outcome(state, code, failure) == said


def test_a_stop_is_no_failure_but_keeps_its_code():
    assert stopped_by_you(State.STOPPED.value) and not stopped_by_you(State.STOPPING.value)
    assert not stopped_by_you(State.FAILED.value) and not stopped_by_you(None)
    assert failure_of("stopped", STOP) is None and failure_of("failed", FAILED) == FAILED
    assert stop_of("stopped", 143, STOP) == {"what": "stopped by you from the page", "exit_code": 143}
    assert stop_of("failed", 1, FAILED) is None


def stopped_launch(path) -> None:
    """A launch stopped from the page, recorded as the launcher records it (launch/registry_entry.py)."""
    recorder = Recorder(path)
    run = recorder.started(NewRun(kind="launch", key="L1", name="exp", workdir="/w", nodes=2, ranks=4))
    recorder.attempt_started(run, 1)
    stop = Failure(cause=f"{STOPPED_BY_YOU} from the page", code=143)
    recorder.attempt_ended(run, 1, State.STOPPED, stop)
    recorder.ended(run, State.STOPPED, 143, stop)


def test_status_and_jobs_json_say_a_stopped_launch_as_the_page_does(tmp_path, capsys):
    path = tmp_path / "r.sqlite"
    stopped_launch(path)
    code, out, err = run_cli(capsys, "status", "L1", "--registry", str(path))
    assert code == 0, err
    assert "  stopped: stopped by you from the page\n" in out and "first failure" not in out, out
    code, out, err = run_cli(capsys, "status", "L1", "--registry", str(path), "--json")
    view = json.loads(out)
    assert (view["failure"], view["exit_code"]) == (None, 143), view
    assert view["stopped"] == {"what": "stopped by you from the page", "exit_code": 143}
    code, out, err = run_cli(capsys, "jobs", "--registry", str(path), "--json")
    (row,) = json.loads(out)
    assert row["first_failure"] is None and row["stopped"] == view["stopped"] and row["exit_code"] == 143, row


def test_the_runs_list_and_the_run_page_read_one_cell(tmp_path):
    """The list's "Exit / first failure" cell (and the run page's, the same run_view) for the stop."""
    from slurmgen.coordinator.web.runs_page import run_view

    stopped_launch(tmp_path / "r.sqlite")
    with Registry.open(tmp_path / "r.sqlite") as reg:
        (row,) = list_rows(reg)
    view = run_view(row, 0.0)
    assert (view["state_text"], view["outcome"]) == ("stopped by you", "stopped by you from the page (exit code 143)")
