"""Signals as people and Slurm name them (USR2, SIGUSR2, 12) and as `status` shows them.

One place for the words, so `status`, `cancel --signal` and the step lines agree: a process
ended by signal N is "killed by signal N (NAME)", never an exit code of N or 128 + N alone.
"""

from __future__ import annotations

import signal as _signal

from slurmgen.contract import signals

# Signals a program must handle itself or die of (their default action ends the process), and
# that nobody sends to stop a job: the preemption warnings. TERM, INT, KILL mean "stop".
WARNINGS = frozenset(signals.WARNINGS)


def number(text: str) -> int | None:
    """12, 'USR2' or 'SIGUSR2' -> 12; None for a name this machine does not know."""
    text = text.strip().upper()
    if text.isdigit():
        return int(text)
    try:
        return int(_signal.Signals["SIG" + text.removeprefix("SIG")])
    except KeyError:
        return None


def name(num: int) -> str | None:
    """12 -> 'USR2' (this machine's numbering, which is Linux's on a Slurm cluster)."""
    try:
        return _signal.Signals(num).name.removeprefix("SIG")
    except ValueError:
        return None


def killed_by(num: int) -> str:
    """'killed by signal 15 (TERM)'."""
    label = name(num)
    return f"killed by signal {num}" + (f" ({label})" if label else "")
