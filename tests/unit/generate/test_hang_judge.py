"""The hang verdict on one node (templates/hang_judge.sh.j2) and its story (hang_story.sh.j2),
run in bash on real files and a real stopped process. The cross-node proof is
tests/integration/test_hang_blame.py (a SIGSTOPped rank of a real job)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmgen.contract.blame import defer_ms as hang_defer_ms
from slurmgen.generate.render import render_template
from slurmgen.heal.attempts import cause

LIMIT, DEFER = 4000, 1000


def _functions() -> str:
    return "\n".join(
        render_template(t) for t in ("heartbeat.sh.j2", "hang_judge.sh.j2", "hang_stack.sh.j2", "hang_story.sh.j2")
    )


def _beat(d: Path, rank: int, age_s: float, pid: int, step: int, status: str = "running") -> None:
    record = {"rank": rank, "step": step, "time": time.time() - age_s, "pid": pid, "host": "n", "status": status}
    (d / f"rank-{rank:05d}.json").write_text(json.dumps(record) + "\n")


def _judge(d: Path, since_s: float | None = None) -> str:
    """The verdict and the quiet ranks; `since_s`: a last verdict's wall clock (SINCE_MS)."""
    since = "" if since_s is None else str(int(since_s * 1000))
    script = (
        _functions()
        + f"""
now_ms now
if judge_node {d} {LIMIT} {DEFER} "$now" {since}; then
  echo "hung $hung_rank $hung_step $hung_pid ${{hung_why:-oldest}}"
fi
echo "quiet ${{quiet_ranks[*]}}"
"""
    )
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_stopped_rank_is_named_at_once_though_a_waiting_one_beat_earlier(tmp_path, sleeper):
    """The waiting rank's beat is the oldest (beats are throttled): the old watcher blamed it."""
    _beat(tmp_path, 2, 4.9, sleeper.pid + 100000, 40)  # no such process: it shows no sign
    _beat(tmp_path, 3, 4.3, sleeper.pid, 41)
    assert _judge(tmp_path).splitlines()[0] == "quiet 2:40 3:41"  # rank 3 runs: nobody due yet
    sleeper.send_signal(signal.SIGSTOP)
    time.sleep(0.1)
    assert _judge(tmp_path).splitlines() == [f"hung 3 41 {sleeper.pid} stopped", "quiet 2:40 3:41"]


def test_without_a_sign_the_oldest_is_named_only_after_the_deferral(tmp_path, sleeper):
    _beat(tmp_path, 0, 1.0, sleeper.pid, 9)  # still beating: not quiet
    _beat(tmp_path, 1, 4.5, sleeper.pid, 8)
    _beat(tmp_path, 2, 4.9, sleeper.pid, 7, status="checkpointing")  # nothing learned: waits, never named
    assert _judge(tmp_path).splitlines() == ["quiet 1:8 2:7"]
    _beat(tmp_path, 1, 5.5, sleeper.pid, 8)
    _beat(tmp_path, 3, 5.2, sleeper.pid, 8)
    assert _judge(tmp_path).splitlines() == [f"hung 1 8 {sleeper.pid} oldest", "quiet 1:8 2:7 3:8"]


def test_after_a_verdict_only_a_rank_that_beat_since_is_named_again(tmp_path, sleeper):
    """Under warm restarts the watcher judges on after its verdict (SINCE_MS): the killed rank's
    last beat and a peer's that waited for it, both from before the verdict, are never named again;
    the same rank in the process that took its place, stepping since and then stopped, is."""
    verdict_at = time.time() - 10
    _beat(tmp_path, 1, 10.5, sleeper.pid + 100000, 40)  # the rank killed at the verdict: its file stays
    _beat(tmp_path, 0, 10.2, sleeper.pid, 40)  # a peer that waited for it
    assert _judge(tmp_path).splitlines()[0] == f"hung 1 40 {sleeper.pid + 100000} oldest"  # the first verdict
    assert _judge(tmp_path, verdict_at).splitlines() == ["quiet 0:40 1:40"]
    _beat(tmp_path, 1, 5.0, sleeper.pid, 55)
    sleeper.send_signal(signal.SIGSTOP)
    time.sleep(0.1)
    assert _judge(tmp_path, verdict_at).splitlines() == [f"hung 1 55 {sleeper.pid} stopped", "quiet 0:40 1:55"]


