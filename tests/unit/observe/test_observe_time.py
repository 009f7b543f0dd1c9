"""The pure readers of the timeline protocol on tables: the per-rank timeline, stragglers and
goodput (slurmgen/observe), with the records a run's ranks and its batch script write."""

from __future__ import annotations

import json

import pytest

from slurmgen.observe import goodput, stragglers, timeline
from slurmgen.observe.report import analyse, lines
from slurmgen.observe.timeline import format_timeline

T0 = 1_000_000.0


def ev(event, rank, t, attempt=1, **kw):
    return {"event": event, "rank": rank, "attempt": attempt, "time": T0 + t, "host": f"n{rank // 2}", "pid": 1, **kw}


def rank_events(rank, offset=0.0, attempt=1, t0=0.0, steps=(0, 100), ckpts=(), end="done"):
    """A rank's attempt: phases at t0 + 1, 2, 3 (+ offset); step first + k done at t0 + 2 + k."""
    first, last = steps
    out = [
        ev("process", rank, t0 + 0.5, attempt),
        ev("imports", rank, t0 + 1 + offset, attempt),
        ev("rendezvous", rank, t0 + 2 + offset, attempt),
        ev("first_step", rank, t0 + 3 + offset, attempt, step=first + 1),
    ]
    for s in ckpts:
        out.append(ev("checkpoint", rank, t0 + 2 + (s - first), attempt, step=s, stall=0.5))
    if end:
        out.append(ev("end", rank, t0 + 2 + (last - first), attempt, step=last, status=end))
    return out


def test_the_timeline_has_every_phase_per_rank_since_the_allocation_and_names_the_slowest():
    events = [e for r in range(4) for e in rank_events(r, offset=2.0 if r == 3 else 0.0, ckpts=(50,))]
    attempts = [{"event": "start", "attempt": 1, "time": T0}, {"event": "end", "attempt": 1, "time": T0 + 110}]
    view = timeline.build(events, attempts, submitted=T0 - 30)
    (a,) = view["attempts"]
    assert a["queued"] == 30 and a["start"] == T0 and a["end"] == T0 + 110
    r3 = a["ranks"][3]
    assert (r3["process"], r3["imports"], r3["rendezvous"], r3["first_step"]) == (0.5, 3.0, 4.0, 5.0)
    assert (r3["checkpoints"], r3["checkpoint_stall"], r3["status"], r3["last_step"]) == (1, 0.5, "done", 100)
    assert a["slowest"]["imports"] == {"rank": 3, "at": 3.0} and a["slowest"]["first_step"]["rank"] == 3
    text = format_timeline(view)
    assert text[0].startswith("attempt 1 (seconds since the attempt started, queued 30.0s)")
    assert text[-1].split()[:5] == ["slowest", "3", "3", "3", "3"], text  # process: the last of a tie


def test_a_missing_phase_is_a_dash_and_a_missing_attempts_record_starts_at_the_first_event():
    events = [ev("process", 0, 1.0), ev("first_step", 0, 4.0, step=1), ev("junk", 0, 2.0), {"event": "imports"}]
    view = timeline.build(events)
    (a,) = view["attempts"]
    assert a["start"] == T0 + 1 and a["ranks"][0]["imports"] is None and a["ranks"][0]["first_step"] == 3.0
    assert " - " in format_timeline(view)[1 + 1]
    assert format_timeline({"attempts": []})[0].startswith("no timeline recorded")


def samples(rank, per_step, steps=100, every=10, attempt=1):
    """first_step at 1, a step sample every `every` steps with `per_step` seconds of work each."""
    out = [ev("first_step", rank, 0, attempt, step=1)]
    out += [ev("steps", rank, s, attempt, step=s, work=per_step * every) for s in range(every, steps + 1, every)]
    return out


@pytest.mark.parametrize(
    "slow, factor, min_steps, flagged",
    [
        (0.10, 1.5, 20, True),  # 10x slower for all 100 steps
        (0.014, 1.5, 20, False),  # 1.4x: under the factor
        (0.10, 1.5, 101, False),  # slower, but for fewer steps than asked
        (0.02, 1.9, 20, True),  # 2x against a factor of 1.9
    ],
)
def test_a_rank_slower_than_the_median_by_the_factor_for_enough_steps_is_a_straggler(slow, factor, min_steps, flagged):
    by_rank = {r: samples(r, slow if r == 1 else 0.01) for r in range(4)}
    found = stragglers.from_events(by_rank, factor, min_steps)
    assert [s["rank"] for s in found] == ([1] if flagged else [])
    if flagged:
        assert found[0]["steps"] == 100 and (found[0]["from_step"], found[0]["to_step"]) == (1, 100)
        assert found[0]["ratio"] == pytest.approx(slow / 0.01, rel=0.01)


