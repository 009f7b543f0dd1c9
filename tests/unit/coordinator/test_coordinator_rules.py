"""The coordinator's pure parts: the seed's rank rule, config validation, state transitions."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from pydantic import ValidationError

from slurmgen.coordinator.models import GroupConfig, MoveRequest, split_worker_name
from slurmgen.coordinator.node_agent import is_stale, quiet_beat
from slurmgen.coordinator.procs import LineBuffer, exit_status
from slurmgen.coordinator.ranks import (
    fewer_nodes_allowed,
    on_spares,
    pick_spare,
    plan_ranks,
    rank_env,
    spare_hosts,
    without_nodes,
)
from slurmgen.coordinator.state import (
    Outcome,
    judge_attempt,
    node_to_blame,
    reconcile,
    restart_after,
    worker_state,
)
from slurmgen.errors import SlurmgenError


def table(config, workers):
    members = [split_worker_name(w) for w in workers]
    return [(r.worker, r.rank, r.local_rank, r.node_rank) for r in plan_ranks(config, members)]


def test_seed_table_one_worker_on_four_nodes():
    # 002 seed: master gn6; others alphabetical, so gn39 < gn40 < gn7 (not natural order).
    got = table(GroupConfig(master="gn6", world_size=4), ["gn7-0", "gn40-0", "gn6-0", "gn39-0"])
    assert got == [("gn6-0", 0, 0, 0), ("gn39-0", 1, 0, 1), ("gn40-0", 2, 0, 2), ("gn7-0", 3, 0, 3)]


def test_seed_table_two_workers_on_two_nodes():
    got = table(GroupConfig(master="gn6"), ["gn7-1", "gn6-1", "gn7-0", "gn6-0"])
    assert got == [("gn6-0", 0, 0, 0), ("gn6-1", 1, 1, 0), ("gn7-0", 2, 0, 1), ("gn7-1", 3, 1, 1)]


def test_uneven_workers_and_numeric_ids():
    plan = plan_ranks(GroupConfig(master="b"), [("a", 10), ("a", 2), ("b", 0), ("a", 1)])
    assert [(r.worker, r.rank, r.local_rank, r.node_rank, r.local_world_size) for r in plan] == [
        ("b-0", 0, 0, 0, 1),
        ("a-1", 1, 0, 1, 3),
        ("a-2", 2, 1, 1, 3),
        ("a-10", 3, 2, 1, 3),
    ]


def test_world_size_smaller_takes_first_ranks_and_drops_empty_nodes():
    got = table(GroupConfig(master="gn6", world_size=2), ["gn6-0", "gn6-1", "gn7-0", "gn7-1"])
    assert got == [("gn6-0", 0, 0, 0), ("gn6-1", 1, 1, 0)]


def test_default_world_size_and_master():
    plan = plan_ranks(GroupConfig(), [("gn7", 0), ("gn6", 0)])
    assert [r.worker for r in plan] == ["gn6-0", "gn7-0"] and plan[0].world_size == 2


@pytest.mark.parametrize(
    "config, words",
    [
        (GroupConfig(master="gn6", world_size=5), ["5", "4"]),
        (GroupConfig(master="gn6-0"), ["master", "'gn6-0'", "give 'gn6'"]),
        (GroupConfig(master="gn9"), ["master", "'gn9'", "gn6, gn7"]),
    ],
)
def test_bad_plans_name_the_problem(config, words):
    with pytest.raises(SlurmgenError) as e:
        plan_ranks(config, [("gn6", 0), ("gn6", 1), ("gn7", 0), ("gn7", 1)])
    assert all(w in str(e.value) for w in words), str(e.value)


def test_spare_nodes_are_the_last_in_the_groups_order_and_run_nothing():
    members = [split_worker_name(w) for w in ["gn6-0", "gn6-1", "gn7-0", "gn7-1", "gn8-0", "gn8-1", "gn9-0"]]
    config = GroupConfig(master="gn7", spare_nodes=2)
    assert [(r.worker, r.rank, r.node_rank) for r in plan_ranks(config, members)] == [
        ("gn7-0", 0, 0),
        ("gn7-1", 1, 0),
        ("gn6-0", 2, 1),
        ("gn6-1", 3, 1),
    ]
    assert spare_hosts(config, members) == ["gn8", "gn9"]
    assert spare_hosts(GroupConfig(master="gn7"), members) == []
    with pytest.raises(SlurmgenError, match=r"spare_nodes: 4 leaves no node to run on \(the group has 4\)"):
        plan_ranks(GroupConfig(spare_nodes=4), members)


def test_a_node_moves_to_the_first_spare_that_fits_and_keeps_its_ranks():
    """pick_spare skips a lost spare and one with too few workers; on_spares puts the node's ranks
    on the spare's workers in slot order, every rank, node rank and world size as they were."""
    ranks = plan_ranks(GroupConfig(master="a"), [("a", 0), ("a", 1), ("b", 0), ("b", 1)])
    slots = {"a": [0, 1], "b": [0, 1], "c": [0], "d": [5, 3], "e": [0, 1]}
    assert pick_spare(ranks, "b", ["c", "d", "e"], slots, lost=set()) == "d"  # c has one worker, b has two
    assert pick_spare(ranks, "b", ["c", "d", "e"], slots, lost={"d"}) == "e"
    assert pick_spare(ranks, "b", ["c"], slots, lost=set()) is None
    assert pick_spare(ranks, "x", ["d"], slots, lost=set()) is None  # runs no rank
    assert pick_spare(ranks, "a", ["d"], slots, lost=set()) == "d"  # the master's node moves, and the master with it
    assert pick_spare(ranks, "a", ["d"], slots, lost=set(), master_addr="10.0.0.1") is None  # the address names a
    moved = on_spares(ranks, {"b": "d"}, slots)
    assert [(r.worker, r.host, r.rank, r.local_rank, r.node_rank, r.world_size) for r in moved] == [
        ("a-0", "a", 0, 0, 0, 4),
        ("a-1", "a", 1, 1, 0, 4),
        ("d-3", "d", 2, 0, 1, 4),
        ("d-5", "d", 3, 1, 1, 4),
    ]


