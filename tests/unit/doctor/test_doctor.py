"""slurmgen doctor: the comparison (pure), the probe's own checks on this machine, the command."""

import os
import signal
import socket
import threading

import pytest
from helpers import free_port, run

from slurmgen.doctor.cli import preempt_signal
from slurmgen.doctor.compare import BAD, NA, OK, compare
from slurmgen.doctor.nodes import probe_args
from slurmgen.doctor.probe import Arrival, ProbeOptions, parse_args, port_check, tree_hash
from slurmgen.errors import SlurmgenError


def row(node, **over):
    base = {
        "node": node,
        "python": "3.11.7",
        "torch": "2.13.0",
        "cuda": "12.4",
        "nccl": "2.21.5",
        "gpus": 8,
        "files": {"hash": "aaaa", "count": 3},
        "master": {"addr": "n1", "ip": "10.0.0.1", "error": None},
        "port": {"ok": True, "listener": node == "n1", "error": None},
        "disk": {"ok": True, "free_gb": 900.0, "error": None},
        "signal": {"ok": True, "name": "USR2", "error": None},
    }
    return {**base, **over}


def test_nodes_that_agree_pass():
    verdict = compare([row("n1"), row("n2"), row("n3")])
    assert verdict.ok and verdict.problems == []
    assert {m.state for marks in verdict.marks.values() for m in marks.values()} == {OK}
    assert verdict.marks["n1"]["port"].text == "ok (listener)"


def test_the_odd_node_out_is_marked_and_named():
    verdict = compare([row("n1"), row("n2", torch="2.12.0", files={"hash": "bbbb"}), row("n3")])
    assert verdict.problems == [
        "torch differs across nodes: 2.13.0 on n1, n3; 2.12.0 on n2",
        "files differs across nodes: aaaa on n1, n3; bbbb on n2",
    ]
    assert [verdict.marks[n]["torch"].state for n in ("n1", "n2", "n3")] == [OK, BAD, OK]
    assert (verdict.marks["n2"]["files"].state, verdict.marks["n2"]["files"].text) == (BAD, "bbbb")


def test_a_tie_marks_every_side_and_a_missing_torch_differs():
    verdict = compare([row("n1"), row("n2", torch=None, cuda=None, nccl=None, gpus=None)])
    assert verdict.marks["n1"]["torch"].state == verdict.marks["n2"]["torch"].state == BAD
    assert "torch differs across nodes: 2.13.0 on n1; none on n2" in verdict.problems
    assert len(verdict.problems) == 4  # torch, cuda, nccl, gpus


def test_per_node_checks_fail_alone_and_absent_ones_are_not_applicable():
    blocked = {"ok": False, "listener": False, "error": "10.0.0.1:29500 unreachable within 3 s: timed out"}
    rows = [
        row("n1", signal=None),
        row("n2", port=blocked, signal=None, disk={"ok": False, "free_gb": 0.2, "error": "0.2 GB free in out, want 1"}),
    ]
    verdict = compare(rows)
    assert verdict.problems == [
        "port on n2: 10.0.0.1:29500 unreachable within 3 s: timed out",
        "disk on n2: 0.2 GB free in out, want 1",
    ]
    assert (verdict.marks["n2"]["port"].state, verdict.marks["n1"]["port"].state) == (BAD, OK)
    assert verdict.marks["n1"]["signal"].state == NA


def test_files_that_cannot_be_hashed_are_a_problem_even_on_one_node():
    verdict = compare([row("n1", files={"hash": None, "error": "no such file or directory: train.py"})])
    assert verdict.problems == ["files on n1: no such file or directory: train.py"]
    assert verdict.marks["n1"]["files"].state == BAD


def test_a_node_without_a_row_is_a_problem():
    verdict = compare([row("n1"), {"node": "n2", "error": "the probe exited 127: python3: not found"}])
    assert verdict.problems[0] == "n2: the probe exited 127: python3: not found"
    assert not verdict.ok


