"""The node link's pure rule, `agent.step` (no sockets, no clock): what the master and a worker
decide and do for each input. (test_nodelink.py runs the agents as processes; test_verdict.py
holds the master's verdict to the contract's.)"""

from __future__ import annotations

from slurmgen.contract import exitcodes
from slurmgen.nodelink import agent
from slurmgen.nodelink.agent import Done, Ended, Failed, Finish, LauncherDied, Link, MasterGone, Send, StopRanks, Tick

LOST_CAUSE = (0, "-", exitcodes.LOST, "lost")


def run(link: Link, *inputs) -> tuple[Link, list]:
    actions: list = []
    for event in inputs:
        link, more = agent.step(link, event)
        actions += more
    return link, actions


def test_the_master_names_the_first_failure_to_every_node_once():
    link, actions = run(Link(0, 3), Failed(2, "5", 3, "rank"), Failed(1, "-", exitcodes.LOST, "lost"))
    assert link.code == 3
    assert actions == [Send("stop 2 5 3 rank"), Finish(3, (2, "5", 3, "rank"))]


def test_the_master_ends_well_once_every_node_is_done():
    link, actions = run(Link(0, 3), Done(0), Done(2))
    assert link.code is None and actions == []
    link, actions = run(link, Done(1), Failed(1, "0", 9, "rank"))
    assert link.code == 0 and actions == [Finish(0, None)]


def test_a_worker_waits_for_the_master_s_answer_then_takes_its_own_failure():
    link, actions = run(Link(1, 2, start_by=50), Failed(1, "3", 7, "rank", at=100.0))
    assert actions == [Send("failed 3 7 rank")] and link.code is None
    link, actions = run(link, Tick(100.0 + agent.ANSWER_WITHIN - 0.01))
    assert actions == [] and link.code is None
    _, actions = run(link, Tick(100.0 + agent.ANSWER_WITHIN))
    assert actions == [Finish(7, (1, "3", 7, "rank"))]
    # The master's answer names the job's first failure, which may be another node's.
    stopped, actions = run(link, Ended(143, ("0", "-", "143", "signal")), Tick(200.0))
    assert stopped.code == 143 and actions == [Finish(143, ("0", "-", "143", "signal"))]


def test_a_worker_done_before_the_start_timeout_waits_for_the_bye_after_it():
    link, actions = run(Link(1, 2, start_by=60.0), Done(1, at=10.0))
    assert actions == [Send("done")] and link.leave == (60.0 + agent.BYE_WITHIN, 0, None)
    assert run(link, Ended(0))[1] == [Finish(0, None)]


def test_a_worker_whose_master_goes_away():
    starting = Link(1, 2)
    assert run(starting, MasterGone(ready=False)) == (starting, [])  # not linked yet: try again
    assert run(starting, MasterGone(ready=True))[1] == [Finish(exitcodes.LOST, LOST_CAUSE)]
    done, _ = run(starting, Done(1))
    assert run(done, MasterGone(ready=True))[1] == [Finish(0, None)]  # its job here was over


def test_a_dead_launcher_s_ranks_are_stopped_by_the_agent():
    cause = (1, "-", exitcodes.LOST, "lost")
    _, actions = run(Link(1, 2), LauncherDied())
    assert actions == [Send("failed - 255 lost"), StopRanks(), Finish(exitcodes.LOST, cause)]
    _, actions = run(Link(0, 2), LauncherDied())
    assert actions == [Send("stop 0 - 255 lost"), Finish(exitcodes.LOST, (0, "-", 255, "lost")), StopRanks()]
    # Even once the end is decided: the launcher is gone, nobody else will stop them.
    decided, _ = run(Link(0, 2), Failed(1, "2", 3, "rank"))
    assert run(decided, LauncherDied())[1] == [StopRanks()]


def test_after_the_end_nothing_changes():
    ended, _ = run(Link(0, 2), Failed(1, "2", 3, "rank"))
    assert run(ended, Failed(0, "0", 9, "rank"), Done(0), Done(1), Tick(1e9)) == (ended, [])