def test_a_smaller_world_is_dense_over_the_nodes_left_and_never_below_min_nodes():
    """Issue 35 item 3 for groups, the pure decision: with no spare for a failed node, the next
    attempt may do without it while min_nodes are left; its ranks are dense over the nodes left in
    the old order (RANK, NODE_RANK from 0, WORLD_SIZE the ranks left), each on its worker, LOCAL_RANK
    kept. Node 0 going takes the master to the next node, unless the master's address was given."""
    members = [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0), ("c", 1)]
    ranks = plan_ranks(GroupConfig(master="a", min_nodes=2, max_restarts=1), members)
    assert fewer_nodes_allowed(ranks, {"b"}, min_nodes=2)
    assert [(r.worker, r.rank, r.local_rank, r.node_rank, r.world_size) for r in without_nodes(ranks, {"b"})] == [
        ("a-0", 0, 0, 0, 4),
        ("a-1", 1, 1, 0, 4),
        ("c-0", 2, 0, 1, 4),
        ("c-1", 3, 1, 1, 4),
    ]
    assert [(r.worker, r.rank, r.node_rank) for r in without_nodes(ranks, {"a"})][:2] == [("b-0", 0, 0), ("b-1", 1, 0)]
    assert fewer_nodes_allowed(ranks, {"a"}, min_nodes=2)  # node 0 goes: b is the master now
    assert not fewer_nodes_allowed(ranks, {"a"}, min_nodes=2, master_addr="10.0.0.1")  # the address names a
    assert not fewer_nodes_allowed(ranks, {"b", "c"}, min_nodes=2)  # 1 node left: below min_nodes
    assert fewer_nodes_allowed(ranks, {"b", "c"}, min_nodes=1)
    assert not fewer_nodes_allowed(ranks, {"b"}, min_nodes=None)  # no min_nodes: never fewer nodes
    assert not fewer_nodes_allowed(ranks, {"x"}, min_nodes=1)  # runs no rank: nothing to leave out


