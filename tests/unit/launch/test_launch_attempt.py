"""The launch state machine (slurmgen/launch/attempt.py), input by input: every transition,
every deadline, and inputs that arrive together. No processes, no clock: times are given."""

import inspect
import signal

import pytest

from slurmgen.contract import exitcodes
from slurmgen.contract.blame import LastBeat
from slurmgen.contract.node_events import KEEPALIVE_COUNT, KEEPALIVE_INTERVAL, NodeEvent, parse_event
from slurmgen.launch import attempt as m
from slurmgen.launch.display import NodeResult

LIMITS = m.Limits(connect=10, keepalive=5, keepalive_count=3, stop_grace=1, stop_wait=5)
HOSTS = ("a", "b", "c")


def fresh(hosts=HOSTS, limits=LIMITS) -> m.AttemptState:
    nodes = [NodeResult(h, i, str(i)) for i, h in enumerate(hosts)]
    return m.initial(nodes, attempt=1, at=100.0, launched_at=90.0, world_size=len(hosts), limits=limits)


def run(state, *inputs):
    """Feed inputs in order; the final state and every action, in order."""
    actions = []
    for item in inputs:
        state, more = m.step(state, item)
        actions += more
    return state, actions


def opened(at=100.1, hosts=HOSTS):
    return [m.SessionOpened(h, at) for h in hosts]


def started(at=101.0, hosts=HOSTS):
    return [m.Reported(h, NodeEvent("started"), at) for h in hosts]


def said(actions):
    return [a.text for a in actions if isinstance(a, m.Say)]


def closed(actions):
    return [a.host for a in actions if isinstance(a, m.CloseStdin)]


def test_all_succeed_announces_running_once_and_ends_ok():
    s, actions = run(fresh(), *opened(), *started(at=101.5))
    assert said(actions) == ["all 3 node(s) running 3 rank(s) 1.50s after the start of attempt 1 (11.50s after launch)"]
    assert {n.state for n in s.nodes.values()} == {"running"} and not s.done
    s, actions = run(s, *[m.SessionEnded(h, 0, 105.0) for h in HOSTS], m.ClockTick(106, {}))
    assert s.done and s.code == 0 and s.verdict == "all ranks succeeded" and actions == []
    assert [(n.state, n.code, n.duration) for n in s.nodes.values()] == [("ok", 0, "3.5s")] * 3


def test_rank_exit_event_stops_the_others_and_spares_the_failed_node():
    s, _ = run(fresh(), *opened(), *started())
    s, actions = run(s, m.Reported("b", NodeEvent("exited", 1, 3), 102.0))
    assert said(actions) == ["stopping all nodes: rank 1 exited with code 3 on b"]
    assert closed(actions) == ["a", "c"]  # b stops its own ranks
    assert s.code == 3 and s.first == ("b", "rank 1 exited with code 3") and s.spared == "b"
    s, actions = run(s, m.SessionEnded("a", 143, 102.3), m.SessionEnded("c", 130, 102.3), m.SessionEnded("b", 3, 102.4))
    assert s.done and actions == []
    states = {h: (n.state, n.code, n.note) for h, n in s.nodes.items()}
    assert states == {
        "a": ("stopped", 143, "stopped by slurmgen"),
        "c": ("stopped", 130, "stopped by slurmgen"),
        "b": ("failed", 3, "first failure: rank 1 exited with code 3"),
    }
    assert s.verdict == "rank 1 exited with code 3 on b"


def test_hung_event_is_124_and_error_event_is_a_failed_start():
    s, _ = run(fresh(), *opened(), *started(), m.Reported("c", NodeEvent("hung", 2, 4200), 103))
    assert s.code == exitcodes.HUNG and s.nodes["c"].state == "hung"
    assert s.verdict == "rank 2 hung (no heartbeat for 4.2 s) on c"
    s, actions = run(fresh(), *opened(), m.Reported("a", NodeEvent("error", message="no workdir"), 100.5))
    assert s.code == exitcodes.FAILED and s.nodes["a"].state == "error" and s.spared is None
    assert closed(actions) == ["a", "b", "c"]