def test_a_short_slow_spell_is_not_a_straggler_and_a_long_one_is_counted_from_where_it_began():
    by_rank = {r: samples(r, 0.01) for r in (0, 2, 3)}
    # rank 1: slow over steps 41-50 only (10 steps), then slow again over 61-100 (40 steps)
    works = {10: 0.1, 20: 0.1, 30: 0.1, 40: 0.1, 50: 1.0, 60: 0.1, 70: 1.0, 80: 1.0, 90: 1.0, 100: 1.0}
    by_rank[1] = [ev("first_step", 1, 0, step=1)] + [ev("steps", 1, s, step=s, work=w) for s, w in works.items()]
    (s,) = stragglers.from_events(by_rank, 1.5, 20)
    assert (s["rank"], s["steps"], s["from_step"], s["to_step"]) == (1, 40, 61, 100)
    assert stragglers.from_events(by_rank, 1.5, 41) == []
    assert stragglers.step_times(by_rank)[0] == pytest.approx(0.01)


def test_uneven_sample_windows_are_compared_step_by_step():
    """Ranks sample at their own moments: windows of different lengths still line up by step."""
    by_rank = {0: samples(0, 0.01, every=10), 1: samples(1, 0.05, every=25), 2: samples(2, 0.01, every=20)}
    (s,) = stragglers.from_events(by_rank, 1.5, 20)
    assert (s["rank"], s["steps"]) == (1, 100)
    assert stragglers.from_events({0: samples(0, 0.01)}) == []  # one rank: nothing to compare with


def test_goodput_of_a_run_that_failed_once_and_resumed_from_its_checkpoint():
    """Attempt 1: allocation at 0, first step at 3, a checkpoint at step 50 (t=52, 0.5 s stall),
    dies at step 80 (t=82), ends at 90. Attempt 2: allocation at 100, resumes from step 50:
    first step (51) at 103, done at step 100 (t=152), ends at 155."""
    a0 = [e for r in range(2) for e in rank_events(r, steps=(0, 80), ckpts=(50,), end=None)]
    a0 += [ev("steps", r, 82, 1, step=80, work=1) for r in range(2)]
    a1 = [e for r in range(2) for e in rank_events(r, attempt=2, t0=100, steps=(50, 100))]
    attempts = [
        {"event": "start", "attempt": 1, "time": T0},
        {"event": "end", "attempt": 1, "time": T0 + 90},
        {"event": "start", "attempt": 2, "time": T0 + 100},
        {"event": "end", "attempt": 2, "time": T0 + 155},
    ]
    g = goodput.compute(a0 + a1, attempts, submitted=T0 - 20)
    b = g["breakdown"]
    assert g["wall"] == 155 and g["queue"] == 20
    assert g["lost_steps"] == [{"attempt": 1, "from_step": 50, "to_step": 80, "steps": 30, "seconds": 30.0}]
    assert (b["startup"], b["checkpoint"], b["lost"], b["restart"], b["other"]) == (6.0, 0.5, 30.0, 18.0, 3.0)
    assert b["productive"] == pytest.approx(155 - 6 - 0.5 - 30 - 18 - 3)
    assert g["goodput"] == pytest.approx(b["productive"] / 155, abs=1e-4)
    assert goodput.summary(g).startswith(
        f"goodput {100 * g['goodput']:.1f}% of 155.0s (startup 6.0s, checkpoint 0.5s, "
        "lost 30.0s over 30 steps, restart 18.0s, other 3.0s); queued 20.0s before"
    )


def test_goodput_of_a_running_job_counts_to_now_and_of_a_job_that_never_stepped_is_unknown():
    events = rank_events(0, steps=(0, 10), end=None)
    g = goodput.compute(events, [{"event": "start", "attempt": 1, "time": T0}], now=T0 + 20)
    assert g["wall"] == 20 and g["breakdown"]["startup"] == 3.0
    assert goodput.compute([ev("process", 0, 1), ev("imports", 0, 2)]) is None


