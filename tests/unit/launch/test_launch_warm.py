"""Warm restarts under `slurmgen launch --restart-mode warm` (contract/warm.py): the state machine's
decisions, the refusals, and the real thing: the bundled trainer on gloo over local "hosts" (real
bash, real bootstrap and node script, real torch.distributed), one rank SIGKILLed mid-run."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from helpers import PY, alive, kill_local_nodes, local_connector, local_plan, still_running
from helpers import run as run_cli

from slurmgen.contract import envvars, exitcodes, warm
from slurmgen.contract.hangs import beat_limit
from slurmgen.contract.node_events import NodeEvent
from slurmgen.errors import SlurmgenError
from slurmgen.generate.preflight import warm_refusal
from slurmgen.launch import attempt as m
from slurmgen.launch.display import NodeResult
from slurmgen.launch.fanout import Launcher
from slurmgen.observe.heartbeat import STARTING, Heartbeat, read_heartbeats
from slurmgen.ssh.connect import SSHOptions
from slurmgen.train import warm as train_warm

LIMITS = m.Limits(connect=10, keepalive=5, keepalive_count=3, stop_grace=1, stop_wait=5)


# ---- the state machine -------------------------------------------------------------------------
def warm_state(budget: int = 2) -> m.AttemptState:
    nodes = [NodeResult(h, i, str(i)) for i, h in enumerate(("a", "b"))]
    s = m.initial(nodes, 1, 100.0, 90.0, 2, LIMITS, m.WarmPlan(budget, "10.0.0.1", 29500))
    for h in ("a", "b"):
        s, _ = m.step(s, m.SessionOpened(h, 100.1))
        s, _ = m.step(s, m.Reported(h, NodeEvent("started"), 101.0))
    return s


def exited(host: str, rank: int, code: int, at: float) -> m.Reported:
    return m.Reported(host, NodeEvent("exited", rank, code), at)


def test_a_failed_rank_orders_a_new_world_and_stops_nothing():
    s, actions = m.step(warm_state(), exited("b", 1, 137, 110.0))
    worlds = [a for a in actions if isinstance(a, m.NewWorld)]
    told = "warm restart 1: rank 1 started anew after rank 1 exited with code 137 on b"
    assert worlds == [m.NewWorld(warm.World(1, "10.0.0.1", 29501, 2), {"b": (1,)}, told)]
    assert not [a for a in actions if isinstance(a, m.CloseStdin)] and s.stop_at is None
    assert s.generation == 1 and s.first is None and s.nodes["b"].state == m.RUNNING
    # The next failure, past the settling time, is the next generation, on the next port.
    s, actions = m.step(s, exited("a", 0, 1, 110.0 + warm.SETTLE + 1))
    assert [a.world.master_port for a in actions if isinstance(a, m.NewWorld)] == [29502]


def test_a_second_failure_right_after_a_new_world_restarts_whole():
    """A program that does not take part: its healthy rank dies of the peer's failure."""
    s, _ = m.step(warm_state(), exited("b", 1, 137, 110.0))
    s, actions = m.step(s, exited("a", 0, 1, 110.5))
    assert s.stop_at == 110.5 and s.first == ("a", "rank 0 exited with code 1")
    assert any(isinstance(a, m.Say) and "restarting whole" in a.text for a in actions)
    assert {a.host for a in actions if isinstance(a, m.CloseStdin)} == {"a", "b"}  # nobody is spared


@pytest.mark.parametrize("budget, code", [(0, 137), (2, 2), (2, 75)])
def test_no_budget_or_a_code_not_worth_a_retry_stops_every_node(budget, code):
    s, actions = m.step(warm_state(budget), exited("b", 1, code, 110.0))
    assert s.stop_at == 110.0 and not [a for a in actions if isinstance(a, m.NewWorld)]


