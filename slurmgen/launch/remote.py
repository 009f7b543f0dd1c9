"""What runs on each node of `slurmgen launch`, and how it gets there. Pure.

The SSH command line is short, fixed and holds no secret:

    exec bash --norc -c 'IFS= read -r -t 20 n && b=$(timeout 20 head -c "$n") && eval "$b"' \
        slurmgen-launch attempt=1 workdir=... ...

Everything else arrives on the session's stdin (`payload`, framed as contract/node_events.py says): the
bootstrap (templates/launch_bootstrap.sh.j2), then the rendered launch_multi_node.sh and the
environment (forwarded variables and env files, which may hold tokens). The bootstrap writes
the node script to a private temporary directory, exports the environment, changes to the
working directory and runs the script: the very process loop of `create` (one process group
per rank, first failure stops the node, per-rank logs), told its rank offset and world size,
so nodes may differ in size.

Stdin then stays open as a lifeline: when it ends (the launcher stops the job, or the SSH
connection is lost) or stays silent for `silence` seconds (the launcher pings it every
keepalive interval; a partition drops packets and never ends it), the bootstrap sends TERM
to the process loop, which stops every rank's process group, killing what is left after
SLURMGEN_STOP_GRACE seconds. With a heartbeat
timeout it sets SLURMGEN_HEARTBEAT_DIR to a directory of its own on the node and reports the
beats of quiet ranks there to the launcher, which judges the hang across nodes. Events come
back on stderr (contract/node_events.py).
"""

from __future__ import annotations

import functools
import posixpath
import shlex
from typing import TYPE_CHECKING

from slurmgen.contract import envvars, exitcodes, signals, warm
from slurmgen.contract.files import TIMELINE_NAME
from slurmgen.contract.node_events import (
    EVENT_FD,
    EVENT_TAG,
    KEEPALIVE_INTERVAL,
    PAYLOAD_END,
    PAYLOAD_MAGIC,
    STACK_ASK,
    WARM_WORD,
    lifeline_silence,
)
from slurmgen.generate.shell import ShellCode, quote
from slurmgen.launch.plan import masked

if TYPE_CHECKING:
    from slurmgen.launch.plan import LaunchPlan, NodePlan

BOOTSTRAP_TEMPLATE = "launch_bootstrap.sh.j2"
# `--norc`: Debian's bash sources ~/.bashrc when it sees SSH_CLIENT at shell level 1, which
# `exec` from the login shell keeps; without it the user's ~/.bashrc (conda or pyenv init,
# often 0.1-1 s) would run twice per node. The login shell may be any shell: the line is
# plain words and one single-quoted string. The bootstrap avoids programs where a builtin
# does (each costs a few ms of a node's start-up). Every read of stdin before the lifeline is
# bounded by the lifeline's silence (SECONDS below, here and in the bootstrap): a node cut off
# while the payload is on its way drops packets and never sees the end of its stdin, and would
# wait forever; a bootstrap cut short by the bound is not run.
REMOTE_TEMPLATE = (
    """exec bash --norc -c 'IFS= read -r -t SECONDS n && b=$(timeout SECONDS head -c "$n") && """
    """eval "$b"' slurmgen-launch"""
)


def remote_prefix(silence: float) -> str:
    """The fixed start of the command line, waiting at most `silence` seconds for the bootstrap."""
    return REMOTE_TEMPLATE.replace("SECONDS", f"{silence:g}")


REMOTE_PREFIX = remote_prefix(lifeline_silence(KEEPALIVE_INTERVAL))


@functools.cache
def bootstrap() -> str:
    """The bootstrap's bash text, with the protocol's constants and the exit codes filled in."""
    from slurmgen.contract.version import VERSION as __version__
    from slurmgen.generate.render import render_template

    return render_template(
        BOOTSTRAP_TEMPLATE,
        version=__version__,
        event_tag=EVENT_TAG,
        event_fd=EVENT_FD,
        payload_magic=PAYLOAD_MAGIC,
        payload_end=PAYLOAD_END,
        stack_ask=STACK_ASK,
        warm_word=WARM_WORD,
        warm_dir_var=ShellCode(envvars.WARM_DIR),
        warm_world=warm.WORLD_NAME,
        warm_start=warm.START_PREFIX,
        bad_input=exitcodes.BAD_INPUT,
        warning_signals=ShellCode(" ".join(signals.WARNINGS)),
    )


def heartbeat_ms(plan: LaunchPlan) -> int:
    """The hang limit in milliseconds (0: none): the nodes report quiet ranks past half of it,
    the launcher judges with it."""
    return int(round(plan.heartbeat_timeout * 1000)) if plan.heartbeat_timeout else 0


def node_args(plan: LaunchPlan, node: NodePlan, attempt: int, keepalive: float = KEEPALIVE_INTERVAL) -> list[str]:
    """The bootstrap's key=value arguments for one node (no secrets: they are on a command line)."""
    args = {
        "attempt": attempt,
        "workdir": plan.workdir,
        "master_addr": plan.master_addr,
        "master_port": plan.master_port,
        "nnodes": len(plan.nodes),
        "nproc": node.nproc,
        "node_rank": node.node_rank,
        "rank_offset": node.rank_offset,
        "world_size": plan.world_size,
        "log_dir": plan.log_dir,
        "stop_grace": plan.stop_grace,
        "heartbeat_ms": heartbeat_ms(plan),
        "silence": f"{lifeline_silence(keepalive):g}",
        "warm": int(plan.restart_mode == warm.WARM),
    }
    return [f"{k}={v}" for k, v in args.items()]


def remote_command(plan: LaunchPlan, node: NodePlan, attempt: int, keepalive: float = KEEPALIVE_INTERVAL) -> str:
    """The exact command line sent to the node's sshd."""
    args = node_args(plan, node, attempt, keepalive)
    return remote_prefix(lifeline_silence(keepalive)) + " " + " ".join(shlex.quote(a) for a in args)


def env_text(env: dict[str, str], show_secrets: bool = True) -> str:
    """`export K=V` lines the bootstrap evaluates (values quoted for bash)."""
    return "".join(f"export {k}={quote(v if show_secrets else masked(k, v))}\n" for k, v in sorted(env.items()))


def payload(plan: LaunchPlan, node: NodePlan) -> bytes:
    """Bytes written to the session's stdin right after the command starts."""
    boot = bootstrap().encode()
    script = plan.script.encode()
    env = env_text(plan.node_env(node)).encode()
    header = f"{PAYLOAD_MAGIC} {len(script)} {len(env)}\n".encode()
    return f"{len(boot)}\n".encode() + boot + header + script + env + f"{PAYLOAD_END}\n".encode()


def world_line(world: warm.World, ranks: tuple[int, ...]) -> bytes:
    """The launcher's word on a warm restart's world, as a node's lifeline carries it: the world
    (contract/warm.py) and the ranks of that node to start anew."""
    return f"{WARM_WORD} {world.line().strip()}{''.join(f' {r}' for r in ranks)}\n".encode()


def timeline_file(workdir: str, log_dir: str, launch_id: str) -> str:
    """Where a launch's ranks and nodes append its timeline: beside the per-rank logs, named by
    the launch id, so `slurmgen status ID --timeline` reads the path from the registry's row."""
    return posixpath.join(workdir, log_dir, TIMELINE_NAME.format(job_id=launch_id))