def test_status_lines_come_from_the_files_text():
    events = [e for r in range(4) for e in samples(r, 0.2 if r == 2 else 0.01)]
    import json

    found = analyse("\n".join(json.dumps(e) for e in events) + "\ncut sho", [], None, T0 + 200)
    assert [s["rank"] for s in found["stragglers"]] == [2] and found["step_work"]["2"] == pytest.approx(0.2)
    text = lines(found)
    assert (
        text[0].startswith("  stragglers: rank 2 20.0x the median for 100 steps (1-100, attempt 1)")
        and "goodput" in text[1]
    )
    assert analyse("", [], None, T0) == {}


def test_a_hang_is_lost_time_from_the_last_beat_not_training():
    """Issue 33, item 4: a job frozen 15 s of its run read "lost 0.0 s". Two ranks step to 20 (t=22);
    rank 1 freezes; the watcher ends the attempt at t=37 with code 124 naming rank 1."""
    events = [e for r in range(2) for e in rank_events(r, steps=(0, 20), end=None)]
    events += [ev("steps", r, 22, 1, step=20, work=1) for r in range(2)]
    attempts = [
        {"event": "start", "attempt": 1, "time": T0},
        {"event": "end", "attempt": 1, "time": T0 + 37, "exit_code": 124, "hung_rank": 1, "node": "n0"},
    ]
    g = goodput.compute(events, attempts)
    b = g["breakdown"]
    assert (b["hung"], b["other"], b["startup"]) == (15.0, 0.0, 3.0)
    assert b["productive"] == pytest.approx(37 - 3 - 15)
    assert "hung 15.0s" in goodput.summary(g)
    (a,) = timeline.build(events, attempts)["attempts"]
    assert (a["hung_rank"], a["code"]) == (1, 124) and [r["last_at"] for r in a["ranks"]] == [22.0, 22.0]


def test_a_hang_counts_from_the_beat_the_watcher_judged_not_the_steps_after_it():
    """Seen on the test cluster: rank 1 frozen at step 20 (t=22), judged hung there; woken by the
    watcher to give its stack it stepped on to 25 (t=36.9), and rank 0 wrote its last step 26 as it
    died (t=36.9): goodput counted 0.1 s hung, the timeline drew rank 1 training to the end. The
    hang runs from the judged beat."""
    events = [e for r in range(2) for e in rank_events(r, steps=(0, 20), end=None)]
    events += [ev("steps", r, 22, 1, step=20, work=1) for r in range(2)]
    events += [ev("steps", 1, 36.9, 1, step=25, work=1), ev("steps", 0, 36.9, 1, step=26, work=1)]
    end = {"event": "end", "attempt": 1, "time": T0 + 37, "exit_code": 124, "hung_rank": 1, "hung_step": 20}
    attempts = [{"event": "start", "attempt": 1, "time": T0}, end]
    b = goodput.compute(events, attempts)["breakdown"]
    assert b["hung"] == pytest.approx(15.0), b
    (a,) = timeline.build(events, attempts)["attempts"]  # the hung rank's bar: hung from t=22
    assert [(r["last_at"], r["last_step"]) for r in a["ranks"]] == [(36.9, 26), (22.0, 25)], a["ranks"]


def test_a_hang_a_restart_answered_is_hung_time_once_not_lost_time_too():
    """Rank 1 frozen at step 20 (t=22), judged there, woken to give its stack (the ranks step on to
    25, 26 as they are stopped at t=36.9), the attempt ends at t=37; attempt 2 starts at t=40 from
    the checkpoint of step 10. Steps 11-20 (t=12-22) were lost; t=22-37 was the hang's: counted as
    lost too, goodput read 42.6 s productive instead of 57.5 s."""
    events = [e for r in range(2) for e in rank_events(r, steps=(0, 20), ckpts=(10,), end=None)]
    events += [ev("steps", r, 22, 1, step=20, work=1) for r in range(2)]
    events += [ev("steps", 1, 36.9, 1, step=25, work=1), ev("steps", 0, 36.9, 1, step=26, work=1)]
    events += [e for r in range(2) for e in rank_events(r, attempt=2, t0=40, steps=(10, 60))]
    attempts = [
        {"event": "start", "attempt": 1, "time": T0},
        {"event": "end", "attempt": 1, "time": T0 + 37, "exit_code": 124, "hung_rank": 1, "hung_step": 20},
        {"event": "start", "attempt": 2, "time": T0 + 40},
        {"event": "end", "attempt": 2, "time": T0 + 93},
    ]
    g = goodput.compute(events, attempts)
    b = g["breakdown"]
    assert (b["lost"], b["hung"], b["restart"], b["checkpoint"]) == (10.0, 15.0, 3.0, 0.5), b
    assert b["productive"] == pytest.approx(93 - 6 - 0.5 - 10 - 15 - 3 - 1), b
    assert [(x["from_step"], x["seconds"]) for x in g["lost_steps"]] == [(10, 10.0)]