@pytest.mark.parametrize(
    "config, members, words",
    [
        ({"min_nodes": 0, "max_restarts": 1}, 2, "min_nodes: 0 is fewer than 1; expected at least 1"),
        (
            {"min_nodes": 1},
            2,
            "min_nodes: 1 is the fewest nodes a restart goes on with; give max_restarts (--max-restarts N)",
        ),
        ({"min_nodes": 3, "max_restarts": 1}, 2, "min_nodes: 3 is more than nodes (2); expected 1 to 2"),
        (
            {"min_nodes": 2, "max_restarts": 1, "spare_nodes": 1},
            2,
            "min_nodes: 2 is more than nodes (1); expected 1 to 1",
        ),
    ],
)
def test_min_nodes_that_do_not_fit_are_one_line_naming_field_value_and_form(config, members, words):
    """The one rule of contract/world.py: on the config alone (its value, the restart budget), and
    against the nodes that run ranks once the members are known."""
    nodes = [(f"gn{i}", 0) for i in range(members)]
    with pytest.raises((ValidationError, SlurmgenError)) as e:
        plan_ranks(GroupConfig(**config), nodes)
    assert words in str(e.value), str(e.value)


def test_no_members_is_refused_with_a_hint():
    with pytest.raises(SlurmgenError, match="no workers"):
        plan_ranks(GroupConfig(), [])


def test_rank_env_is_the_torchrun_contract_plus_group():
    config = GroupConfig(master="gn6", backend="gloo", env={"FOO": "bar"})
    entry = plan_ranks(config, [("gn6", 0), ("gn7", 0)])[1]
    env = rank_env(config, "exp1", entry, "gn6")
    assert env == {
        "FOO": "bar",
        "RANK": "1",
        "LOCAL_RANK": "0",
        "NODE_RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "gn6",
        "MASTER_PORT": "29500",
        "SLURMGEN_BACKEND": "gloo",
        "SLURMGEN_STRATEGY": "ddp",
        "SLURMGEN_GROUP": "exp1",
    }


def test_a_groups_strategy_reaches_every_rank_as_the_trainers_default():
    """A group of the bundled trainer runs fsdp without every user writing the variable in env."""
    config = GroupConfig(strategy="fsdp")
    assert GroupConfig().strategy == "ddp"
    entries = plan_ranks(config, [("gn6", 0), ("gn7", 0)])
    assert {rank_env(config, "exp1", e, "gn6")["SLURMGEN_STRATEGY"] for e in entries} == {"fsdp"}


@pytest.mark.parametrize(
    "fields, where",
    [
        ({"env": {"RANK": "3"}}, "RANK"),
        ({"env": {"1X": "a"}}, "1X"),
        ({"cwd": "rel/dir"}, "cwd"),
        ({"master_port": 70000}, "master_port"),
        ({"master": "a b"}, "master"),
        ({"world_size": 0}, "world_size"),
        ({"backend": "mpi"}, "backend"),
        ({"bogus": 1}, "bogus"),
        ({"master_addr": "x;rm"}, "master_addr"),
        ({"strategy": "zero3"}, "strategy"),
        ({"env": {"SLURMGEN_STRATEGY": "fsdp"}}, "SLURMGEN_STRATEGY"),
    ],
)
def test_config_validation_names_the_field(fields, where):
    with pytest.raises(ValidationError) as e:
        GroupConfig(**fields)
    assert where in str(e.value)


@pytest.mark.parametrize("names", [["gn6"], ["-0"], ["gn6-x"], ["a b-0"]])
def test_worker_names_must_be_host_dash_id(names):
    with pytest.raises(ValidationError, match="host>-<id>|letters"):
        MoveRequest(workers=names, group="g")


def test_hyphenated_host_names_split_at_the_last_dash():
    assert split_worker_name("gpu-node-12-3") == ("gpu-node-12", 3)


# --- state transitions -------------------------------------------------------------------------
RUN = ("exp1", 2)