@pytest.mark.parametrize(
    ("args", "story"),
    [
        (
            "3 node2 220 10432 stopped 2 0 1",
            "rank 3 on node2 stopped beating at step 220 (no heartbeat for 10.4 s, its process is stopped); "
            "ranks 0-2 waited in a collective",
        ),
        (
            "5 'node 1' '' 4000 '' 4 7 8 9",
            "rank 5 on node 1 stopped beating (no heartbeat for 4.0 s); ranks 4, 7-9 waited in a collective",
        ),
        (
            "1 n 3 2500 '' 0",
            "rank 1 on n stopped beating at step 3 (no heartbeat for 2.5 s); rank 0 waited in a collective",
        ),
        (
            "1 n 3 2500 ''",
            "rank 1 on n stopped beating at step 3 (no heartbeat for 2.5 s); the other ranks kept beating",
        ),
    ],
)
def test_the_story_names_the_hung_rank_and_the_ranks_that_waited(args, story):
    script = render_template("hang_story.sh.j2") + f'\nset -eu\nhang_story {args}\necho "$story"\n'
    assert subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout == story + "\n"


def test_the_deferral_covers_a_trainer_beat_and_a_poll_and_stays_short():
    assert hang_defer_ms(10_000) == 2000 and hang_defer_ms(4000) == 1000 and hang_defer_ms(600) == 250
    assert hang_defer_ms(3_600_000) == 2000


def test_status_tells_the_verdict_and_an_older_record_as_before():
    verdict = "rank 3 on node2 stopped beating at step 220 (no heartbeat for 10.4 s); ranks 0-2 waited in a collective"
    assert cause({"exit_code": 124, "hung_rank": 3, "node": "node2", "verdict": verdict}) == f"hung: {verdict}"
    assert cause({"exit_code": 124, "hung_rank": 3, "node": "node2"}) == "hung (rank 3 on node2)"


def test_a_learned_timeout_judges_a_rank_long_before_the_fixed_limit(tmp_path, sleeper):
    """contract/hangs.py's rule in bash: the beat's own `timeout` when shorter than the limit."""
    sleeper.send_signal(signal.SIGSTOP)
    time.sleep(0.1)
    _beat(tmp_path, 0, 1.0, sleeper.pid, 9)  # no timeout learned: the 4 s limit, not even quiet
    record = json.loads((tmp_path / "rank-00000.json").read_text())
    (tmp_path / "rank-00001.json").write_text(json.dumps({**record, "rank": 1, "timeout": 0.6}) + "\n")
    assert _judge(tmp_path).splitlines() == [f"hung 1 9 {sleeper.pid} stopped", "quiet 1:9"]


def test_a_checkpoint_is_judged_by_its_learned_stalls_or_at_once_when_its_rank_is_stopped(tmp_path, sleeper):
    """contract/hangs.py: a checkpointing beat with no `timeout` (a first checkpoint, the last
    write's wait) is the disk's time, unjudged while its process runs; one with a `timeout` learned
    from earlier stalls is judged by it; a stopped process is judged as a stepping one in any phase:
    a rank SIGSTOPped inside a checkpoint stood a whole job still, unjudged."""
    _beat(tmp_path, 0, 30.0, sleeper.pid, 40, status="checkpointing")  # long past the limit, running
    record = json.loads((tmp_path / "rank-00000.json").read_text())
    (tmp_path / "rank-00001.json").write_text(
        json.dumps({**record, "rank": 1, "time": time.time() - 2.5, "timeout": 2.0}) + "\n"
    )
    # rank 0 waited (quiet) but is never named; rank 1 is past its learned 2 s, not the deferral yet
    assert _judge(tmp_path).splitlines() == ["quiet 0:40 1:40"]
    (tmp_path / "rank-00001.json").write_text(
        json.dumps({**record, "rank": 1, "time": time.time() - 3.5, "timeout": 2.0}) + "\n"
    )
    assert _judge(tmp_path).splitlines() == [f"hung 1 40 {sleeper.pid} oldest", "quiet 0:40 1:40"]
    sleeper.send_signal(signal.SIGSTOP)  # now both processes are stopped
    time.sleep(0.1)
    assert _judge(tmp_path).splitlines() == [f"hung 0 40 {sleeper.pid} stopped", "quiet 0:40 1:40"]