def test_beats_are_judged_across_nodes_and_every_node_is_stopped():
    """a's rank 0 beat last longest ago (it waits in a collective); c's rank 2 is stopped."""
    s, _ = run(fresh(limits=m.Limits(heartbeat_ms=4000)), *opened(), *started())
    quiet_a = parse_event("slurmgen-event-1 beats 0:219:2100:running")
    quiet_c = parse_event("slurmgen-event-1 beats 2:220:2000:stopped")
    assert quiet_c is not None and quiet_c.beats == (LastBeat(2, 2000, 220, True),)
    s, actions = run(s, m.Reported("a", quiet_a, 102.0), m.Reported("c", quiet_c, 102.0), m.ClockTick(103.9, {}))
    assert actions == [] and s.stop_at is None  # rank 0 is 4.0 s old: not over the limit yet
    s, actions = run(s, m.ClockTick(104.05, {}))
    story = (
        "rank 2 on c stopped beating at step 220 (no heartbeat for 4.0 s, its process is stopped); "
        "rank 0 waited in a collective"
    )
    assert said(actions) == [f"stopping all nodes: {story}"] and closed(actions) == ["a", "b", "c"]
    assert (s.code, s.verdict, s.first_rank, s.nodes["c"].state) == (exitcodes.HUNG, story, 2, "hung")


def test_a_rank_is_judged_by_the_limit_it_learned_when_its_node_reports_one():
    """rank 1 learned 1 s from its own steps (the fifth field): named long before the fixed 60 s."""
    s, _ = run(fresh(limits=m.Limits(heartbeat_ms=60000)), *opened(), *started())
    quiet = parse_event("slurmgen-event-1 beats 1:40:600:stopped:1000")
    assert quiet is not None and quiet.beats == (LastBeat(1, 600, 40, True, limit_ms=1000),)
    assert parse_event("slurmgen-event-1 beats 1:40:600:stopped:x") is None
    s, actions = run(s, m.Reported("b", quiet, 102.0), m.ClockTick(102.3, {}))
    assert actions == [] and s.stop_at is None  # 0.9 s: under its own limit
    s, actions = run(s, m.ClockTick(102.5, {}))
    assert (s.code, s.first_rank) == (exitcodes.HUNG, 1) and closed(actions) == ["a", "b", "c"]


def _hang_asked(stack_wait=1.5):
    """Rank 2 on c judged hung at 104.05 with stack asking on: the state, and the actions then."""
    s, _ = run(fresh(limits=m.Limits(heartbeat_ms=4000, stack_wait=stack_wait)), *opened(), *started())
    return run(
        s, m.Reported("c", parse_event("slurmgen-event-1 beats 2:220:2000:stopped"), 102.0), m.ClockTick(104.05, {})
    )


def test_a_judged_hang_asks_the_node_for_the_rank_stack_and_stops_on_the_answer():
    s, actions = _hang_asked()
    assert actions == [m.AskStack("c", 2)] and s.stop_at is None and s.code == exitcodes.HUNG
    s, actions = run(
        s,
        m.Reported("b", parse_event("slurmgen-event-1 stack 2\t/x/t.py:9 f"), 104.2),
        m.Reported("c", parse_event("slurmgen-event-1 stack 1"), 104.2),
        m.ClockTick(104.3, {}),
    )
    assert actions == [] and s.stop_at is None  # neither the asked node nor the asked rank
    answer = parse_event("slurmgen-event-1 stack 2\t/x/my train.py:12 frozen_here\t/x/my train.py:30 <module>")
    assert answer is not None and answer.frames == ("/x/my train.py:12 frozen_here", "/x/my train.py:30 <module>")
    s, actions = run(s, m.Reported("c", answer, 104.6))
    story = (
        "rank 2 on c stopped beating at step 220 (no heartbeat for 4.0 s, its process is stopped); "
        "the other ranks kept beating; stuck in /x/my train.py:12 in frozen_here()"
    )
    assert said(actions) == [f"stopping all nodes: {story}"] and closed(actions) == ["a", "b", "c"]
    assert (s.verdict, s.first_rank, s.stop_at, s.nodes["c"].note) == (story, 2, 104.6, f"first failure: {story}")


