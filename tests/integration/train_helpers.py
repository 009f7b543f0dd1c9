"""Shared by the integration tests that start the trainer as real processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

# Set by a launcher (or by a test's fault hook); a child must get only what the test gives it.
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR",
               "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURMGEN_BACKEND", "SLURMGEN_REQUEUE", "SLURMGEN_TRAIN_SPAWNED",
               "SLURMGEN_TRAIN_FAULT")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without launcher and SLURM_* variables, unbuffered, plus EXTRA."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith("SLURM_")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def communicate_in_session(p: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """(stdout, stderr) of a process started with start_new_session=True; afterwards, and on
    a timeout, its whole session is killed so nothing it spawned outlives the test."""
    try:
        return p.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