STACKED = """
import os, time
from slurmgen.observe.heartbeat import Heartbeat
hb = Heartbeat(None, 3, 1.0, environ=os.environ, timeline=False)
hb.beat(7)
print("up", flush=True)
def stuck_in_step():
    time.sleep(60)
stuck_in_step()
"""


def test_the_stack_of_a_stopped_rank_is_taken_before_it_is_killed(tmp_path):
    env = {**os.environ, "SLURMGEN_HEARTBEAT_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", STACKED], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "up\n"
        time.sleep(0.3)  # into the sleep
        proc.send_signal(signal.SIGSTOP)
        beat = (tmp_path / "rank-00003.json").read_text().strip()
        script = (
            _functions()
            + f"""
take_stack {tmp_path} 3 {proc.pid} '{beat}'
echo "$stack_file"
printf '%s\\n' "${{stack_frames[@]}}"
"""
        )
        out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()
        assert out[0] == str(tmp_path / "stack-00003.txt")
        assert out[1:] == ["<string>:8 stuck_in_step", "<string>:9 <module>"]
    finally:
        proc.kill()
        proc.wait()


def test_py_spys_dump_gives_the_main_threads_frames(tmp_path):
    (tmp_path / "dump").write_text(
        "Process 42: python train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
        'Thread 43 (idle): "Thread-1 (loader)"\n    wait (threading.py:327)\n'
        'Thread 42 (active): "MainThread"\n    step (/w/train.py:123)\n    main (/w/train.py:200)\n'
        "    <module> (/w/train.py:210)\n"
    )
    script = _functions() + f'\nstack_frames_of {tmp_path}/dump 42\nprintf "%s\\n" "${{stack_frames[@]}}"\n'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["/w/train.py:123 step", "/w/train.py:200 main", "/w/train.py:210 <module>"]
    (tmp_path / "dump").write_text(
        "Thread 42 (idle)\n    step (/w/train.py:123)\nThread 43 (idle)\n    wait (t.py:3)\n"
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["/w/train.py:123 step"]  # unnamed: the thread whose id is the process id


def test_a_dump_left_by_an_earlier_attempt_is_not_reported_as_this_hangs_stack(tmp_path):
    """A rank that cannot be asked (no stack signal, no py-spy) has no stack, even where the same
    rank of an earlier attempt left its dump in the same directory."""
    (tmp_path / "stack-00001.txt").write_text(
        'Current thread 0x1 (most recent call first):\n  File "old.py", line 3 in earlier_hang\n'
    )
    script = (
        _functions()
        + f"""
SLURMGEN_PYSPY=0 take_stack {tmp_path} 1 {os.getpid()} '{{"rank": 1, "status": "running"}}'
echo "file=$stack_file frames=${{#stack_frames[@]}}"
"""
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out == "file= frames=0\n"


PLAIN = "import time\ndef stuck_here():\n    time.sleep(60)\nprint('up', flush=True)\nstuck_here()\n"


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not installed (optional)")
def test_a_program_without_the_stack_signal_is_read_by_py_spy_even_stopped(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", PLAIN], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "up\n"
        time.sleep(0.3)
        proc.send_signal(signal.SIGSTOP)
        script = (
            _functions()
            + f"""
take_stack {tmp_path} 1 {proc.pid} '{{"rank": 1, "status": "running"}}'
printf '%s\\n' "${{stack_frames[@]}}"
"""
        )
        out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()
        assert out == ["<string>:3 stuck_here", "<string>:5 <module>"]
    finally:
        proc.kill()
        proc.wait()