def test_without_an_answer_every_node_is_stopped_when_the_wait_ends():
    s, _ = _hang_asked()
    s, actions = run(s, m.Reported("a", NodeEvent("exited", 0, 1), 104.5), m.ClockTick(105.5, {}))
    assert closed(actions) == [] and s.verdict.startswith("rank 2 on c stopped")  # the hang came first
    s, actions = run(s, m.ClockTick(105.56, {}))
    assert closed(actions) == ["a", "b", "c"] and s.verdict.endswith("the other ranks kept beating"), s.verdict
    s, actions = run(s, m.Reported("c", parse_event("slurmgen-event-1 stack 2"), 105.6))
    assert actions == [] and s.verdict.endswith("kept beating")  # too late, and no frame anyway


def test_a_signal_while_the_stack_is_awaited_stops_at_once():
    s, _ = _hang_asked()
    s, actions = run(s, m.Signalled(signal.SIGINT, 104.2))
    assert closed(actions) == ["a", "b", "c"] and s.code == exitcodes.HUNG


def test_a_node_whose_ranks_beat_again_withdraws_its_report():
    s, _ = run(fresh(limits=m.Limits(heartbeat_ms=4000)), *opened(), *started())
    s, _ = run(
        s,
        m.Reported("a", parse_event("slurmgen-event-1 beats 0:5:3000:running"), 102.0),
        m.Reported("a", parse_event("slurmgen-event-1 beats"), 102.5),
        m.ClockTick(110, {}),
    )
    assert s.stop_at is None and s.code == exitcodes.OK


def test_later_failures_are_noted_but_the_first_decides():
    s, _ = run(
        fresh(),
        *opened(),
        *started(),
        m.Reported("a", NodeEvent("exited", 0, 5), 102),
        m.Reported("c", NodeEvent("exited", 2, 9), 102.1),
        m.SessionEnded("b", None, 102.2),
    )
    assert s.code == 5 and s.first[0] == "a"
    assert (s.nodes["c"].state, s.nodes["c"].code, s.nodes["c"].note) == ("failed", 9, "after the first failure")
    assert (s.nodes["b"].state, s.nodes["b"].code) == ("lost", exitcodes.LOST)


def test_same_pass_failures_on_two_nodes_first_in_queue_order_wins():
    both = [m.Reported("c", NodeEvent("exited", 2, 4), 102), m.Reported("a", NodeEvent("exited", 0, 6), 102)]
    s, actions = run(run(fresh(), *opened(), *started())[0], *both)
    assert s.first == ("c", "rank 2 exited with code 4") and s.code == 4
    assert len(said(actions)) == 1 and closed(actions) == ["a", "b"]


def test_signal_and_failure_in_the_same_pass():
    s0, _ = run(fresh(), *opened(), *started())
    # The failure first: its code stands, the signal adds nothing but a note.
    s, actions = run(s0, m.Reported("a", NodeEvent("exited", 0, 7), 102), m.Signalled(signal.SIGINT, 102))
    assert s.code == 7 and s.signals == (signal.SIGINT,) and len(said(actions)) == 1
    # The signal first: 130, and the rank's later exit is a failure while stopping.
    s, actions = run(s0, m.Signalled(signal.SIGINT, 102), m.Reported("a", NodeEvent("exited", 0, 7), 102))
    assert s.code == exitcodes.INTERRUPTED and said(actions) == ["stopping all nodes: got SIGINT"]
    assert s.nodes["a"].note == "while stopping" and s.first is None
    s, _ = run(s, *[m.SessionEnded(h, 143, 102.5) for h in ("b", "c")], m.SessionEnded("a", 7, 102.5))
    assert s.done and s.verdict == "interrupted by SIGINT"