@pytest.mark.parametrize(
    "reported, run, wanted, finished, order",
    [
        ("idle", None, RUN, False, "start"),
        ("idle", None, None, False, None),
        ("running", RUN, RUN, False, None),
        ("running", ("exp1", 1), RUN, False, "stop"),  # the old attempt goes before the new one
        ("running", RUN, None, False, "stop"),  # the group was stopped or failed
        ("exited", ("exp1", 1), RUN, False, "start"),  # a restart
        ("exited", RUN, RUN, True, None),  # ran and reported: never twice
        ("idle", None, RUN, True, None),  # a restarted agent does not rerun a done rank
    ],
)
def test_reconcile(reported, run, wanted, finished, order):
    assert reconcile(reported, run, wanted, finished) == order


def test_worker_state():
    assert worker_state("running", RUN, RUN, lost=True) == "lost"
    assert worker_state("idle", None, RUN, lost=False) == "starting"
    assert worker_state("exited", RUN, RUN, lost=False) == "exited"
    assert worker_state("idle", None, None, lost=False) == "idle"


RANKS = {"a-0": 0, "a-1": 1, "b-0": 2}


@pytest.mark.parametrize(
    "state, exits, running, hung, lost, expect",
    [
        ("starting", {}, {"a-0", "a-1"}, set(), {}, ("starting", None)),
        ("starting", {}, {"a-0", "a-1", "b-0"}, set(), {}, ("running", None)),
        ("running", {"a-1": 0, "b-0": 3, "a-0": 1}, set(), set(), {}, ("failed", 3)),  # first cause wins
        ("running", {}, set(RANKS), {"b-0"}, {}, ("failed", 124)),
        ("running", {}, set(RANKS), set(), {"b-0": 11.0}, ("failed", 255)),
        ("running", {"a-0": 0, "a-1": 0, "b-0": 0}, set(), set(), {}, ("succeeded", 0)),
        ("failed", {"a-0": 1}, set(), set(), {}, ("failed", None)),  # judged once
    ],
)
def test_judge_attempt(state, exits, running, hung, lost, expect):
    outcome = judge_attempt(state, RANKS, exits, running, hung, lost)
    assert (outcome.state, outcome.exit_code) == expect


def test_failure_reason_names_rank_worker_and_code():
    outcome = judge_attempt("running", RANKS, {"b-0": 3}, set(), set(), {})
    assert outcome.reason == "rank 2 (b-0) exited with code 3"


def test_stale_trainer_heartbeat():
    assert is_stale({"status": "running", "time": 100.0}, now=200.0, timeout=60)
    assert not is_stale({"status": "running", "time": 180.0}, now=200.0, timeout=60)
    assert not is_stale({"status": "checkpointing", "time": 0.0}, now=200.0, timeout=60)
    assert not is_stale(None, now=200.0, timeout=60)