def test_a_rank_frozen_inside_a_checkpoint_is_hung_time_not_a_checkpoint_stall():
    """Rank 1 stopped inside the checkpoint of step 20 (entered at t=22); rank 0 waits in it until
    both are stopped at t=37 and then records a 15 s stall. The hang is judged at step 20: the
    15 s are hung once, not a checkpoint stall as well (a checkpoint that ended at the judged beat
    still counts whole)."""
    events = [e for r in range(2) for e in rank_events(r, steps=(0, 20), ckpts=(10,), end=None)]
    events += [ev("steps", r, 22, 1, step=20, work=1) for r in range(2)]
    events += [ev("checkpoint", 0, 37, 1, step=20, stall=15.0)]
    attempts = [
        {"event": "start", "attempt": 1, "time": T0},
        {"event": "end", "attempt": 1, "time": T0 + 37.2, "exit_code": 124, "hung_rank": 1, "hung_step": 20},
    ]
    b = goodput.compute(events, attempts)["breakdown"]
    assert (b["hung"], b["checkpoint"]) == (pytest.approx(15.2), 0.5), b


def test_a_rank_that_waited_for_a_hung_peer_is_no_straggler():
    """Issue 33: rank 0, blocked in an all-reduce for frozen rank 1, was flagged a straggler
    (8.9x-26x): its work per step after rank 1's last beat is the wait. Two ranks step at 0.01 s
    of work to step 40 (t=40), rank 1 freezes there, judged hung at step 40; woken at t=60 to give
    its stack, both step on to 70, rank 0's window holding 20 s of waiting. The straggler rule
    reads the steps up to the judged beat only; a real straggler before the hang stays named."""

    def run(rank1_work):
        out = []
        for r, work in ((0, 0.01), (1, rank1_work)):
            out.append(ev("first_step", r, 0, step=1))
            out += [ev("steps", r, s, step=s, work=work * 10) for s in range(10, 41, 10)]
        out += [ev("steps", 0, 60.5, step=70, work=20 + 0.3), ev("steps", 1, 60.5, step=70, work=0.3)]
        return "".join(json.dumps(e) + "\n" for e in out)

    end = {"event": "end", "attempt": 1, "time": T0 + 61, "exit_code": 124, "hung_rank": 1, "hung_step": 40}
    attempts = [{"event": "start", "attempt": 1, "time": T0}, end]
    assert [s["rank"] for s in analyse(run(0.01), [], None, T0 + 61)["stragglers"]] == [0]  # without the end
    assert analyse(run(0.01), attempts, None, T0 + 61)["stragglers"] == []
    (slow,) = analyse(run(0.05), attempts, None, T0 + 61)["stragglers"]  # rank 1 5x slower before it froze
    assert (slow["rank"], slow["to_step"], slow["ratio"]) == (1, 40, 5.0)


def test_a_crash_that_ends_the_run_loses_its_steps_past_the_last_checkpoint():
    """A last attempt that crashed (exit 1) at step 80 with a checkpoint at 50: no later attempt
    redid them, still those 30 steps' work is lost; a run that ended well loses nothing."""
    events = [e for r in range(2) for e in rank_events(r, steps=(0, 80), ckpts=(50,), end=None)]
    events += [ev("steps", r, 82, 1, step=80, work=1) for r in range(2)]
    start = {"event": "start", "attempt": 1, "time": T0}
    crashed = goodput.compute(events, [start, {"event": "end", "attempt": 1, "time": T0 + 90, "code": 1, "rank": 0}])
    assert crashed["lost_steps"] == [{"attempt": 1, "from_step": 50, "to_step": 80, "steps": 30, "seconds": 30.0}]
    assert (crashed["breakdown"]["lost"], crashed["breakdown"]["other"]) == (30.0, 8.0)
    stopped = {"event": "end", "attempt": 1, "time": T0 + 90, "code": 143, "state": "stopped"}
    assert goodput.compute(events, [start, stopped])["breakdown"]["lost"] == 0.0  # a person's stop is no crash