def test_second_signal_drops_every_connection():
    s, actions = run(fresh(), *opened(), m.Signalled(signal.SIGTERM, 101), m.Signalled(signal.SIGTERM, 101.2))
    assert s.code == exitcodes.TERMINATED
    assert said(actions)[-1] == "got SIGTERM again: closing every connection now"
    assert isinstance(actions[-1], m.DisconnectAll)


def test_exit_status_cases():
    s, _ = run(fresh(), *opened(), *started())
    s, _ = run(s, m.SessionEnded("a", 0, 102))
    assert s.nodes["a"].state == "ok" and s.first is None
    s, actions = run(s, m.SessionEnded("b", 143, 102))  # not stopping: 143 is a failure of its own
    assert s.first == ("b", "node exited with code 143") and closed(actions) == ["c"]
    s, _ = run(s, m.SessionEnded("c", None, 102.5))
    assert s.nodes["c"].state == "lost" and s.nodes["c"].note == "after the first failure" and s.done


def test_lost_session_of_a_node_that_already_failed_keeps_its_code():
    s, _ = run(
        fresh(),
        *opened(),
        *started(),
        m.Reported("a", NodeEvent("exited", 0, 3), 102),
        m.SessionEnded("a", None, 102.1),
    )
    assert (s.nodes["a"].state, s.nodes["a"].code) == ("failed", 3) and s.code == 3


def test_start_failure_and_late_session():
    s, actions = run(fresh(), m.SessionOpened("a", 100.1), m.StartFailed("b", "channel refused", 100.2))
    assert s.code == exitcodes.FAILED and s.nodes["b"].state == "error" and "b" not in s.pending
    assert closed(actions) == ["a"]  # c has no session yet ...
    s, actions = run(s, m.SessionOpened("c", 100.3))
    assert closed(actions) == ["c"]  # ... and is told to stop as soon as it has one
    s, actions = run(s, *started(hosts=("a", "c")))
    assert said(actions) == [] and not s.all_running  # b never ran


def test_inputs_for_finished_hosts_change_nothing():
    s, _ = run(fresh(), *opened(), m.SessionEnded("a", 0, 101))
    for late in (
        m.SessionEnded("a", None, 102),
        m.Reported("a", NodeEvent("exited", 0, 1), 102),
        m.SessionOpened("a", 102),
        m.StartFailed("a", "x", 102),
    ):
        assert m.step(s, late) == (s, [])


# ---- deadlines ---------------------------------------------------------------------------------
def test_keepalive_deadline_loses_a_silent_host_whatever_else_happens():
    s, _ = run(fresh(), *opened(), *started())
    s, actions = run(s, m.ClockTick(110, {"a": 15.0, "b": 0.0}))  # exactly at the limit: not yet
    assert actions == [] and s.first is None
    s, actions = run(s, m.ClockTick(110.1, {"a": 15.1, "b": 0.0}))
    assert s.code == exitcodes.LOST and s.first == ("a", "no answer from a for 20s")
    assert (s.nodes["a"].state, "a" in s.pending) == ("lost", False)
    assert m.Disconnect("a") in actions and closed(actions) == ["b", "c"]


def test_connect_deadline_for_a_node_without_a_session():
    s, _ = run(fresh(), m.SessionOpened("a", 100.1), m.SessionOpened("b", 100.1))
    s, actions = run(s, m.ClockTick(110.0, {}))
    assert actions == []
    s, actions = run(s, m.ClockTick(110.01, {}))
    assert s.first == ("c", "no session on c within 10s") and m.Disconnect("c") in actions
    assert s.nodes["c"].state == "error" and "c" not in s.pending