def test_tree_hash_follows_content_and_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    (tmp_path / "out").mkdir()
    first = tree_hash(("src",))
    assert first["count"] == 1 and len(first["hash"]) == 12
    (tmp_path / "out" / "log").write_text("changes all the time")
    assert tree_hash((), skip="out") == tree_hash((), skip="out")  # not a git tree: a walk without out/
    assert tree_hash(("src",)) == first
    (tmp_path / "src" / "a.py").write_text("x = 2\n")
    assert tree_hash(("src",))["hash"] != first["hash"]
    assert tree_hash(("nope",)) == {"hash": None, "error": "no such file or directory: nope"}


def test_port_check_between_two_probes_and_against_a_stranger():
    port = free_port()
    results = []
    probes = [threading.Thread(target=lambda: results.append(port_check("127.0.0.1", port, 2, 5.0))) for _ in range(2)]
    for t in probes:
        t.start()
    for t in probes:
        t.join()
    assert [r["ok"] for r in results] == [True, True], results
    (listener,) = [r for r in results if r["listener"]]
    assert len(listener["heard"]) == 2
    # Another program holds the port and does not speak the protocol.
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        result = port_check("127.0.0.1", stranger.getsockname()[1], 1, 0.5)
    assert not result["ok"] and "unreachable within 0.5 s" in result["error"], result


def test_probe_arguments_round_trip():
    opts = ProbeOptions(
        files=("a", "b c"),
        out_dir="out",
        min_free_gb=2.5,
        master_addr="n1",
        master_port=29500,
        nodes=4,
        port_timeout=3.0,
        signal="USR1",
        signal_wait=5.0,
    )
    assert parse_args(probe_args(opts)) == opts
    assert parse_args(probe_args(ProbeOptions())) == ProbeOptions()


@pytest.mark.parametrize(
    "args, words",
    [
        (["--hosts", "a", "--hostfile", "h"], "give one of --hosts and --hostfile"),
        (["--master-port", "70000"], "master_port: must be a port number 1-65535 (got 70000)"),
        (["--port-timeout", "0"], "port_timeout: must be more than 0 seconds (got 0)"),
        (["--signal", "TERM"], "signal: expected USR2 or USR1 (got 'TERM')"),
        (["--config", "/nonexistent.yaml"], "config: cannot read '/nonexistent.yaml'"),
    ],
)
def test_doctor_rejects_bad_flags(capsys, args, words):
    code, _, err = run(capsys, "doctor", *args)
    assert code == 2 and words in err


def test_the_signal_checked_is_the_one_the_spec_uses(tmp_path):
    assert preempt_signal(None, None) == "USR2"  # the spec's default, as run_slurm.sh sends it
    spec = tmp_path / "job.yaml"
    spec.write_text("nodes: 2\npreempt_signal: USR1\n")
    assert preempt_signal(spec, None) == "USR1"
    assert preempt_signal(spec, "sigusr2") == "USR2"  # --signal wins, in either spelling
    with pytest.raises(SlurmgenError, match="signal: expected USR2 or USR1"):
        preempt_signal(None, "KILL")


@pytest.mark.parametrize("sent, arrived", [("USR2", True), ("USR1", False), (None, False)])
def test_the_probe_notes_only_the_signal_it_was_told_to_wait_for(sent, arrived):
    # A real signal to this process; USR1 (caught here, as NCCL may) is not the USR2 it waits for.
    saved = {name: signal.getsignal(signal.Signals["SIG" + name]) for name in ("USR1", "USR2")}
    try:
        signal.signal(signal.SIGUSR1, lambda *_: None)
        arrival = Arrival("USR2")
        if sent:
            os.kill(os.getpid(), signal.Signals["SIG" + sent])
        result = arrival.result(0.3)
    finally:
        for name, handler in saved.items():
            signal.signal(signal.Signals["SIG" + name], handler)
    assert (result["ok"], result["name"]) == (arrived, "USR2"), result
    assert result["error"] == (None if arrived else "no USR2 arrived within 0.3 s")
