"""The server's hang judgement across agents (slurmgen/coordinator/group_blame.py): the contract's
rule over every worker's last quiet beat, each aged by the time since its report."""

from slurmgen.coordinator import state as st
from slurmgen.coordinator.group_blame import SlotReport, judge

RANKS = {"n1-0": 0, "n1-1": 1, "n2-0": 2, "n2-1": 3}


def test_the_stopped_rank_on_another_node_is_named_not_the_oldest_waiting_one():
    quiet = {
        "n1-0": SlotReport("n1", 3.5, 219, False, at=100.0),
        "n1-1": SlotReport("n1", 3.4, 219, False, at=100.0),
        "n2-0": SlotReport("n2", 2.9, 219, False, at=100.5),
        "n2-1": SlotReport("n2", 3.0, 220, True, at=100.5),
    }
    assert judge(quiet, RANKS, limit=4.0, now=101.0) is None  # rank 3 is 3.5 s old; the others wait
    worker, story = judge(quiet, RANKS, limit=4.0, now=101.6)
    assert worker == "n2-1"
    assert story == (
        "rank 3 on n2 stopped beating at step 220 (no heartbeat for 4.1 s, its process is stopped); "
        "ranks 0-2 waited in a collective"
    )
    outcome = st.judge_attempt("running", RANKS, {}, set(RANKS), {worker}, {}, {worker: story})
    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", story, 124)


def test_without_a_stopped_rank_the_oldest_is_named_after_the_deferral():
    quiet = {"n1-0": SlotReport("n1", 4.2, 9, False, at=100.0), "n2-1": SlotReport("n2", 4.0, 9, False, at=100.0)}
    assert judge(quiet, RANKS, limit=4.0, now=100.5) is None
    assert judge(quiet, RANKS, limit=4.0, now=100.9)[0] == "n1-0"
    assert judge(quiet, {"n2-1": 3}, limit=4.0, now=101.5)[0] == "n2-1"  # another attempt's workers are not its