def test_a_warm_restart_is_a_recovery_inside_its_attempt_not_start_up():
    """Issue 35: a warm restart keeps the healthy ranks' processes, so no attempt ends; goodput
    read the fresh rank's first step as the attempt's and counted everything before it start-up
    (0% for a run with a warm restart every minute). Attempt 1, 2 ranks: first step at 3, a
    checkpoint at step 50 (t=52, 0.5 s stall), rank 1 killed after step 60 (last sample t=62).
    Generation 1: rank 0 (its process kept) resumes from 50 and steps at 64, the fresh rank 1 at
    65: every rank stepping again 3 s after the fault; done at step 100 (t=115), ends at 117."""
    events = [e for r in range(2) for e in rank_events(r, steps=(0, 60), ckpts=(50,), end=None)]
    events += [ev("steps", r, 62, 1, step=60, work=1) for r in range(2)]
    again = [ev("first_step", 0, 64, step=51), ev("process", 1, 62.5), ev("first_step", 1, 65, step=51)]
    again += [ev("end", r, 115, step=100, status="done") for r in range(2)]
    events += [{**e, "generation": 1} for e in again]
    attempts = [{"event": "start", "attempt": 1, "time": T0}, {"event": "end", "attempt": 1, "time": T0 + 117}]
    g = goodput.compute(events, attempts)
    b = g["breakdown"]
    assert g["lost_steps"] == [
        {"attempt": 1, "from_step": 50, "to_step": 60, "steps": 10, "seconds": 10.0, "generation": 1}
    ]
    assert (b["startup"], b["checkpoint"], b["lost"], b["restart"], b["other"]) == (3.0, 0.5, 10.0, 3.0, 2.0)
    assert b["productive"] == pytest.approx(117 - 3 - 0.5 - 10 - 3 - 2) and g["goodput"] > 0.8
    # The same run as two attempts (a cold restart at the same moments) loses the same steps.
    cold = [{**e, "attempt": 2} if e.get("generation") else e for e in events]
    restarted = goodput.compute(cold, [])
    assert [(x["from_step"], x["to_step"]) for x in restarted["lost_steps"]] == [(50, 60)]


def test_warm_restarts_one_after_another_and_one_whose_world_never_formed():
    """Two warm restarts in one attempt, each world resuming from its own checkpoint; then a third
    whose new world never stepped (the fresh rank only started): the launcher restarted the whole
    job as attempt 2, and the time from the last world's last step to it is restart."""
    w0 = [e for r in range(2) for e in rank_events(r, steps=(0, 30), ckpts=(20,), end=None)]
    w0 += [ev("steps", r, 32, step=30, work=1) for r in range(2)]
    w1 = [ev("first_step", r, 36, step=21) for r in range(2)] + [ev("checkpoint", 0, 45, step=30, stall=0.5)]
    w1 += [ev("steps", r, 52, step=37, work=1) for r in range(2)]
    w2 = [ev("first_step", r, 55, step=31) for r in range(2)] + [ev("steps", 0, 60, step=36, work=1)]
    w3 = [ev("process", 1, 61)]
    a2 = [e for r in range(2) for e in rank_events(r, attempt=2, t0=70, steps=(30, 50))]
    events = w0 + [{**e, "generation": g} for g, w in ((1, w1), (2, w2), (3, w3)) for e in w] + a2
    g = goodput.compute(events, [])
    assert [(x["from_step"], x["to_step"], x.get("generation")) for x in g["lost_steps"]] == [
        (20, 30, 1),
        (30, 37, 2),
        (30, 36, None),
    ]
    # the restarts: 32 -> 36, 52 -> 55, 60 -> attempt 2's first line
    assert g["breakdown"]["restart"] == pytest.approx(4 + 3 + (70.5 - 60))
