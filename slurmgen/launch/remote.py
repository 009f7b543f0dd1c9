"""What runs on each node of `slurmgen launch`, and how it gets there. Pure.

The SSH command line is short, fixed and holds no secret:

    exec bash --norc -c 'IFS= read -r n && eval "$(head -c "$n")"' \
        slurmgen-launch attempt=1 workdir=... ...

Everything else arrives on the session's stdin (`payload`): the bootstrap below, then the
rendered launch_multi_node.sh and the environment (forwarded variables and env files, which
may hold tokens). The bootstrap writes the node script to a private temporary directory,
exports the environment, changes to the working directory and runs the script: the very
process loop of `create` (one process group per rank, first failure stops the node, per-rank
logs), told its rank offset and world size, so nodes may differ in size.

Stdin then stays open as a lifeline: when it ends (the launcher stops the job, or the SSH
connection is lost) the bootstrap sends TERM to the process loop, which stops every rank's
process group, killing what is left after SLURMGEN_STOP_GRACE seconds. With a heartbeat
timeout it also watches the heartbeat files of its ranks (see `BOOTSTRAP`).

The launcher reads three kinds of lines from a node (everything else is shown as is):
`launch_multi_node.sh: node N/M started ranks ...`, `launch_multi_node.sh: rank R (local rank L)
exited with code C; ...` and `slurmgen-launch: rank R: no heartbeat for ...`.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from slurmgen import exitcodes
from slurmgen.launch.plan import masked
from slurmgen.shell import quote

if TYPE_CHECKING:
    from slurmgen.launch.plan import LaunchPlan, NodePlan

PAYLOAD_MAGIC = "slurmgen-payload-1"
# The payload's last line: seen only if every byte before it arrived.
PAYLOAD_END = "slurmgen-payload-end"
# Exit code of a node whose rank missed its heartbeat (as timeout(1) reports a time-out).
EXIT_HUNG = exitcodes.HUNG
# `--norc`: Debian's bash sources ~/.bashrc when it sees SSH_CLIENT at shell level 1, which
# `exec` from the login shell keeps; without it the user's ~/.bashrc (conda or pyenv init,
# often 0.1-1 s) would run twice per node. The login shell may be any shell: the line is
# plain words and one single-quoted string. The bootstrap avoids programs where a builtin
# does (each costs a few ms of a node's start-up).
REMOTE_PREFIX = """exec bash --norc -c 'IFS= read -r n && eval "$(head -c "$n")"' slurmgen-launch"""

# The per-node bootstrap, evaluated by `bash -c` with the key=value arguments as "$@".
# The heartbeat files are the bundled trainer's (slurmgen/train/logs.py):
#   HEARTBEAT_DIR/rank-NNNNN.json = {"rank", "step", "time", "pid", "host", "status"}
# A rank counts as hung when its file was written during this attempt, says "running", and
# its `time` (the writer's clock, so a shared file system's clock does not matter) is older
# than the limit. Ranks that have not written one yet are not judged (their start-up is
# bounded by the trainer's own --init-timeout).
BOOTSTRAP = r"""
set -uo pipefail
me=slurmgen-launch
fail() { printf '%s: error: %s\n' "$me" "$*"; exit 2; }
attempt=1 workdir=. master_addr='' master_port='' nnodes='' nproc='' node_rank='' rank_offset=''
world_size='' log_dir='' stop_grace=1 heartbeat_ms=0 heartbeat_dir=''
for arg in "$@"; do
  case $arg in
    attempt=* | workdir=* | master_addr=* | master_port=* | nnodes=* | nproc=* | node_rank=* | \
      rank_offset=* | world_size=* | log_dir=* | stop_grace=* | heartbeat_ms=* | heartbeat_dir=*)
      printf -v "${arg%%=*}" '%s' "${arg#*=}" ;;
    *) fail "unknown argument '$arg'" ;;
  esac
done
# Everything from here on reaches sshd through a relay that outlives a lost connection: with
# SIGPIPE ignored and /dev/null as a second output it keeps draining, so no process of the
# node dies of a broken pipe before the lifeline below has stopped it properly.
exec > >(tee -p /dev/null) 2>&1

# --- the payload: node script and environment, then stdin is the lifeline ---
IFS=' ' read -r magic script_len env_len || fail "no payload on stdin"
[[ $magic == PAYLOAD_MAGIC && $script_len =~ ^[0-9]+$ && $env_len =~ ^[0-9]+$ ]] ||
  fail "unexpected payload header (slurmgen versions differ?)"
dir=$(mktemp -d "${TMPDIR:-/tmp}/slurmgen-launch.XXXXXXXX") || fail "cannot create a temporary directory"
trap 'rm -rf -- "$dir"' EXIT
script=$dir/launch_multi_node.sh
head -c "$script_len" >"$script"
env_text=$(head -c "$env_len")
IFS= read -r end
[[ $end == PAYLOAD_END ]] || fail "the node script and environment arrived cut short"
eval "$env_text" || fail "the environment sent on stdin is not valid"
unset env_text

