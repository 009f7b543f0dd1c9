"""The learned hang timeout (contract/hangs.py): the statistic the writer publishes and the rule
every watcher applies to a beat."""

from __future__ import annotations

import pytest

from slurmgen.contract import envvars, hangs


def test_p99_is_a_value_that_occurred_the_max_below_a_hundred_samples():
    assert hangs.p99([0.2] * 19 + [0.9]) == 0.9
    assert hangs.p99([float(i) for i in range(1, 201)]) == 198.0


def test_the_timeout_is_the_period_plus_k_times_p99_or_the_floor():
    steps = [0.2] * 30
    assert hangs.learned_timeout(steps, factor=3, floor=0.1, period=0.25, least=20) == 0.85
    assert hangs.learned_timeout(steps, factor=3, floor=10, period=1, least=20) == 11.0  # the floor
    assert hangs.learned_timeout(steps[:19], factor=3, floor=0.1, period=0.25, least=20) is None  # too few
    assert hangs.learned_timeout(steps, factor=0, floor=0.1, period=0.25, least=20) is None  # off
    # a slow step the window forgot still counts: this run's normal
    assert hangs.learned_timeout(steps, factor=3, floor=0.1, period=0.25, least=20, longest=4.0) == 4.25


@pytest.mark.parametrize(
    ("beat", "limit", "if_stopped"),
    [
        ({"status": "running"}, 60.0, 60.0),  # start-up: nothing learned, the fixed one
        ({"status": "running", "timeout": 0.85}, 0.85, 0.85),  # a step: learned
        ({"status": "running", "timeout": 600}, 60.0, 60.0),  # the fixed one stays the ceiling
        ({"status": "running", "timeout": True}, 60.0, 60.0),  # not a number: ignored
        ({"status": "evaluating"}, None, 60.0),  # an evaluation nothing was learned of: only if stopped
        ({"status": "evaluating", "timeout": 90.5}, 90.5, 60.0),  # learned from earlier evaluations
        ({"status": "checkpointing"}, None, 60.0),  # a first checkpoint, or the last write's wait
        ({"status": "checkpointing", "timeout": 35}, 35.0, 35.0),  # learned from earlier stalls
        ({"status": "starting"}, None, None),  # waiting for its world: the rendezvous bounds it
        ({"status": "done"}, None, None),
    ],
)
def test_the_watchers_rule(beat, limit, if_stopped):
    """A stopped process makes no progress in any phase: it is judged as a stepping one, so a rank
    stopped inside a checkpoint no longer holds every rank of the job still, unjudged."""
    assert hangs.beat_limit({"time": 1.0, **beat}, fixed=60.0) == limit
    assert hangs.beat_limit({"time": 1.0, **beat}, fixed=60.0, stopped=True) == if_stopped


def test_settings_come_from_the_environment_with_sane_defaults():
    assert hangs.settings({}) == (hangs.DEFAULT_FACTOR, hangs.DEFAULT_FLOOR)
    assert hangs.settings({envvars.HANG_FACTOR: "2.5", envvars.HANG_FLOOR: "0.5"}) == (2.5, 0.5)
    assert hangs.settings({envvars.HANG_FACTOR: "x", envvars.HANG_FLOOR: "-1"}) == (
        hangs.DEFAULT_FACTOR,
        hangs.DEFAULT_FLOOR,
    )


def test_the_stack_signal_is_neither_preemption_signal():
    assert hangs.STACK_SIGNAL not in ("USR1", "USR2", "TERM", "INT", "KILL")