# ---- a rank that waits for the new world ------------------------------------------------------------
def test_a_rank_heartbeats_while_it_waits_for_the_new_world(tmp_path):
    """The trainer's wait (train/warm.py): its beats stay fresh and say "starting", which no watcher
    judges hung (contract/hangs.py), however long the replacement takes to start."""
    beats = tmp_path / "beats"
    environ = {envvars.WARM_DIR: str(tmp_path), envvars.HEARTBEAT_DIR: str(beats)}
    heartbeat = Heartbeat(None, 3, 0.1, environ=environ, timeline=False)
    heartbeat.beat(40, force=True)  # its last step before the peer failed
    seen: list[dict] = []

    def beat() -> None:
        heartbeat.beat(40, status=STARTING)
        seen.append(read_heartbeats(beats)[3])

    began = time.time()
    threading.Timer(0.8, warm_protocol_write, args=(tmp_path,)).start()
    world = train_warm.wait_world(0, environ, timeout=10, beat=beat)
    assert world.generation == 1 and time.time() - began >= 0.8
    assert {b["status"] for b in seen} == {"starting"}
    assert len({b["time"] for b in seen}) >= 5  # a fresh beat every period (0.1 s) of the wait
    assert max(b["time"] for b in seen) > began + 0.6
    assert beat_limit(seen[-1], 0.5) is None  # not judged, though the wait outlasted the timeout


def test_a_spare_given_its_orders_before_it_reads_them_still_gets_them():
    """The node script writes the orders and closes its end at once, maybe while the spare is still
    importing torch: the spare holds the read end from its start (train/spare.py), so the line waits
    in the pipe (a FIFO opened by name after its writer closed would have lost it and hung)."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"3 1 2 10.0.0.9 29502 4\n")
    os.close(write_end)
    code = (
        "import os; print(*(os.environ[k] for k in ('RANK', 'LOCAL_RANK', 'SLURMGEN_WARM_GENERATION', 'WORLD_SIZE')))"
    )
    proc = subprocess.run(
        [PY, "-m", "slurmgen.train.spare", str(read_end), "-c", code],
        pass_fds=(read_end,),
        capture_output=True,
        text=True,
        timeout=120,
    )
    os.close(read_end)
    assert (proc.returncode, proc.stdout) == (0, "slurmgen-spare 3\n3 1 2 4\n"), proc.stderr


def warm_protocol_write(directory: Path) -> None:
    warm.write(str(directory), warm.World(1, "127.0.0.1", 29501, 4))


# ---- what is refused -----------------------------------------------------------------------------
def test_warm_is_refused_for_programs_that_cannot_take_part(tmp_path):
    (tmp_path / "plain.py").write_text("import torch\n")
    (tmp_path / "mine.py").write_text("from slurmgen.train import warm\n")
    assert warm_refusal("warm", [PY, "-m", "slurmgen.train"], str(tmp_path)) is None
    assert warm_refusal("warm", [PY, "mine.py"], str(tmp_path)) is None
    assert warm_refusal("warm", [PY, "only-on-the-nodes.py"], str(tmp_path)) is None  # not knowable here
    assert warm_refusal("cold", ["torchrun", "x.py"], str(tmp_path)) is None
    assert "plain.py does not use slurmgen.train" in (warm_refusal("warm", [PY, "plain.py"], str(tmp_path)) or "")
    assert "the -c code" in (warm_refusal("warm", [PY, "-c", "print(1)"], str(tmp_path)) or "")
    assert "torchrun" in (warm_refusal("warm", ["torchrun", "x.py"], str(tmp_path)) or "")
    assert warm_refusal("hot", [PY, "x.py"], str(tmp_path)) == "restart_mode: must be one of cold, warm (got 'hot')"
    with pytest.raises(SlurmgenError):
        local_plan(tmp_path, [PY, "plain.py"], restart_mode="warm")


def test_warm_asked_of_a_plain_script_is_one_line_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain.py").write_text("print(1)\n")
    code, out, err = run_cli(
        capsys, "launch", "--dry-run", "--hosts", "a,b", "--restart-mode", "warm", "--", "python3", "plain.py"
    )
    assert code == 2 and out == ""
    assert err.strip() == (
        "slurmgen: error: restart_mode: warm needs a program that takes part in it (the bundled trainer, or "
        "slurmgen.train.warm), and plain.py does not use slurmgen.train"
    ), err
    assert "Traceback" not in err


# ---- the real thing ------------------------------------------------------------------------------
def trainer(out: Path, *extra: str) -> list[str]:
    return [
        PY,
        "-m",
        "slurmgen.train",
        "--model",
        "mlp",
        "--mlp-hidden",
        "16",
        "--synthetic-samples",
        "256",
        "--progress",
        "lines",
        "--heartbeat-every",
        "0.2",
        "--threads",
        "1",
        "--out-dir",
        str(out),
        *extra,
    ]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


AGAIN = re.compile(
    r"\[rank (\d+)\] warning: warm restart: generation 1 stepping again at step (\d+), .* \(at ([\d.]+)\)"
)


def fault(out_dir: Path, out: io.StringIO, seen: dict) -> None:
    """Thread: once a checkpoint is written, SIGKILL rank 2 and note every rank's pid before and after."""
    try:
        wait_for(lambda: list((out_dir / "checkpoints").glob("ckpt-*.pt")), 120, "a checkpoint")
        beats = wait_for(lambda: (b := read_heartbeats(out_dir / "heartbeats")) and len(b) == 3 and b, 30, "3 beats")
        seen["before"] = {rank: beat["pid"] for rank, beat in beats.items()}
        seen["killed_at"] = time.time()
        os.kill(seen["before"][2], signal.SIGKILL)  # rank 2, on h1 beside the healthy rank 1
        seen["again"] = wait_for(lambda: len(found := AGAIN.findall(out.getvalue())) == 3 and found, 120, "3 ranks")
        beats = wait_for(
            lambda: (
                (b := read_heartbeats(out_dir / "heartbeats")) and 2 in b and b[2]["pid"] != seen["before"][2] and b
            ),
            30,
            "the fresh rank 2's beat",
        )
        seen["after"] = {rank: beat["pid"] for rank, beat in beats.items()}
    except AssertionError as exc:
        seen["error"] = str(exc)


