"""Signals, requeue and the failures people hit first: real processes, gloo, short timeouts."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import clean_env, communicate_in_session, free_port

from slurmgen.train.logs import read_heartbeats

pytestmark = pytest.mark.integration
pytest.importorskip("torch", reason="torch is not installed: run scripts/setup.sh")

PY = sys.executable
LONG = [
    "--model",
    "mlp",
    "--mlp-hidden",
    "16",
    "--synthetic-samples",
    "256",
    "--max-steps",
    "100000",
    "--save-every",
    "0",
    "--log-every",
    "1000",
    "--progress",
    "lines",
    "--heartbeat-every",
    "0.05",
]


def start(args: list[str], env: dict[str, str], module: str = "slurmgen.train") -> subprocess.Popen:
    return subprocess.Popen(
        [PY, "-m", module, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(p: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    out, err = communicate_in_session(p, timeout)
    return p.returncode, out + err


def heartbeat(out: Path, rank: int, min_step: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        beat = read_heartbeats(out / "heartbeats").get(rank)
        if beat and beat["step"] >= min_step:
            return beat
        time.sleep(0.02)
    raise AssertionError(f"rank {rank} never reached step {min_step}")


def nothing_left(marker: str) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
        if not found:
            return
        time.sleep(0.1)
    raise AssertionError(f"processes left behind: {found}")


def test_usr2_on_one_rank_checkpoints_all_and_exits_75_then_resumes(tmp_path):
    out = tmp_path / "run"
    p = start(LONG + ["--nproc-per-node", "2", "--out-dir", str(out)], clean_env())
    beat = heartbeat(out, 1, min_step=3)
    os.kill(beat["pid"], signal.SIGUSR2)  # only rank 1 hears it; the step-boundary vote stops both
    code, log = finish(p)
    assert code == 75, log[-3000:]
    beats = [read_heartbeats(out / "heartbeats")[r] for r in (0, 1)]
    assert {b["status"] for b in beats} == {"preempted"} and beats[0]["step"] == beats[1]["step"]
    step = beats[0]["step"]
    assert (out / "checkpoints" / "latest").read_text().strip() == f"ckpt-{step:09d}.pt"
    assert f"checkpoint written at step {step}" in log and "not a Slurm job" in log and "Traceback" not in log
    nothing_left(str(out))
    code, log = finish(
        start(
            [
                "--nproc-per-node",
                "2",
                "--out-dir",
                str(out),
                *LONG[:-8],
                "--max-steps",
                str(step + 3),
                "--progress",
                "lines",
            ],
            clean_env(),
        )
    )
    assert code == 0 and f"at step {step}" in log and f"done: step {step + 3}" in log, log[-3000:]


def fake_scontrol(bin_dir: Path, calls: Path, requeue_flag: str) -> None:
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    script.write_text(f"""#!/bin/sh
echo "$@" >> {calls}
if [ "$1" = show ]; then echo "JobId=$4 JobName=train Requeue={requeue_flag} Restarts=0 BatchFlag=1"; fi
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize("requeueable", ["1", "0"])
def test_the_warning_signal_under_slurm_asks_for_requeue_if_the_job_allows_it(tmp_path, requeueable):
    out, calls = tmp_path / "run", tmp_path / "calls.txt"
    fake_scontrol(tmp_path / "bin", calls, requeueable)
    env = clean_env(SLURM_JOB_ID="4321", PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    p = start(LONG + ["--out-dir", str(out)], env)
    heartbeat(out, 0, min_step=2)
    p.send_signal(signal.SIGUSR2)
    code, log = finish(p)
    assert code == 75, log[-3000:]
    made = calls.read_text().splitlines()
    if requeueable == "1":
        assert made == ["show job -o 4321", "requeue 4321"] and "asked Slurm to requeue job 4321" in log
    else:
        assert made == ["show job -o 4321"] and "job 4321 is not requeueable (Requeue=0)" in log


@pytest.mark.parametrize("requeue", [[], ["--requeue"]])
def test_sigterm_under_slurm_checkpoints_and_never_requeues(tmp_path, requeue):
    """scancel sends TERM: the job must end, whatever --requeue says (preemption's requeue is Slurm's own)."""
    out, calls = tmp_path / "run", tmp_path / "calls.txt"
    fake_scontrol(tmp_path / "bin", calls, "1")
    env = clean_env(SLURM_JOB_ID="4321", PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    p = start(LONG + ["--out-dir", str(out), *requeue], env)
    heartbeat(out, 0, min_step=2)
    p.send_signal(signal.SIGTERM)
    code, log = finish(p)
    assert code == 75 and "checkpoint written at step" in log, log[-3000:]
    assert (
        not calls.exists() and "SIGTERM (scancel, a preemption or the launcher stopping the run): not requeueing" in log
    )


def test_requeue_without_scontrol_says_so_and_exits_75(tmp_path):
    out = tmp_path / "run"
    env = clean_env(SLURM_JOB_ID="99", PATH=str(tmp_path / "empty"))
    p = start(LONG + ["--out-dir", str(out), "--requeue", "--preempt-signal", "sigusr1"], env)
    heartbeat(out, 0, min_step=2)
    p.send_signal(signal.SIGUSR1)  # the signal chosen instead of the default USR2
    code, log = finish(p)
    assert code == 75 and "scontrol not found" in log and "cannot requeue job 99" in log, log[-3000:]


def test_a_dead_rank_takes_the_job_down_fast(tmp_path):
    out = tmp_path / "run"
    p = start(LONG + ["--nproc-per-node", "2", "--out-dir", str(out)], clean_env())
    beat = heartbeat(out, 1, min_step=3)
    t0 = time.monotonic()
    os.kill(beat["pid"], signal.SIGKILL)
    code, log = finish(p, timeout=30)
    assert code == 128 + signal.SIGKILL and time.monotonic() - t0 < 10, log[-2000:]
    nothing_left(str(out))


def test_unreachable_master_is_named_within_the_timeout(tmp_path):
    port = free_port()
    t0 = time.monotonic()
    code, log = finish(
        start(
            [
                "--rank",
                "1",
                "--world-size",
                "2",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                "--init-timeout",
                "2",
                "--out-dir",
                str(tmp_path),
            ],
            clean_env(),
        )
    )
    assert code == 1 and time.monotonic() - t0 < 20
    assert log.strip().splitlines() == [
        f"slurmgen train: error: cannot reach the master at 127.0.0.1:{port} within 2 s (Connection refused): "
        "is rank 0 "
        "running, and do MASTER_ADDR and MASTER_PORT point to it? (--init-timeout to wait longer)"
    ]


def test_unresolvable_master_fails_at_once(tmp_path):
    code, log = finish(
        start(
            ["--out-dir", str(tmp_path)],
            clean_env(
                RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", MASTER_ADDR="no-such-host.invalid", MASTER_PORT="29999"
            ),
        )
    )
    assert code == 1 and "cannot resolve MASTER_ADDR=no-such-host.invalid" in log and "Traceback" not in log


def test_inconsistent_world_size_fails_on_every_rank(tmp_path):
    port = free_port()
    common = [
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "--init-timeout",
        "3",
        "--out-dir",
        str(tmp_path),
    ]
    r0 = start(["--rank", "0", "--world-size", "2", *common], clean_env())
    r1 = start(["--rank", "1", "--world-size", "3", *common], clean_env())
    (c0, log0), (c1, log1) = finish(r0), finish(r1)
    assert c1 == 1 and "inconsistent WORLD_SIZE: rank 1 has 3, rank 0 has 2" in log1
    assert c0 == 1 and "only 1 of WORLD_SIZE=2 ranks arrived" in log0


def test_bad_flag_from_the_command_line(tmp_path):
    code, log = finish(start(["--batch-size", "-3"], clean_env()))
    assert code == 2 and log == "slurmgen train: error: argument --batch-size: must be at least 1, got -3\n"
