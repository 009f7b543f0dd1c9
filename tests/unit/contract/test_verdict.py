"""The one verdict (slurmgen/contract/verdict.py) over many event sequences, and the node link's
own copy of its rule (slurmgen/nodelink/agent.py, which runs where slurmgen is not installed)
held to the same answers."""

from __future__ import annotations

import itertools
import random

import pytest

from slurmgen.contract import exitcodes, verdict
from slurmgen.contract.verdict import Event, decide
from slurmgen.nodelink import agent

OK0 = verdict.exited(0, "a", 0)
OK1 = verdict.exited(0, "b", 1)
OK2 = verdict.exited(0, "c", 2)
EXIT3 = verdict.exited(3, "b", 1, detail="rank 1 exited with code 3")
EXIT7 = verdict.exited(7, "c", 2)
HANG = verdict.failure(verdict.HUNG, "c", 2)
LOSS = verdict.failure(verdict.LOST, "a")
INT = verdict.signalled(2)
TERM = verdict.signalled(15)
ABSENT = verdict.failure(verdict.ABSENT, "c")
SRUN = verdict.exited(None, "node2", task=1, detail="Killed by signal 9")  # srun names no code


@pytest.mark.parametrize(
    "events, expected, first, code",
    [
        ([], 0, None, exitcodes.OK),  # nothing failed: success
        ([], 3, None, None),  # nobody ended yet: undecided
        ([OK0, OK1], 3, None, None),  # not everyone ended yet
        ([OK0, OK1, OK2], 3, None, exitcodes.OK),  # every party ended well
        ([EXIT3], 3, EXIT3, 3),
        ([OK0, EXIT3, OK2], 3, EXIT3, 3),  # clean exits do not count as failures
        ([EXIT3, EXIT7], 3, EXIT3, 3),  # the first failure wins...
        ([EXIT7, EXIT3], 3, EXIT7, 7),  # ...whichever it is
        ([HANG, EXIT3], 3, HANG, exitcodes.HUNG),  # a stale heartbeat before any exit
        ([LOSS, HANG], 3, LOSS, exitcodes.LOST),
        ([INT, EXIT3], 0, INT, exitcodes.INTERRUPTED),  # a rank failing while stopping is not the cause
        ([EXIT3, INT], 0, EXIT3, 3),  # a signal after the first failure changes nothing
        ([TERM, INT], 0, TERM, exitcodes.TERMINATED),  # the first signal names the code
        ([OK0, OK1, OK2, EXIT3], 3, EXIT3, 3),  # a failure after every clean exit still fails
        ([ABSENT], 3, ABSENT, exitcodes.HUNG),  # a node that never showed up: as timeout(1)
        ([verdict.failure(verdict.MISMATCH, "b")], 2, verdict.failure(verdict.MISMATCH, "b"), exitcodes.BAD_INPUT),
        (
            [verdict.failure(verdict.ERROR, "b", detail="no session")],
            0,
            verdict.failure(verdict.ERROR, "b", detail="no session"),
            exitcodes.FAILED,
        ),
        ([SRUN, EXIT3], 0, SRUN, None),  # a failure without a code is still a failure
        ([verdict.exited(255, "a")], 0, verdict.exited(255, "a"), 255),  # an exit keeps its own code
    ],
)
def test_the_first_failure_wins_with_its_code(events, expected, first, code):
    seen = decide(events, expected)
    assert (seen.first, seen.code) == (first, code)
    assert seen.failed == (first is not None)
    assert seen.ended == (first is not None or code is not None)


def test_every_cause_but_an_exit_is_a_failure_whatever_its_code():
    for cause in verdict.CAUSES:
        assert Event(cause, 0).failed == (cause != verdict.EXITED)
    assert set(verdict.CODES) | {verdict.EXITED, verdict.SIGNALLED} == set(verdict.CAUSES)
    assert verdict.signalled(2).code == exitcodes.INTERRUPTED and verdict.signalled(15).code == exitcodes.TERMINATED


def test_the_verdict_is_the_first_failure_of_any_sequence():
    # Every sequence of up to 4 events of this alphabet: the verdict is the first event that is
    # not a clean exit, and without one the count of clean exits against `expected`.
    alphabet = [OK0, OK1, EXIT3, EXIT7, HANG, LOSS, INT]
    for n in range(5):
        for events in itertools.product(alphabet, repeat=n):
            failures = [e for e in events if e.failed]
            for expected in (0, 2, 3):
                seen = decide(events, expected)
                if failures:
                    assert (seen.first, seen.code) == (failures[0], failures[0].code), events
                else:
                    assert seen.first is None
                    assert seen.code == (exitcodes.OK if len(events) >= expected else None), events


