"""A hung rank's Python stack on an agent's node, taken with the watchers' own bash code.

The server judges a group's hang across agents (group_blame.py) and, with the stop order for the hung
rank's worker, asks its agent for that rank's stack (StopOrder.stack). The agent runs
`take_stack` of templates/hang_stack.sh.j2, the function the Slurm watcher, launch_multi_node.sh
and the node bootstrap of `slurmgen launch` run (faulthandler on SIGURG for a writer whose beat
says "stack": true, else py-spy): one capture for every path, bounded by its own wait.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
from pathlib import Path

from slurmgen.contract import hangs

# take_stack waits at most hangs.STACK_WAIT for the dump (py-spy at most 10 s); bash's start on top.
TIMEOUT = hangs.STACK_WAIT + 2.0


@functools.cache
def _script() -> str:
    """take_stack DIR RANK PID BEAT_TEXT, then the frames on stderr (a line each) and the dump on stdout."""
    from slurmgen.generate.render import render_template

    return render_template("hang_stack.sh.j2") + (
        'take_stack "$@"\n'
        'if ((${#stack_frames[@]})); then printf "%s\\n" "${stack_frames[@]}" >&2; fi\n'
        '[[ -z $stack_file ]] || cat -- "$stack_file"\n'
    )


def take(beat_file: Path, rank: int, pid: int) -> tuple[list[str], str]:
    """(frames "FILE:LINE FUNCTION" innermost first, the whole dump) of the rank whose heartbeat
    is `beat_file` (its writer's pid, else `pid`); nothing when no stack could be taken in time."""
    try:
        beat = beat_file.read_text().partition("\n")[0]
        writer = json.loads(beat).get("pid")
    except (OSError, ValueError, AttributeError):
        beat, writer = "", None
    pid = writer if isinstance(writer, int) and writer > 0 else pid
    try:
        proc = subprocess.Popen(
            ["bash", "-c", _script(), "slurmgen-stack", str(beat_file.parent), str(rank), str(pid), beat],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError:
        return [], ""
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:  # its whole group: py-spy would hold the pipes open
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return [], ""
    return err.splitlines(), out