def test_stop_grace_then_stop_wait_deadlines():
    s, _ = run(fresh(), *opened(), *started(), m.Reported("b", NodeEvent("exited", 1, 3), 102.0))
    s, actions = run(s, m.ClockTick(102.9, {}))
    assert actions == []
    s, actions = run(s, m.ClockTick(103.0, {}))  # the failed node did not stop itself within the grace
    assert closed(actions) == ["b"] and s.spared is None
    s, actions = run(s, m.SessionEnded("a", 143, 103.5), m.ClockTick(107.9, {}))
    assert actions == [] and not s.done
    s, actions = run(s, m.ClockTick(108.0, {}))  # grace + wait after the stop: the rest are lost
    assert s.done and [a for a in actions if isinstance(a, m.Disconnect)] == [m.Disconnect("b"), m.Disconnect("c")]
    assert [(s.nodes[h].state, s.nodes[h].note) for h in ("b", "c")] == [
        ("lost", "no exit status after the stop"),
        ("lost", "no exit status after the stop"),
    ]
    assert s.code == 3  # the first failure still decides


def test_deadlines_met_in_the_same_tick():
    # Two hosts silent at once and one without a session: one verdict, every host dealt with.
    s, _ = run(fresh(), m.SessionOpened("a", 100.1), m.SessionOpened("b", 100.1))
    s, actions = run(s, m.ClockTick(120.5, {"a": 16.0, "b": 16.0}))
    assert s.first == ("a", "no answer from a for 20s")
    assert {h: s.nodes[h].note for h in HOSTS} == {
        "a": "first failure: no answer from a for 20s",
        "b": "after the first failure",
        "c": "after the first failure",
    }
    assert s.done and {a.host for a in actions if isinstance(a, m.Disconnect)} == set(HOSTS)


@pytest.mark.parametrize(
    "keepalive, count, overdue, lost", [(1.0, 3, 3.01, True), (1.0, 3, 2.99, False), (0.5, 2, 1.01, True)]
)
def test_keepalive_limit_follows_the_settings(keepalive, count, overdue, lost):
    limits = m.Limits(connect=10, keepalive=keepalive, keepalive_count=count, stop_grace=1, stop_wait=5)
    s, _ = run(fresh(("a",), limits), m.SessionOpened("a", 100.1), m.ClockTick(104, {"a": overdue}))
    assert (s.nodes["a"].state == "lost") is lost


def test_the_keepalive_defaults_are_the_contracts():
    """They were spelt in the state machine and the CLI beside contract/node_events.py."""
    from slurmgen.launch.cli import launch

    assert (m.Limits().keepalive, m.Limits().keepalive_count) == (KEEPALIVE_INTERVAL, KEEPALIVE_COUNT)
    assert inspect.signature(launch).parameters["keepalive"].default.default == KEEPALIVE_INTERVAL


@pytest.mark.parametrize(
    "code, stopped, attempt, again",
    [
        (exitcodes.FAILED, False, 1, True),
        (exitcodes.HUNG, False, 1, True),
        (exitcodes.LOST, False, 2, True),
        (139, False, 1, True),  # a rank killed by SIGSEGV
        (exitcodes.FAILED, False, 3, False),  # the last of 3 attempts
        (exitcodes.OK, False, 1, False),
        (exitcodes.BAD_INPUT, False, 1, False),  # a node started with another node count: so is the next
        (exitcodes.PREEMPTED, False, 1, False),
        (exitcodes.TERMINATED, True, 1, False),  # Ctrl-C, a stop request: whatever the code
    ],
)
def test_launch_restarts_after_a_failure_worth_a_retry(code, stopped, attempt, again):
    """--max-restarts 2: the retry rule of contract/retries.py (before, any code but 0 without a signal)."""
    assert m.restart_after(code, stopped, attempt, 3) is again