def test_sigkill_of_a_rank_is_recovered_warm_the_healthy_ranks_keep_their_processes(tmp_path):
    out_dir = tmp_path / "run"
    plan = local_plan(
        tmp_path,
        trainer(out_dir, "--max-steps", "600", "--save-every", "20", "--log-every", "50"),
        slots=(1, 2),
        max_restarts=1,
        restart_mode="warm",
    )
    out, err, made, seen = io.StringIO(), io.StringIO(), {}, {}
    launcher = Launcher(plan, SSHOptions(), out=out, err=err, colour=False, connector=local_connector(made))
    threading.Thread(target=fault, args=(out_dir, out, seen), daemon=True).start()
    try:
        code = launcher.run()
    finally:
        kill_local_nodes(made)
    text, said = out.getvalue(), err.getvalue()
    assert code == 0 and "error" not in seen and "after" in seen, (seen, said, text[-3000:])
    pids, after, again = seen["before"], seen["after"], seen["again"]
    # The healthy ranks are the same processes (no new interpreter); rank 2 is a new one.
    assert after[0] == pids[0] and after[1] == pids[1] and after[2] != pids[2], (pids, after)
    assert re.search(r"rank 2 exited with code 137 on h1: warm restart 1 of at most 1", said), said
    assert "starting all nodes again" not in said
    # Rank 2 goes on in the node's warm spare (torch already imported), not a new interpreter.
    assert "[h1] rank 2 goes on in the warm spare, generation 1 (warm restart)" in text, text[-3000:]
    # The steps go on from the checkpoint, on every rank at the same step.
    resumed = re.findall(r"\[rank (\d)\] warning: warm restart: joined generation 1, resumed from \S+ at step", text)
    assert sorted(resumed) == ["0", "1"], text[-3000:]
    steps = {int(step) for _, step, _ in again}
    assert len(steps) == 1 and min(steps) > 20
    assert "done: step 600" in text
    metrics = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in metrics) == 600
    # The time from the fault to every rank stepping again.
    recovered = max(float(at) for _, _, at in again) - seen["killed_at"]
    print(f"warm restart: fault to every rank stepping again {recovered:.2f} s")
    assert recovered < 30, f"{recovered:.1f}s"
    # Nothing is left running.
    assert not still_running({*pids.values(), *after.values()})
    for conn in made.values():
        assert all(proc.popen.poll() is not None for proc in conn.procs)