def test_a_rank_stopped_in_a_checkpoint_is_stale_and_a_learned_evaluation_keeps_its_longer_limit():
    """contract/hangs.py as the agent applies it: a checkpoint with nothing learned is judged only
    when its process is stopped (SIGSTOP here, a real process); an evaluation's learned limit,
    longer than the group's, reaches the server as the rank's own."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        beat = {"status": "checkpointing", "time": 100.0, "pid": proc.pid}
        assert not is_stale(beat, now=200.0, timeout=60)  # the disk may take this long
        waited = quiet_beat(beat, now=200.0, timeout=60, pid=None)  # reported: it may have waited
        assert waited is not None and not waited.judged and not waited.stopped
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.1)
        assert is_stale(beat, now=200.0, timeout=60)
        quiet = quiet_beat(beat, now=200.0, timeout=60, pid=None)
        assert quiet is not None and quiet.stopped and quiet.judged and quiet.limit is None  # the group's
    finally:
        proc.kill()
        proc.wait()
    evaluating = {"status": "evaluating", "time": 100.0, "timeout": 90.0}
    quiet = quiet_beat(evaluating, now=170.0, timeout=60, pid=None)
    assert quiet is not None and quiet.limit == 90.0 and not quiet.stopped
    assert not is_stale(evaluating, now=170.0, timeout=60) and is_stale(evaluating, now=191.0, timeout=60)


def test_exit_status_is_shell_style():
    assert (exit_status(0), exit_status(3), exit_status(-15), exit_status(-9)) == (0, 3, 143, 137)


def test_output_queue_is_bounded_and_counts_drops():
    from slurmgen.coordinator.models import ReportedLine

    out = LineBuffer(limit=3)
    for i in range(5):
        out.put(ReportedLine(worker=0, group="g", attempt=1, rank=0, time=0.0, line=str(i)))
    lines, dropped = out.take(10)
    skipped = "… 2 lines skipped here (every line is in the rank's log on its node)"
    assert [ln.line for ln in lines] == [skipped, "2", "3", "4"] and dropped == 2
    out.give_back(lines, dropped)  # an undelivered heartbeat's lines come back first
    again, dropped = out.take(10)
    assert [ln.line for ln in again] == [skipped, "2", "3", "4"] and dropped == 2


def test_a_flood_sends_the_newest_lines_and_says_per_rank_how_many_were_skipped():
    """Issue 33 item 8: a heartbeat carried the oldest 2,000 lines of a flood, so the page fell
    seconds behind, and the lines that never fit went unsaid (24 of ~160 marker lines arrived)."""
    from slurmgen.coordinator.models import ReportedLine

    out = LineBuffer(limit=100)
    for i in range(40):
        out.put(ReportedLine(worker=i % 2, group="g", attempt=1, rank=i % 2, time=float(i), line=f"r{i % 2} {i}"))
    lines, dropped = out.take(10)
    assert dropped == 30
    assert [ln.line for ln in lines[2:]] == [f"r{i % 2} {i}" for i in range(30, 40)]  # the newest, in order
    markers = {ln.rank: ln.line for ln in lines[:2]}
    assert markers == {r: "… 15 lines skipped here (every line is in the rank's log on its node)" for r in (0, 1)}
    assert out.take(10) == ([], 0)


def test_a_learned_timeout_in_the_beat_shortens_the_agents_limit():
    assert is_stale({"status": "running", "time": 198.0, "timeout": 1.5}, now=200.0, timeout=60)
    assert not is_stale({"status": "running", "time": 199.0, "timeout": 1.5}, now=200.0, timeout=60)
    assert is_stale({"status": "evaluating", "time": 190.0, "timeout": 5.0}, now=200.0, timeout=60)
    assert not is_stale({"status": "evaluating", "time": 0.0}, now=200.0, timeout=60)


@pytest.mark.parametrize(
    "outcome, used, budget, again",
    [
        (Outcome("failed", "rank 1 exited with code 1", 1), 0, 2, True),
        (Outcome("failed", "hung", 124), 1, 2, True),
        (Outcome("failed", "its agent has been silent", 255), 0, 1, True),
        (Outcome("failed", "a worker gone without a code", None), 0, 1, True),
        (Outcome("failed", "rank 1 exited with code 1", 1), 2, 2, False),  # the budget is spent
        (Outcome("failed", "rank 0 exited with code 2 (bad input)", 2), 0, 2, False),  # same input, same end
        (Outcome("stopped", "stopped on request"), 0, 2, False),
        (Outcome("preempted", "rank 0 exited with code 75", 75), 0, 2, False),
        (Outcome("succeeded", "every rank exited 0", 0), 0, 2, False),
    ],
)
def test_a_group_restarts_after_a_failure_worth_a_retry(outcome, used, budget, again):
    """The retry rule of contract/retries.py (a group restarted after any failure before, bad input too)."""
    assert restart_after(outcome, used, budget) is again


@pytest.mark.parametrize(
    "code, moved",
    [(255, "gn6"), (124, "gn6"), (137, "gn6"), (-9, "gn6"), (1, None), (3, None), (75, None)],
)
def test_a_restart_moves_the_node_of_a_lost_agent_a_hung_rank_or_a_killed_one_not_of_an_error(code, moved):
    """An exit with an error of its own names no culprit: a dead peer makes the others exit 1."""
    assert node_to_blame(Outcome("failed", "why", code, "gn6-1")) == moved
    assert node_to_blame(Outcome("stopped", "stopped by you", 143, "gn6-1")) is None
