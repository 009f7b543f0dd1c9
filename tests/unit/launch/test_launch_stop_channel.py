"""A running launch stopped through its stop channel (runs/stop_request.py), as the page's Stop
button and `slurmgen cancel LAUNCH_ID` do: every rank stops as on SIGTERM, the verdict and the
registry say "stopped by you", and the channel refuses what it cannot stop, with the reason.
Every 'host' is this machine (the same launch over the test cluster's sshd: tests/integration/web)."""

from __future__ import annotations

import io
import os
import threading
import time

from helpers import PY, SLEEPER, alive, kill_local_nodes, local_connector, local_plan, pids

from slurmgen.contract import exitcodes
from slurmgen.contract.states import STOPPED_BY_YOU, State
from slurmgen.launch.fanout import Launcher
from slurmgen.launch.registry_entry import LaunchRecord
from slurmgen.runs import stop_request
from slurmgen.runs.model import Recorder, attempts_of, get_row, list_rows
from slurmgen.runs.registry import Registry
from slurmgen.ssh.connect import SSHOptions


def _row(path):
    with Registry.open(path) as reg:
        row = list_rows(reg, kinds=["launch"])[0]
        return get_row(reg, row["seq"]), attempts_of(reg, row["seq"])


def test_a_stop_request_stops_every_rank_and_is_recorded_as_stopped_by_user(tmp_path):
    path = tmp_path / "state" / "jobs.sqlite"
    plan = local_plan(tmp_path, [PY, "-c", SLEEPER], slots=(1, 1), max_restarts=2)
    plan.env.update({"SLURMGEN_LAUNCH_ID": "L7", "SLURMGEN_GROUP": "launch-L7"})
    record = LaunchRecord.start(Recorder(path), plan, "exp", [PY, "-c", SLEEPER])
    row, _ = _row(path)
    assert row["info"]["stop_file"] == str(tmp_path / "state" / "control" / "launch-L7.stop")
    assert (tmp_path / "state" / "control").stat().st_mode & 0o777 == 0o700
    assert stop_request.why_not(row) is None

    made: dict = {}
    out, err = io.StringIO(), io.StringIO()
    launcher = Launcher(
        plan,
        SSHOptions(),
        out=out,
        err=err,
        colour=False,
        record=record,
        connector=local_connector(made, {"RUN_FOR": "60"}),
    )
    asked: dict = {}

    def stopper() -> None:  # the page's side, while the launcher runs in this (the main) thread
        deadline = time.monotonic() + 20
        while len(pids(out.getvalue())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        asked["taken"], asked["said"] = stop_request.request(row, "from a test")

    thread = threading.Thread(target=stopper)
    thread.start()
    try:
        code = launcher.run()
        thread.join(10)
        record.ended(code, bool(launcher.signals) and launcher.first_failure is None)
    finally:
        kill_local_nodes(made)
    taken, said = asked["taken"], asked["said"]
    assert taken and said == f"launch L7: the launcher is stopping every rank on every node ({STOPPED_BY_YOU})"
    assert code == exitcodes.TERMINATED, err.getvalue()
    assert f"stopping all nodes: {STOPPED_BY_YOU} from a test" in err.getvalue()
    assert f"{STOPPED_BY_YOU} from a test, exit code 143" in err.getvalue()  # the summary's title
    assert not any(alive(p) for p in pids(out.getvalue()))
    assert len(made["h0"].procs) == 1, "a stop is not a failure: no restart"
    row, attempts = _row(path)
    assert (row["state"], row["last_exit"], row["failure"]["cause"]) == (
        "stopped",
        143,
        f"{STOPPED_BY_YOU} from a test",
    )
    assert [(a["state"], a["cause"]) for a in attempts] == [("stopped", f"{STOPPED_BY_YOU} from a test")]
    assert not os.path.exists(row["info"]["stop_file"])
    assert stop_request.why_not(row) == "the launch has ended (stopped by you)"


def test_the_channel_names_why_it_cannot_stop_a_run(tmp_path):
    mine = {
        "kind": "launch",
        "job_id": "L1",
        "state": "running",
        "cluster": os.uname().nodename,
        "info": {"pid": os.getpid(), "stop_file": str(tmp_path / "control" / "launch-L1.stop")},
    }
    assert (
        stop_request.why_not({**mine, "kind": "slurm"})
        == "only an SSH launch or a coordinator group's run has a stop channel"
    )
    assert (
        stop_request.why_not({**mine, "cluster": "elsewhere"})
        == "the launch was started on elsewhere, not on this machine"
    )
    assert stop_request.why_not({**mine, "info": {"pid": os.getpid()}}).startswith(
        "this launch was started by a slurmgen without"
    )
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    assert (
        stop_request.why_not({**mine, "info": {**mine["info"], "pid": dead}})
        == f"its launcher (pid {dead}) is no longer running"
    )
    # a launcher that never takes the request (hung, or gone without a trace): the stopper says so
    (tmp_path / "control").mkdir()
    taken, said = stop_request.request(mine, "from a test", wait=0.2)
    assert not taken and said.startswith(
        f"launch L1: its launcher (pid {os.getpid()}) did not take the stop request within 0.2 s"
    )
    assert stop_request.take(tmp_path / "control" / "launch-L1.stop") == f"{STOPPED_BY_YOU} from a test"
    assert stop_request.take(tmp_path / "control" / "launch-L1.stop") is None  # taken once


def test_slurmgen_cancel_of_a_launch_id_uses_the_channel(tmp_path, capsys):
    from helpers import run as run_cli

    from slurmgen.runs.model import NewRun, add_run, end_run

    path = tmp_path / "jobs.sqlite"
    stop = stop_request.stop_file(path, "L9")
    stop_request.prepare(stop)
    with Registry.open(path, create=True) as reg:
        add_run(reg, NewRun("launch", "L9", "exp", "/w", 1, 1, info={"pid": os.getpid(), "stop_file": str(stop)}), 1.0)
        ended = add_run(
            reg, NewRun("launch", "L8", "exp", "/w", 1, 1, info={"pid": os.getpid(), "stop_file": str(stop)}), 1.0
        )
        end_run(reg, ended, State.SUCCEEDED, 0, None, 2.0)
    taken: list = []

    def launcher() -> None:
        deadline = time.monotonic() + 5
        while not taken and time.monotonic() < deadline:
            taken.append(stop_request.take(stop)) if stop.exists() else time.sleep(0.02)

    thread = threading.Thread(target=launcher)
    thread.start()
    code, out, _ = run_cli(capsys, "cancel", "L9", "--registry", str(path))
    thread.join()
    assert (code, taken) == (0, [f"{STOPPED_BY_YOU} with slurmgen cancel"])
    assert out == f"launch L9: the launcher is stopping every rank on every node ({STOPPED_BY_YOU})\n"
    code, out, _ = run_cli(capsys, "cancel", "L8", "--registry", str(path))
    assert (code, out) == (1, "launch L8 was not stopped: the launch has ended (succeeded)\n")


def test_the_launcher_never_takes_a_request_before_its_text(tmp_path):
    """A launcher that looked between the stopper's create and write took an empty request and
    recorded "a stop request" instead of who asked (seen once in a unit run on a loaded machine).
    Here the launcher's side looks without pause while 100 requests are written."""
    stop = stop_request.stop_file(tmp_path / "jobs.sqlite", "L1")
    stop_request.prepare(stop)
    row = {"kind": "launch", "job_id": "L1", "state": "running", "info": {"pid": os.getpid(), "stop_file": str(stop)}}
    taken: list[str] = []
    done = threading.Event()

    def launcher() -> None:
        while not done.is_set():
            text = stop_request.take(stop)
            if text is not None:
                taken.append(text)

    thread = threading.Thread(target=launcher)
    thread.start()
    try:
        for _ in range(100):
            assert stop_request.request(row, "with slurmgen cancel")[0]
    finally:
        done.set()
        thread.join()
    assert set(taken) == {f"{STOPPED_BY_YOU} with slurmgen cancel"} and len(taken) == 100
    assert list(stop.parent.iterdir()) == []  # no temporary file left
