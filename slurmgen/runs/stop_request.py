"""Stopping a running `slurmgen launch` or a coordinator group's run from outside it: the run
page's Stop button, `slurmgen cancel`, the JSON API, all through jobs/control.py.

The channel is one file per run, `control/launch-<LAUNCH_ID>.stop` or `control/group-<GROUP.N>.stop`
beside the run registry (contract/files.py), whose path the run's taker records in its registry
row (`info.stop_file`). A stopper creates the file (whole, by a rename: its text says who asked).
A launch's main loop, which already wakes every 0.1 s to tick its state machine, looks for it on
each pass, removes it and stops every rank on every node exactly as on Ctrl-C (launch/fanout.py);
the `slurmgen serve` running a group looks for its active runs' files on its tick (twice a
second), removes it and stops the group as its page's Stop does (coordinator/service.py). The
stopper waits for the file to disappear: that is the taker's acknowledgement. The group's
own page and `slurmgen group stop` stop it through the coordinator's API, in the server that
owns it; a run's controls (this channel) reach it from any process of the registry's owner,
which need not know the server's address or token.

Why a file rather than a signal, a unix socket or a localhost port:
- a signal to the recorded pid could reach another process once the pid is reused, and
  cannot say "a user asked" apart from a SIGTERM of the system;
- a unix socket needs a listener thread in the launcher and its path must fit in 108 bytes;
  a port needs a token and is reachable by every local user;
- the file sits in a 0700 directory of the registry's owner (only they can ask, as only they
  can read the registry), costs the launcher one stat per loop pass and no thread, needs no
  cleanup when the launcher dies (a stale file names a launch that no longer runs, and the
  stopper sees that no one takes it), and works the same for the page and the CLI.
Standard library only: the launcher, the CLI and the page's server all import it.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from slurmgen import atomic
from slurmgen.contract.files import CONTROL_DIR, GROUP_STOP_NAME, LAUNCH_STOP_NAME
from slurmgen.contract.states import ENDED_WORDS, STOPPED_BY_YOU
from slurmgen.runs.outcome import stopped_by_you

ACK_WAIT = 3.0  # seconds a stopper waits for the launcher to take the request (it looks every 0.1 s)
POLL = 0.05
# The kinds of run with a stop channel: how a message names the run, and who takes its request.
TAKERS = {"launch": ("launch", "launcher"), "group": ("group run", "coordinator (slurmgen serve)")}


def stop_file(registry: Path, launch_id: str) -> Path:
    """Where a stop request for this launch is written: beside the registry, never elsewhere."""
    return registry.parent / CONTROL_DIR / LAUNCH_STOP_NAME.format(launch_id=launch_id)


def group_stop_file(registry: Path, key: str) -> Path:
    """Where a stop request for a group's run (its key, GROUP.N) is written, as for a launch."""
    return registry.parent / CONTROL_DIR / GROUP_STOP_NAME.format(key=key)


def prepare(path: Path) -> None:
    """The launcher's side, before it starts: the directory (0700) exists and no old request
    is waiting (a launch id is new each time, so a file there now is a leftover)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.unlink(missing_ok=True)


def take(path: Path | None) -> str | None:
    """The launcher's side, every loop pass: the request's text (who asked) if one is waiting,
    removed so that it is taken once; None when there is none. One stat when there is none."""
    if path is None or not path.exists():
        return None
    try:
        text = path.read_text(errors="replace").strip()
        path.unlink()
    except OSError:  # taken between the stat and the read: by whom does not matter
        return None
    return text or "a stop request"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it exists
        return True
    return True


def why_not(row: dict[str, Any]) -> str | None:
    """Why a launch or a group's run cannot be stopped from this machine (None: it can)."""
    info = row.get("info") or {}
    if row.get("kind") not in TAKERS:
        return "only an SSH launch or a coordinator group's run has a stop channel"
    what, taker = TAKERS[row["kind"]]
    if (row.get("state") or "") in ENDED_WORDS:  # a person's stop reads as every view says it
        return f"the {what} has ended ({STOPPED_BY_YOU if stopped_by_you(row['state']) else row['state']})"
    if row.get("cluster") and row["cluster"] != socket.gethostname():
        return f"the {what} was started on {row['cluster']}, not on this machine"
    if not info.get("stop_file"):
        where = "with Ctrl-C where it runs" if row["kind"] == "launch" else "from its group's page"
        return f"this {what} was started by a slurmgen without a stop channel: stop it {where}"
    pid = info.get("pid")  # a launch's launcher (a group's server may have been restarted since)
    if isinstance(pid, int) and not _alive(pid):
        return f"its {taker} (pid {pid}) is no longer running"
    return None


def request(row: dict[str, Any], by: str, wait: float = ACK_WAIT) -> tuple[bool, str]:
    """Ask the run's launcher (or the coordinator running the group) to stop every rank; (taken,
    what happened), after up to `wait` seconds for it to take the request. `by` ends the cause
    the run records ("stopped by you from the page")."""
    reason = why_not(row)
    run = f"{TAKERS.get(row.get('kind') or '', ('run',))[0]} {row.get('job_id')}"
    if reason is not None:
        return False, f"{run} was not stopped: {reason}"
    _, taker = TAKERS[row["kind"]]
    path = Path(row["info"]["stop_file"])
    try:  # whole or not at all: a taker that saw the file before its text would not say who asked
        atomic.write_text(path, f"{STOPPED_BY_YOU} {by}\n", fsync=False, mode=0o600)
    except OSError as exc:
        return False, f"{run} was not stopped: cannot write {str(path)!r}: {exc.strerror}"
    deadline = time.monotonic() + wait
    while path.exists():
        if time.monotonic() > deadline:
            pid = row["info"].get("pid")
            return False, (
                f"{run}: its {taker}{f' (pid {pid})' if pid else ''} did not take the "
                f"stop request within {wait:g} s; it stays asked in {str(path)!r}"
            )
        time.sleep(POLL)
    return True, f"{run}: the {taker} is stopping every rank on every node ({STOPPED_BY_YOU})"
