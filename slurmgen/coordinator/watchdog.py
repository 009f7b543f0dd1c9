"""The agent's watchdog: kills every rank's process group still listed when the agent dies.

`procs.Procs` starts this file as its own program (`python -I -S watchdog.py`, in a session of
its own) and writes one line per change on the watchdog's stdin: `+PGID` when a rank starts,
`-PGID` once its group has been cleared. The pipe closes when the agent exits, however it dies
(SIGKILL included); then every group still listed gets SIGKILL, which also catches what a rank
forked after PR_SET_PDEATHSIG took its leader. Standard library only, and nothing of slurmgen:
it starts with every agent and must not wait on an import.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

TYPE_CHECKING = False  # not from typing: the import would cost this program more than its work
if TYPE_CHECKING:
    from collections.abc import Iterable


def watch(lines: Iterable[str]) -> set[int]:
    """The process groups still listed when `lines` ends."""
    groups: set[int] = set()
    for line in lines:
        sign, pgid = line[0], int(line[1:])
        (groups.add if sign == "+" else groups.discard)(pgid)
    return groups


def kill_all(groups: Iterable[int]) -> None:
    for pgid in groups:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)


if __name__ == "__main__":
    kill_all(watch(sys.stdin))