cd -- "$workdir" 2>/dev/null || fail "working directory '$workdir' does not exist on $HOSTNAME (see --workdir)"
# The launcher itself stops every node when one fails: the node script's own link stays off.
export SLURMGEN_LINK=off
export MASTER_PORT=$master_port SLURMGEN_RANK_OFFSET=$rank_offset SLURMGEN_WORLD_SIZE=$world_size \
  SLURMGEN_LOG_DIR=$log_dir SLURMGEN_STOP_GRACE=$stop_grace SLURMGEN_FAIL_GRACE=$stop_grace \
  SLURMGEN_ATTEMPT=$attempt
# The heartbeat contract (slurmgen/train/logs.py): ranks write where the watcher reads.
if ((heartbeat_ms > 0)); then export SLURMGEN_HEARTBEAT_DIR=$heartbeat_dir; fi
[[ -d $log_dir ]] || mkdir -p -- "$log_dir" 2>/dev/null ||
  fail "cannot create the log directory '$log_dir' on $HOSTNAME"

bash "$script" "$master_addr" "$nnodes" "$nproc" "$node_rank" </dev/null &
loop=$!

# Lifeline: stdin ends when the launcher stops the job or the connection is lost. (`<&0`:
# a background job would read /dev/null otherwise.)
{
  while IFS= read -r _; do :; done
  kill -TERM "$loop" 2>/dev/null
} <&0 &
lifeline=$!

now_ms() {
  local t=${EPOCHREALTIME/./}
  printf -v "$1" '%d' "$((10#$t / 1000))"
}
watch_heartbeats() {
  local start now f text ms frac r running='"status": *"running"' time_re='"time": *([0-9]+)[.]?([0-9]*)'
  now_ms start
  while sleep 0.5; do
    now_ms now
    for ((r = rank_offset; r < rank_offset + nproc; r++)); do
      printf -v f '%s/rank-%05d.json' "$heartbeat_dir" "$r"
      text=
      { IFS= read -r text <"$f"; } 2>/dev/null
      [[ $text =~ $running && $text =~ $time_re ]] || continue
      frac=${BASH_REMATCH[2]}000
      ms=$((10#${BASH_REMATCH[1]} * 1000 + 10#${frac:0:3}))
      ((ms >= start && now - ms > heartbeat_ms)) || continue
      printf '%s: rank %d: no heartbeat for %d ms (limit %d ms, %s): counted as failed with exit code EXIT_HUNG; stopping the ranks on this node\n' \
        "$me" "$r" "$((now - ms))" "$heartbeat_ms" "$f"
      : >"$dir/hung"
      kill -TERM "$loop" 2>/dev/null
      return
    done
  done
}
watcher=
if ((heartbeat_ms > 0)); then
  watch_heartbeats </dev/null &
  watcher=$!
fi

trap 'kill -TERM "$loop" 2>/dev/null' TERM INT HUP
while :; do
  wait "$loop"
  status=$?
  kill -0 "$loop" 2>/dev/null || break
done
kill "$lifeline" $watcher 2>/dev/null
if [[ -e $dir/hung ]]; then status=EXIT_HUNG; fi
exit "$status"
""".replace("PAYLOAD_MAGIC", PAYLOAD_MAGIC).replace("PAYLOAD_END", PAYLOAD_END).replace(
    "EXIT_HUNG", str(EXIT_HUNG)).lstrip()


def node_args(plan: "LaunchPlan", node: "NodePlan", attempt: int) -> list[str]:
    """The bootstrap's key=value arguments for one node (no secrets: they are on a command line)."""
    hb_ms = int(round(plan.heartbeat_timeout * 1000)) if plan.heartbeat_timeout else 0
    args = {
        "attempt": attempt, "workdir": plan.workdir, "master_addr": plan.master_addr,
        "master_port": plan.master_port, "nnodes": len(plan.nodes), "nproc": node.nproc,
        "node_rank": node.node_rank, "rank_offset": node.rank_offset, "world_size": plan.world_size,
        "log_dir": plan.log_dir, "stop_grace": plan.stop_grace, "heartbeat_ms": hb_ms,
    }
    if hb_ms:
        args["heartbeat_dir"] = plan.heartbeat_dir or "."
    return [f"{k}={v}" for k, v in args.items()]


def remote_command(plan: "LaunchPlan", node: "NodePlan", attempt: int) -> str:
    """The exact command line sent to the node's sshd."""
    return REMOTE_PREFIX + " " + " ".join(shlex.quote(a) for a in node_args(plan, node, attempt))


def env_text(env: dict[str, str], show_secrets: bool = True) -> str:
    """`export K=V` lines the bootstrap evaluates (values quoted for bash)."""
    return "".join(f"export {k}={quote(v if show_secrets else masked(k, v))}\n" for k, v in sorted(env.items()))


def payload(plan: "LaunchPlan", node: "NodePlan") -> bytes:
    """Bytes written to the session's stdin right after the command starts."""
    boot = BOOTSTRAP.encode()
    script = plan.script.encode()
    env = env_text(plan.node_env(node)).encode()
    header = f"{PAYLOAD_MAGIC} {len(script)} {len(env)}\n".encode()
    return f"{len(boot)}\n".encode() + boot + header + script + env + f"{PAYLOAD_END}\n".encode()
