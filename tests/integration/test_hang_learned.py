"""Hang detection that learns (issue 23, item 5), on the real test cluster: a 2x2 Slurm job of the
bundled trainer (one rank sleeps 0.2 s a step, so every step takes about that) with a fixed
--heartbeat-timeout of 60 s. Each rank learns its step times and publishes its timeout in its
heartbeat (contract/hangs.py); once learned, the test SIGSTOPs rank 3. The watcher names rank 3
within its learned timeout plus the poll period (not 60 s), takes its Python stack before it
kills it (faulthandler, the process continued first), and the attempts record and `status` say
where it was stuck."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from helpers import sg

from slurmgen.contract import exitcodes, hangs
from slurmgen.heal.attempts import attempts_path, read_attempts

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
pytest.importorskip("torch", reason="torch is not installed: run scripts/setup.sh")

FIXED, EVERY, FLOOR, POLL = 60.0, 0.2, 0.3, 0.5
TRAIN = [
    "--",
    "python",
    "-m",
    "slurmgen.train",
    "--model",
    "mlp",
    "--mlp-hidden",
    "16",
    "--max-steps",
    "5000",
    "--log-every",
    "1000",
    "--heartbeat-every",
    str(EVERY),
    "--out-dir",
    "R",
]


def _rank(job: str, rank: int) -> tuple[int, dict[str, str]] | None:
    """The trainer process of `rank` in `job` and its environment, or None while there is none."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            env = dict(v.split("=", 1) for v in (entry / "environ").read_text(errors="replace").split("\0") if "=" in v)
        except OSError:
            continue
        python = os.path.basename(argv[0]).startswith(b"python")  # not the bash wrappers around it
        if python and b"slurmgen.train" in argv and env.get("SLURM_JOB_ID") == job and env.get("RANK") == str(rank):
            return int(entry.name), env
    return None


def _learned_beat(job: str, rank: int, timeout: float) -> tuple[int, dict]:
    """Rank's pid and its heartbeat, once the heartbeat carries a learned timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _rank(job, rank)
        if found:
            path = Path(found[1]["SLURMGEN_HEARTBEAT_DIR"]) / f"rank-{rank:05d}.json"
            try:
                beat = json.loads(path.read_text())
            except (OSError, ValueError):
                beat = {}
            if "timeout" in beat:
                return found[0], beat
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} of job {job} published no learned timeout in {timeout} s")


def test_a_stopped_rank_is_caught_within_its_learned_timeout_with_its_stack(cluster, tmp_path):
    job = sg(
        cluster,
        tmp_path,
        "submit",
        "--nodes",
        "2",
        "--gpus",
        "2",
        "--backend",
        "gloo",
        "--time",
        "5",
        "-o",
        "hl",
        "--heartbeat-timeout",
        str(FIXED),
        "--hang-floor",
        str(FLOOR),
        "-e",
        "SLURMGEN_TRAIN_SLOW=0:0.2",
        *TRAIN,
    ).stdout.strip()
    try:
        pid, beat = _learned_beat(job, 3, 120)
        assert beat["stack"] is True and beat["status"] == "running", beat
        learned = beat["timeout"]
        # period + max(floor, 3 x p99): the step's p99 it implies
        p99 = (learned - EVERY) / hangs.DEFAULT_FACTOR
        assert EVERY + FLOOR <= learned < FIXED / 10, beat
        os.kill(pid, signal.SIGSTOP)
        frozen = time.time()
        state, code = cluster.wait(job, timeout=FIXED)
    finally:
        sg(cluster, tmp_path, "cancel", job, check=False)
    logs = tmp_path / "hl" / "logs"
    log = "\n".join(p.read_text(errors="replace") for p in sorted(logs.glob(f"*-{job}.out")))
    assert (state, code) == ("FAILED", exitcodes.HUNG), log
    verdict = re.search(r"slurmgen: hung: rank=3 .* no_heartbeat_ms=(\d+) limit_ms=(\d+) why=stopped", log)
    assert verdict, log
    age, limit = int(verdict[1]) / 1000, int(verdict[2]) / 1000
    end = read_attempts(attempts_path(logs, job))[-1]
    ended = end["time"] - frozen
    print(
        f"learned timeout {learned:.3f} s (p99 step ~{p99:.3f} s, fixed {FIXED:.0f} s); detected with no heartbeat "
        f"for {age:.3f} s; frozen -> attempt ended {ended:.2f} s"
    )
    # Its own learned limit, not the fixed one; caught within it plus a poll (the beat it had
    # published may be up to one beat older than the one the watcher judged).
    assert limit <= learned + 0.2 * learned and limit < FIXED, (limit, learned)
    assert age <= limit + POLL + 0.3, log
    assert ended <= limit + POLL + hangs.STACK_WAIT + 5, log

    assert end["hung_rank"] == 3 and end["exit_code"] == exitcodes.HUNG, end
    frames = end["stack"]
    assert frames and all(set(f) == {"file", "line", "function"} for f in frames), end
    assert all(isinstance(f["line"], int) and f["file"].endswith(".py") for f in frames), frames
    assert (logs / f"slurmgen-{job}.stacks.txt").read_text().startswith(f"=== rank 3 on {end['node']}, attempt 1\n"), (
        end
    )
    text = sg(cluster, tmp_path, "status", job).stdout
    print(*[line for line in text.splitlines() if "stuck in" in line], sep="\n")
    top = frames[0]
    assert f"rank 3 stuck in {Path(top['file']).name}:{top['line']} in {top['function']}()" in text, text
    assert cluster.wait_no_tasks(job, timeout=10) == []