@pytest.mark.parametrize(
    "event, text",
    [
        (verdict.failure(verdict.HUNG, "n2", 3), "hung (rank 3 on n2)"),
        (verdict.exited(3, "gpu07", 0), "exit 3 (rank 0 on gpu07)"),
        (verdict.exited(3, "n2", task=1), "exit 3 (task 1 on n2)"),
        (verdict.exited(3, "n2"), "exit 3 (n2)"),
        (verdict.exited(3), "exit 3"),
        (verdict.exited(137, "n1", 2), "killed by signal 9 (rank 2 on n1)"),
        (verdict.exited(None, "n1", 2), "unknown"),
    ],
)
def test_summary(event, text):
    assert verdict.summary(event) == text


# ---- the node link's copy of the rule --------------------------------------------------------
# The agent's words for what failed (its wire protocol) -> the verdict's causes.
KINDS = {
    "rank": verdict.EXITED,
    "signal": verdict.SIGNALLED,
    "lost": verdict.LOST,
    "absent": verdict.ABSENT,
    "nnodes": verdict.MISMATCH,
}


def test_the_agent_gives_each_kind_the_verdict_s_code():
    assert {verdict.CODES[KINDS[kind]] for kind in agent.KIND_CODES} == set(agent.KIND_CODES.values())
    for kind, code in agent.KIND_CODES.items():
        assert verdict.CODES[KINDS[kind]] == code, kind


def as_event(e: agent.Failed | agent.Done) -> Event:
    if isinstance(e, agent.Done):
        return verdict.exited(0, str(e.node))
    return Event(KINDS[e.kind], e.code, str(e.node), None if e.rank == "-" else int(e.rank))


def master_steps(events: list, nnodes: int):
    """The master's code and the first failure it named after each event, from its pure step()."""
    link, named = agent.Link(0, nnodes), None
    for e in events:
        link, actions = agent.step(link, e)
        for action in actions:
            if isinstance(action, agent.Finish):
                assert named is None, "the master ends once"
                named = action.cause
        yield link.code, named


# (A launcher says `failed RANK CODE` only for a code other than 0: launch_multi_node.sh.j2.)
LINK_ALPHABET = [
    agent.Done(0),
    agent.Done(1),
    agent.Done(2),
    agent.Failed(1, "3", 7, "rank"),
    agent.Failed(0, "0", 1, "rank"),
    agent.Failed(2, "5", 137, "rank"),
    agent.Failed(0, "-", exitcodes.INTERRUPTED, "signal"),
    agent.Failed(2, "-", exitcodes.LOST, "lost"),
    agent.Failed("1,2", "-", exitcodes.HUNG, "absent"),
    agent.Failed(1, "-", exitcodes.BAD_INPUT, "nnodes"),
]


def link_sequences():
    """Every sequence of up to 4 link events (a node says done at most once), and 300 random
    longer ones."""
    for n in range(5):
        yield from itertools.product(LINK_ALPHABET, repeat=n)
    rng = random.Random(21)
    for _ in range(300):
        yield [rng.choice(LINK_ALPHABET) for _ in range(rng.randint(5, 12))]


def test_the_node_link_s_master_decides_as_the_verdict():
    # After every event: the master's answer is the verdict on the events so far; once it has
    # ended it hears nothing more (its loop ends), so nothing after changes its answer.
    checked = 0
    for events in link_sequences():
        dones = [e.node for e in events if isinstance(e, agent.Done)]
        if len(dones) != len(set(dones)):
            continue
        for nnodes in (2, 3):
            if any(isinstance(e, agent.Done) and e.node >= nnodes for e in events):
                continue
            ended = None
            for n, (code, named) in enumerate(master_steps(list(events), nnodes), 1):
                if ended is not None:
                    assert (code, named) == ended, events
                    continue
                seen = decide([as_event(e) for e in events[:n]], expected=nnodes)
                assert code == seen.code, events[:n]
                assert named == as_cause(seen.first), events[:n]
                if code is not None:
                    ended = (code, named)
                checked += 1
    assert checked > 10000


def as_cause(first: Event | None) -> tuple | None:
    """The verdict's first failure in the agent's words: (node, rank, code, kind)."""
    if first is None:
        return None
    kind = next(k for k, cause in KINDS.items() if cause == first.cause)
    node = int(first.node) if first.node.isdigit() else first.node
    return node, "-" if first.rank is None else str(first.rank), first.code, kind
