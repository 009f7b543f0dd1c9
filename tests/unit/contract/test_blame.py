"""The hang rule (slurmgen/contract/blame.py) and its bash twin (judge_node in
templates/hang_judge.sh.j2, hang_story.sh.j2) held to the same cases: the bash runs on real
beat files and a really stopped process, the Python on the same beats."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from slurmgen.contract import blame, hangs
from slurmgen.contract.blame import LastBeat
from slurmgen.generate.render import render_template

LIMIT, DEFER = 4000, 1000
CKPT = hangs.CHECKPOINTING
# (rank, age in ms, step, stopped[, learned limit in ms or None[, status]]) per beat -> the hung
# rank and why ("-": none yet), the waiting (quiet) ranks; judged at the instant the beats' ages are for
CASES = [
    ([(0, 1000, 9, False), (1, 4500, 8, False)], "-", (1,)),  # under limit + deferral
    ([(0, 2500, 9, False), (1, 5500, 8, False), (3, 5200, 8, False)], "1", (0, 3)),  # the oldest, deferred
    ([(2, 4900, 40, False), (3, 4300, 41, True)], "3 stopped", (2,)),  # stopped beats an older beat
    ([(2, 5900, 40, False), (3, 4300, 41, True)], "3 stopped", (2,)),  # ...even once that is due
    ([(0, 4200, 7, True), (1, 4600, 7, True)], "1 stopped", (0,)),  # two stopped: the older
    ([(1, 5500, 5, False), (2, 5500, 5, False)], "1", (2,)),  # equal: the lower rank
    ([(0, 3900, 5, True), (1, 1000, 5, False)], "-", (0,)),  # stopped, not over the limit
    ([(0, 2200, 9, False, 1000), (1, 3000, 8, False)], "0", (1,)),  # its learned limit, deferred
    ([(0, 1800, 9, False, 1000), (1, 3000, 8, False)], "-", (0, 1)),  # ...not yet past the deferral
    ([(2, 1200, 5, True, 1000), (3, 3900, 5, False)], "2 stopped", (3,)),  # stopped past its learned limit
    # a checkpoint nothing was learned of: never named while it runs, but it waited...
    ([(0, 30000, 50, False, None, CKPT), (1, 1000, 51, False)], "-", (0,)),
    # ...for a rank stopped inside it, named at the fixed limit (contract/hangs.py)
    ([(0, 30000, 50, False, None, CKPT), (3, 4300, 50, True, None, CKPT)], "3 stopped", (0,)),
    ([(0, 1500, 50, False, None, CKPT), (3, 3900, 50, True, None, CKPT)], "-", (3,)),
    # a checkpoint judged by the stalls it learned, deferred as a step
    ([(0, 6200, 50, False, 5000, CKPT), (1, 2500, 50, False, None, CKPT)], "0", (1,)),
]


@pytest.fixture
def sleepers():
    procs = {s: subprocess.Popen(["sleep", "60"]) for s in (False, True)}
    procs[True].send_signal(signal.SIGSTOP)
    time.sleep(0.1)
    yield {s: p.pid for s, p in procs.items()}
    for p in procs.values():
        p.kill()
        p.wait()


def _bash(d: Path, beats: list[tuple], pids: dict[bool, int]) -> tuple[str, tuple[int, ...]]:
    now = time.time()
    for rank, age, step, stopped, learned, status in map(_full, beats):
        record = {
            "rank": rank,
            "step": step,
            "time": now - age / 1000,
            "pid": pids[stopped],
            "status": status,
            **({"timeout": learned / 1000} if learned else {}),
        }
        (d / f"rank-{rank:05d}.json").write_text(json.dumps(record) + "\n")
    script = (
        "\n".join(render_template(t) for t in ("heartbeat.sh.j2", "hang_judge.sh.j2"))
        + f"""
if judge_node {d} {LIMIT} {DEFER} {int(now * 1000)}; then echo "$hung_rank${{hung_why:+ $hung_why}}"; else echo -; fi
echo "${{quiet_ranks[*]}}"
"""
    )
    verdict, quiet = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    ranks = tuple(int(q.split(":")[0]) for q in quiet.split())
    hung = verdict.split()[0]
    return verdict, tuple(r for r in ranks if str(r) != hung)


def _full(beat: tuple) -> tuple:
    """A case's beat with its defaults: (rank, age, step, stopped, learned or None, status)."""
    return (*beat, None, "running")[:6] if len(beat) == 4 else (*beat, "running")[:6]


def _python(beats: list[tuple]) -> tuple[str, tuple[int, ...]]:
    """As the launcher and the server judge: each beat's limit and whether it is judged are its
    node's (contract/hangs.py's rule, applied where the process is seen)."""
    last = []
    for r, a, s, stopped, learned, status in map(_full, beats):
        limit = hangs.beat_limit({"status": status, "timeout": (learned or 0) / 1000}, LIMIT / 1000, stopped)
        own = round(limit * 1000) if limit is not None and round(limit * 1000) != LIMIT else None
        last.append(LastBeat(r, a, s, stopped, limit_ms=own, judged=limit is not None))
    found = blame.judge(last, LIMIT, DEFER)
    if found is None:
        return "-", tuple(b.rank for b in sorted(last, key=lambda b: b.rank) if b.age_ms * 2 > (b.limit_ms or LIMIT))
    return f"{found.rank}{' ' + found.why if found.why else ''}", found.waiting


@pytest.mark.parametrize(("beats", "verdict", "waiting"), CASES)
def test_bash_and_python_name_the_same_rank(tmp_path, sleepers, beats, verdict, waiting):
    assert _python(beats) == (verdict, waiting)
    assert _bash(tmp_path, beats, sleepers) == (verdict, waiting)


STORIES = [
    (
        blame.Hang(3, "node2", 220, 10432, "stopped", (2, 0, 1)),
        "3 node2 220 10432 stopped 2 0 1",
        "rank 3 on node2 stopped beating at step 220 (no heartbeat for 10.4 s, its process is stopped); "
        "ranks 0-2 waited in a collective",
    ),
    (
        blame.Hang(5, "node 1", None, 4000, "", (4, 7, 8, 9)),
        "5 'node 1' '' 4000 '' 4 7 8 9",
        "rank 5 on node 1 stopped beating (no heartbeat for 4.0 s); ranks 4, 7-9 waited in a collective",
    ),
    (
        blame.Hang(1, "n", 3, 2500, "", (0,)),
        "1 n 3 2500 '' 0",
        "rank 1 on n stopped beating at step 3 (no heartbeat for 2.5 s); rank 0 waited in a collective",
    ),
    (
        blame.Hang(1, "n", 3, 2500, "", ()),
        "1 n 3 2500 ''",
        "rank 1 on n stopped beating at step 3 (no heartbeat for 2.5 s); the other ranks kept beating",
    ),
]


@pytest.mark.parametrize(("found", "args", "story"), STORIES)
def test_bash_and_python_tell_the_same_story(found, args, story):
    assert blame.story(found) == story
    script = render_template("hang_story.sh.j2") + f'\nset -eu\nhang_story {args}\necho "$story"\n'
    assert subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout == story + "\n"