def spares_of(out_dir: Path) -> set[int]:
    """The warm spare processes of this run (promoted or not): their command line names its out dir."""
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"slurmgen.train.spare" in argv and str(out_dir).encode() in argv and alive(int(proc.name)):
            found.add(int(proc.name))
    return found


def imported_torch(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def kill_rank_2(out_dir: Path, out: io.StringIO, generation: int) -> dict:
    """SIGKILL rank 2 (on h1); wait for every rank stepping in the new generation and for h1's new
    spare to have torch imported."""
    beats = wait_for(lambda: (b := read_heartbeats(out_dir / "heartbeats")) and len(b) == 3 and b, 30, "3 beats")
    fault = {"spares": spares_of(out_dir), "rank2": beats[2]["pid"], "killed_at": time.time()}
    os.kill(fault["rank2"], signal.SIGKILL)
    again = re.compile(
        rf"\[rank \d+\] warning: warm restart: generation {generation} stepping again .* \(at ([\d.]+)\)"
    )
    found = wait_for(lambda: len(f := again.findall(out.getvalue())) == 3 and f, 120, f"generation {generation}")
    fault["again"] = max(float(at) for at in found) - fault["killed_at"]
    new = fault["new"] = wait_for(lambda: spares_of(out_dir) - fault["spares"], 30, "a new spare")
    wait_for(lambda: all(imported_torch(p) for p in new), 120, "the new spare's import")
    return fault


def kill_twice(out_dir: Path, out: io.StringIO, launcher: Launcher, seen: dict) -> None:
    """Thread: once a checkpoint is written, two faults of rank 2 (kill_rank_2), the second past the
    first's settling time (a sooner fault restarts whole); then stop the run at once: a stop is no
    fault, whenever it comes (launch/attempt.py judges exits after it as stopped)."""
    try:
        wait_for(lambda: list((out_dir / "checkpoints").glob("ckpt-*.pt")), 120, "a checkpoint")
        seen[1] = kill_rank_2(out_dir, out, 1)
        time.sleep(max(0.0, seen[1]["killed_at"] + warm.SETTLE + 1 - time.time()))
        seen[2] = kill_rank_2(out_dir, out, 2)
        # The promoted spare's own beat: right after its first step the file may still be the
        # killed process's (a beat every interval, not every step).
        seen["rank2"] = wait_for(
            lambda: (pid := read_heartbeats(out_dir / "heartbeats")[2]["pid"]) != seen[2]["rank2"] and pid,
            30,
            "the new rank 2's beat",
        )
    except AssertionError as exc:
        seen["error"] = str(exc)
    launcher.signals.append((signal.SIGTERM, ""))


def test_a_used_warm_spare_is_replaced_so_the_next_fault_on_its_node_finds_one_too(tmp_path):
    """Issue 35: after its spare was promoted a node had none, so its later faults started fresh
    processes (interpreter and `import torch` again). Two successive SIGKILLs of rank 2 on h1: both
    recovered by a spare, the second by the one started when the first was promoted."""
    out_dir = tmp_path / "run"
    plan = local_plan(
        tmp_path,
        trainer(out_dir, "--max-steps", "100000", "--save-every", "20", "--log-every", "50"),
        slots=(1, 2),
        max_restarts=2,
        restart_mode="warm",
    )
    out, err, made, seen = io.StringIO(), io.StringIO(), {}, {}
    launcher = Launcher(plan, SSHOptions(), out=out, err=err, colour=False, connector=local_connector(made))
    threading.Thread(target=kill_twice, args=(out_dir, out, launcher, seen), daemon=True).start()
    try:
        code = launcher.run()
    finally:
        kill_local_nodes(made)
    text, said = out.getvalue(), err.getvalue()
    assert "error" not in seen and "rank2" in seen, (seen, said, text[-3000:])
    assert code == exitcodes.TERMINATED, (code, said)
    for generation in (1, 2):
        assert f"[h1] rank 2 goes on in the warm spare, generation {generation} (warm restart)" in text, text[-3000:]
        assert f"rank 2 exited with code 137 on h1: warm restart {generation} of at most 2" in said, said
    assert "starting rank 2 anew" not in text and "starting all nodes again" not in said
    # The first spare became rank 2 (then killed); the one started after it became rank 2 next.
    assert seen[1]["rank2"] not in seen[1]["spares"] and seen[2]["rank2"] in seen[1]["spares"], seen
    assert seen["rank2"] in seen[1]["new"] and len(seen[1]["new"]) == 1, seen
    print(
        "warm restart with a spare: fault to every rank stepping again "
        + ", ".join(f"{seen[g]['again']:.2f} s (fault {g})" for g in (1, 2))
    )
    # Nothing is left running, spares included (h0's unused one, h1's third).
    assert not still_running(spares_of(out_dir))
    assert not still_running((seen[1]["rank2"], seen[2]["rank2"], seen["rank2"]))
    for conn in made.values():
        assert all(proc.popen.poll() is not None for proc in conn.procs)


SHY = """
import os, sys, time
rank, attempt = os.environ["RANK"], os.environ["SLURMGEN_ATTEMPT"]
print("PID", os.getpid(), "rank", rank, "generation", os.environ.get("SLURMGEN_WARM_GENERATION", "0"), flush=True)
if attempt == "1" and os.environ.get("SLURMGEN_WARM_GENERATION") is None:
    time.sleep(0.5 if rank == "1" else 1.0)
    sys.exit(7 if rank == "1" else 1)  # rank 1 fails; rank 0 dies of it, as a program that does not take part
time.sleep(0.3 if attempt != "1" else 30)
"""


def test_a_program_that_does_not_take_part_is_restarted_whole(tmp_path):
    (tmp_path / "shy.py").write_text(SHY)
    plan = local_plan(tmp_path, [PY, "-m", "shy"], slots=(1, 1), max_restarts=2, restart_mode="warm")
    out, err, made = io.StringIO(), io.StringIO(), {}
    env = {"PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"}
    launcher = Launcher(plan, SSHOptions(), out=out, err=err, colour=False, connector=local_connector(made, env))
    try:
        code = launcher.run()
    finally:
        kill_local_nodes(made)
    said = err.getvalue()
    assert code == 0, said + out.getvalue()
    assert "rank 1 exited with code 7 on h1: warm restart 1 of at most 2" in said
    assert re.search(r"rank 0 exited with code 1 on h0 \d\.\ds after warm restart 1: restarting whole", said), said
    assert "attempt 1 of 3 failed (rank 0 exited with code 1 on h0); starting all nodes again" in said


def test_a_warm_restart_is_kept_with_its_attempt_for_the_run_page_and_status(tmp_path):
    """Issue 35: a launch's warm restart showed only in the launcher's lines; the run registry now
    keeps it with its attempt (`slurmgen status` and the run page's attempts read it there)."""
    from slurmgen.jobs.commands import run_lines, run_status
    from slurmgen.launch.registry_entry import LaunchRecord
    from slurmgen.runs.model import Recorder, list_rows, recoveries_of
    from slurmgen.runs.registry import Registry

    (tmp_path / "shy.py").write_text(SHY)
    plan = local_plan(tmp_path, [PY, "-m", "shy"], slots=(1, 1), max_restarts=2, restart_mode="warm")
    plan.env.update({"SLURMGEN_LAUNCH_ID": "L3", "SLURMGEN_GROUP": "launch-L3"})
    registry = tmp_path / "jobs.sqlite"
    record = LaunchRecord.start(Recorder(registry), plan, "shy", [PY, "-m", "shy"])
    out, err, made = io.StringIO(), io.StringIO(), {}
    env = {"PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"}
    launcher = Launcher(
        plan, SSHOptions(), out=out, err=err, colour=False, connector=local_connector(made, env), record=record
    )
    try:
        code = launcher.run()
    finally:
        kill_local_nodes(made)
    record.ended(code, False)
    assert code == 0, err.getvalue()
    told = "warm restart 1: rank 1 started anew after rank 1 exited with code 7 on h1"
    with Registry.open(registry) as reg:
        (row,) = list_rows(reg)
        assert recoveries_of(row["info"]) == {1: [told]}  # attempt 2 (restarted whole) recovered nothing
        view = run_status(reg, row, False)
    assert view["recoveries"] == {"1": [told]}
    assert f"  attempt 1: {told}" in run_lines(view)


def test_a_spare_host_that_is_also_a_job_host_is_one_line_exit_2(capsys):
    code, out, err = run_cli(
        capsys, "launch", "--dry-run", "--hosts", "a,b", "--spare-hosts", "c,b", "--", "python3", "-m", "x"
    )
    assert (code, out, err.strip()) == (
        2,
        "",
        "slurmgen: error: spare_hosts: b is also one of the job's hosts (a spare must be idle)",
    )


OWN = """
import os, sys, time
import torch, torch.distributed as dist
from slurmgen.train import warm

warm.join("gloo")
print("PID", os.getpid(), "rank", os.environ["RANK"], flush=True)
step, fresh = 0, os.environ.get("SLURMGEN_WARM_GENERATION") is None
while step < 60:
    try:
        if fresh and os.environ["RANK"] == "1" and step == 20:
            os._exit(9)  # a crash, mid-run
        t = torch.ones(4)
        dist.all_reduce(t)
        assert t[0].item() == 2.0
        step += 1
        time.sleep(0.02)
    except Exception as exc:
        if not warm.peer_failed(exc):
            raise
        world = warm.rejoin()
        print("rejoined generation", world.generation, "at step", step, "pid", os.getpid(), flush=True)
        step = 0  # this program keeps no checkpoint: it starts its count again
print("finished pid", os.getpid(), flush=True)
"""


def test_any_program_takes_part_through_the_warm_hook(tmp_path):
    """A plain torch.distributed program with slurmgen.train.warm around its step: rank 1 crashes,
    rank 0 rejoins in its own process, rank 1's place goes to the node's warm spare."""
    (tmp_path / "own.py").write_text(OWN)
    timeline = tmp_path / "timeline.jsonl"
    plan = local_plan(
        tmp_path,
        [PY, "own.py"],
        slots=(1, 1),
        max_restarts=1,
        restart_mode="warm",
        env={envvars.TIMELINE_FILE: str(timeline)},
    )
    out, err, made = io.StringIO(), io.StringIO(), {}
    launcher = Launcher(plan, SSHOptions(), out=out, err=err, colour=False, connector=local_connector(made))
    try:
        code = launcher.run()
    finally:
        kill_local_nodes(made)
    text, said = out.getvalue(), err.getvalue()
    assert code == 0, said + text
    first = re.search(r"\[h0/0\] PID (\d+) rank 0", text)
    assert first and f"[h0/0] rejoined generation 1 at step 20 pid {first.group(1)}" in text, text
    assert f"[h0/0] finished pid {first.group(1)}" in text and text.count("finished pid") == 2, text
    assert "rank 1 exited with code 9 on h1: warm restart 1 of at most 1" in said, said
    assert "rank 1 goes on in the warm spare" in text, text
    # The promoted spare is rank 1's process from then on: its `process` and `end` on the timeline.
    lines = [json.loads(line) for line in timeline.read_text().splitlines()]
    mine = [(e["event"], e["pid"], e.get("code")) for e in lines if e["rank"] == 1 and e.get("by") == "launcher"]
    assert [(event, code) for event, _, code in mine] == [("process", None), ("end", 9), ("process", None), ("end", 0)]
    assert mine[0][1] == mine[1][1] != mine[2][1] == mine[3][1], mine


def kill_rank_2_once(out_dir: Path, seen: dict) -> None:
    """Thread: once a checkpoint is written, SIGKILL rank 2, noting every rank's pid."""
    try:
        wait_for(lambda: list((out_dir / "checkpoints").glob("ckpt-*.pt")), 120, "a checkpoint")
        beats = wait_for(lambda: (b := read_heartbeats(out_dir / "heartbeats")) and len(b) == 3 and b, 30, "3 beats")
        seen["pids"] = {rank: beat["pid"] for rank, beat in beats.items()}
        seen["killed_at"] = time.time()
        os.kill(seen["pids"][2], signal.SIGKILL)
    except AssertionError as exc:
        seen["error"] = str(exc)


GRACE = 5  # the stop grace: a rank still there after it is SIGKILLed (137); long, for a loaded machine


def test_ranks_waiting_for_a_new_world_stop_at_once_when_the_launcher_stops_them(tmp_path):
    """Issue 35: the launcher decides against a warm restart (here no budget left: a stop of every
    node, as for a cold restart, a person's stop or scancel) while the healthy ranks wait for its
    word. They end at the stop's SIGTERM with the stopped rank's code (75) and one line, within
    the stop grace; before, they ignored it (the trainer's handler only sets a flag for its step
    loop) and were SIGKILLed after the grace: 137, and the restart a grace later."""
    out_dir, timeline = tmp_path / "run", tmp_path / "timeline.jsonl"
    plan = local_plan(
        tmp_path,
        trainer(out_dir, "--max-steps", "100000", "--save-every", "20", "--log-every", "50"),
        slots=(1, 2),
        max_restarts=0,
        restart_mode="warm",
        stop_grace=GRACE,
        env={envvars.TIMELINE_FILE: str(timeline)},
    )
    out, err, made, seen = io.StringIO(), io.StringIO(), {}, {}
    launcher = Launcher(plan, SSHOptions(), out=out, err=err, colour=False, connector=local_connector(made))
    threading.Thread(target=kill_rank_2_once, args=(out_dir, seen), daemon=True).start()
    try:
        code = launcher.run()
        over = time.time()
    finally:
        kill_local_nodes(made)
    text, said = out.getvalue(), err.getvalue()
    assert "error" not in seen and "pids" in seen, (seen, said, text[-3000:])
    assert code == 137 and "stopping all nodes: rank 2 exited with code 137 on h1" in said, (code, said)
    # Each waiting rank says why, once, and ends by itself with the stopped rank's code: the
    # trainer's own `end` on the timeline ("preempted", which a SIGKILLed rank never writes) and
    # the node script's, with the code the process exited with: 75, not 137.
    for rank in (0, 1):
        line = f"[rank {rank}] warning: signal SIGTERM while {warm.WAITING}: stopping"
        assert text.count(line) == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    events = [e for e in map(json.loads, timeline.read_text().splitlines()) if e["event"] == "end"]
    ends = {(e["rank"], e.get("by", "trainer")): e for e in events}
    assert {r: ends[r, "trainer"]["status"] for r in (0, 1)} == {0: "preempted", 1: "preempted"}, events
    codes = {r: ends[r, "launcher"]["code"] for r in (0, 1, 2)}
    assert codes == {0: exitcodes.PREEMPTED, 1: exitcodes.PREEMPTED, 2: 137}, events
    # Promptly: the kill, the launcher's stop and the ranks' exit well within the grace (before, the
    # grace then SIGKILL). The processes are gone, not only their records written.
    took = max(ends[r, "launcher"]["time"] for r in (0, 1)) - seen["killed_at"]
    print(f"waiting ranks stopped {took:.2f} s, the launcher {over - seen['killed_at']:.2f} s after the fault")
    assert took < GRACE / 2 and over - seen["killed_at"] < GRACE, (took, over - seen["killed_at"])
    assert not still_running(seen["pids"].values(), grace=GRACE / 2 - took)
    for conn in made.values():
        assert all(proc.popen.poll() is not None for proc in conn.procs)
