"""The heartbeat file contract that launchers and watchers rely on (slurmgen/train/logs.py)."""

import json
import os
import shutil
import socket
import time

from slurmgen.contract import exitcodes
from slurmgen.contract.envvars import HEARTBEAT_DIR as HEARTBEAT_DIR_ENV
from slurmgen.train import logs
from slurmgen.train.logs import Heartbeat, node_local_dir, read_heartbeats


def test_heartbeat_goes_to_the_launchers_directory_when_it_names_one(tmp_path, monkeypatch):
    node_local = tmp_path / "node-local"
    monkeypatch.setenv(HEARTBEAT_DIR_ENV, str(node_local))
    Heartbeat(tmp_path / "out", rank=3, every=1.0).beat(step=7)
    record = json.loads((node_local / "rank-00003.json").read_text())
    assert (record["rank"], record["step"], record["status"]) == (3, 7, "running")
    assert not (tmp_path / "out").exists()


def test_without_a_launcher_ranks_write_node_local_and_the_run_directory_gets_one_file_per_node(tmp_path):
    out, environ = tmp_path / "out", {"MASTER_PORT": "1234"}
    leader, other = (Heartbeat(out, rank=r, every=0.05, local_rank=r - 4, node_rank=1, environ=environ) for r in (4, 5))
    assert leader.dir == other.dir == node_local_dir(out, 1, environ) and not leader.dir.is_relative_to(out)
    try:
        other.beat(step=1)
        leader.beat(step=1)
        summary = out / "heartbeats" / f"node-{socket.gethostname()}-1.json"
        assert os.listdir(out / "heartbeats") == [summary.name]
        assert {r: b["step"] for r, b in read_heartbeats(out / "heartbeats").items()} == {4: 1, 5: 1}
        first = summary.stat().st_mtime_ns
        for step in range(2, 4):  # beats within 5 periods leave the summary alone
            other.beat(step=step, force=True)
            leader.beat(step=step, force=True)
        assert summary.stat().st_mtime_ns == first
        time.sleep(5 * 0.05)
        leader.beat(step=4)
        assert read_heartbeats(out / "heartbeats")[5]["step"] == 3
        other.beat(step=4, status="done")
        leader.beat(step=4, status="done")
        leader.finish()
        beats = read_heartbeats(out / "heartbeats")
        assert {b["status"] for b in beats.values()} == {"done"} and beats[4]["pid"] == os.getpid()
        assert not leader.dir.exists()
    finally:
        shutil.rmtree(leader.dir, ignore_errors=True)


def test_exit_codes_are_described_in_words():
    assert exitcodes.describe(exitcodes.PREEMPTED) == "preempted"
    assert exitcodes.describe(137) == "killed by signal 9"
    assert exitcodes.describe(-15) == "killed by signal 15"
    assert exitcodes.describe(3) == "exit 3"


def test_a_node_leader_removes_directories_that_killed_runs_left(tmp_path):
    mine, live, dead = (tmp_path / f"slurmgen-heartbeats-{os.getuid()}-{n}" for n in ("mine", "live", "dead"))
    for d in (mine, live, dead):
        d.mkdir()
        (d / "rank-00000.json").write_text("{}\n")
    hour_ago = time.time() - 2 * logs.STALE_AFTER
    os.utime(dead / "rank-00000.json", (hour_ago, hour_ago))
    os.utime(dead, (hour_ago, hour_ago))
    logs.remove_stale_node_dirs(mine, time.time())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, live.name])


def test_leaders_sharing_a_node_directory_finish_with_every_rank_in_the_summary(tmp_path):
    """Ranks started by hand on one host are all local rank 0 of node 0: two leaders, one node
    directory, one summary. Whichever finishes first must not remove the directory before the
    other has summarised it (the barrier between summary and removal), else the summary that
    lands last lacks ranks."""
    import threading

    out, environ = tmp_path / "out", {"MASTER_PORT": "4321"}
    leaders = [Heartbeat(out, rank=r, every=1.0, local_rank=0, node_rank=0, environ=environ) for r in (0, 1)]
    assert leaders[0].dir == leaders[1].dir
    for hb in leaders:
        hb.beat(step=6, status="done", force=True)
    meet = threading.Barrier(2, timeout=10)
    # The second leader summarises late: without the barrier the first would have removed the
    # directory by then, and the late summary (no ranks) would replace the complete one.
    late = threading.Thread(target=lambda: (time.sleep(0.2), leaders[1].finish(meet.wait)))
    late.start()
    leaders[0].finish(meet.wait)
    late.join()
    beats = read_heartbeats(out / "heartbeats")
    assert {r: (b["step"], b["status"]) for r, b in beats.items()} == {0: (6, "done"), 1: (6, "done")}
    assert not leaders[0].dir.exists()


def test_a_ranks_last_step_on_the_timeline_is_its_last_heartbeats(tmp_path, monkeypatch):
    """Issue 33 item 11: a hung rank's verdict said "stopped beating at step 1669" (its heartbeat
    file) beside "Last step 1722" (the timeline's sample): two throttles out of phase once a
    checkpoint forced a beat. A sample is now taken only on the beats that write the file."""
    from slurmgen.contract.envvars import TIMELINE_FILE
    from slurmgen.observe import heartbeat
    from slurmgen.observe.timeline import build

    environ = {HEARTBEAT_DIR_ENV: str(tmp_path / "hb"), TIMELINE_FILE: str(tmp_path / "timeline.jsonl")}
    beat = Heartbeat(tmp_path / "out", rank=1, every=1.0, environ=environ)
    now = [0.0]
    monkeypatch.setattr(heartbeat.time, "time", lambda: now[0])
    beats = [(100.0, 1, "running"), (100.5, 2, "running"), (101.0, 3, "running"), (101.5, 4, "checkpointing")]
    beats += [(101.6, 4, "running"), (102.0, 5, "running"), (102.2, 6, "running")]  # then the rank freezes
    for now[0], step, status in beats:  # step 5: 1 s after the last sample, 0.4 s after the forced beat
        beat.beat(step, status)
    told = json.loads((tmp_path / "hb" / "rank-00001.json").read_text())["step"]
    events = [json.loads(line) for line in (tmp_path / "timeline.jsonl").read_text().splitlines()]
    (rank,) = build(events)["attempts"][0]["ranks"]
    assert told == rank["last_step"] == 4, (told, events)


def test_a_warm_restart_begins_a_new_world_on_the_timeline(tmp_path):
    """Issue 35: goodput finds every rank stepping again after a warm restart by the new world's
    `first_step` lines (contract/phases.py GENERATION). A rank that kept its process writes its
    first step again once it rejoined; a process started for the restart is told its generation
    by its environment. The lines of the first world carry no generation."""
    from slurmgen.contract.envvars import TIMELINE_FILE, WARM_GENERATION
    from slurmgen.observe import goodput

    path = tmp_path / "timeline.jsonl"
    environ = {HEARTBEAT_DIR_ENV: str(tmp_path / "hb"), TIMELINE_FILE: str(path)}
    kept = Heartbeat(None, rank=0, every=0.0, environ=environ)
    for step in range(6):
        kept.beat(step)
    kept.rejoined(2, 3)  # back from step 5 to the checkpoint at step 3, in generation 2
    fresh = Heartbeat(None, rank=1, every=0.0, environ={**environ, WARM_GENERATION: "2"})
    for step in (3, 4, 5, 6):
        kept.beat(step)
        fresh.beat(step)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    firsts = [(e["rank"], e["step"], e.get("generation")) for e in lines if e["event"] == "first_step"]
    assert firsts == [(0, 1, None), (0, 4, 2), (1, 4, 2)]
    kept_says = [e.get("generation") for e in lines if e["rank"] == 0]
    assert kept_says[0] is None and kept_says[-1] == 2 and kept_says == sorted(kept_says, key=lambda g: g or 0)
    assert [x["generation"] for x in goodput.compute(lines)["lost_steps"]] == [2]


def test_a_program_of_its_own_that_rejoined_begins_the_new_world_at_its_next_beat(tmp_path):
    """`slurmgen.train.warm.rejoin` (for programs other than the trainer) moves the process to the
    new world by its environment (SLURMGEN_WARM_GENERATION): the next beat, a step done, is that
    world's first step."""
    from slurmgen.contract.envvars import TIMELINE_FILE, WARM_GENERATION

    path = tmp_path / "timeline.jsonl"
    environ = {HEARTBEAT_DIR_ENV: str(tmp_path / "hb"), TIMELINE_FILE: str(path)}
    beat = Heartbeat(None, rank=0, every=0.0, environ=environ)
    for step in range(5):
        beat.beat(step)
    environ[WARM_GENERATION] = "1"  # as warm.adopt does in os.environ
    beat.beat(3)
    beat.beat(4)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    firsts = [(e["step"], e.get("generation")) for e in lines if e["event"] == "first_step"]
    assert firsts == [(1, None), (3, 1)] and lines[-1]["generation"] == 1


def test_a_beat_after_the_launcher_removed_its_directory_does_not_make_it_again(tmp_path, monkeypatch):
    """The launcher's watcher removes the node's heartbeat directory as the run ends; a rank's last
    beat after that (the trainer's "stopped", after the checkpoint a TERM asks for) is dropped,
    or the directory would stay behind on the node."""
    beats = tmp_path / "beats" / "node1"
    monkeypatch.setenv(HEARTBEAT_DIR_ENV, str(beats))
    hb = Heartbeat(out_dir=None, rank=1, node_rank=0, every=0.0)
    hb.beat(5)
    assert read_heartbeats(beats)[1]["step"] == 5
    shutil.rmtree(tmp_path / "beats")
    hb.beat(6, status="stopped")
    assert not (tmp_path / "beats").exists()
