#!/usr/bin/env bash
# Tear down the throwaway test cluster made by up.sh, or whatever a crashed run left behind.
#
#   scripts/cluster/down.sh            # as root; safe to run any number of times
#
# Removes: every process in our namespaces (slurmd, slurmstepd, job tasks, sshd), our
# munged/slurmctld, the /etc/hosts block, veths, namespaces, bridge, /run/sshd if up.sh made
# it, and the state directory. Exits 1 (saying what) if anything of ours is still there.
#
# SLURMGEN_CLUSTER_SAVE_LOGS=<dir>: copy the daemons' logs there first (the state directory,
# logs included, is deleted).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"

sg_require_root
sg_serialise "$@"
sg_check_dir

if [[ -n ${SLURMGEN_CLUSTER_SAVE_LOGS:-} && -d $SG_DIR/log ]]; then
  mkdir -p "$SLURMGEN_CLUSTER_SAVE_LOGS"
  cp -r "$SG_DIR/log/." "$SLURMGEN_CLUSTER_SAVE_LOGS/" 2>/dev/null || true
fi

# Every pid to stop: all processes inside our namespaces (they can only be ours: we made the
# namespaces), and our daemons in the root namespace.
collect_pids() {
  local ns
  for ns in $(sg_namespaces); do
    ip netns pids "$ns" 2>/dev/null || true
  done
  sg_own_daemon_pids
}

# True while any of the pids runs. A zombie counts as gone: our daemons were reparented to
# this machine's init when up.sh exited, and it may reap them only later.
alive() {
  local p stat
  for p in "$@"; do
    read -r stat 2>/dev/null <"/proc/$p/stat" || continue
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]] && return 0
  done
  return 1
}

# TERM first so the daemons can unlink their sockets; the state is throwaway, so after a short
# grace of 1 s KILL (slurmctld alone takes 7-8 s to shut down cleanly; slurmstepd and the
# tasks of a running job can linger too), which tests cannot afford to wait for.
mapfile -t pids < <(collect_pids | sort -un)
if ((${#pids[@]})); then
  # MariaDB's clean shutdown alone took 1.4-2 s, for data that is deleted next: KILL it at once.
  for p in "${pids[@]}"; do
    read -r comm 2>/dev/null <"/proc/$p/comm" || continue
    if [[ $comm == mariadbd ]]; then kill -KILL "$p" 2>/dev/null || true; fi
  done
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 10); do
    alive "${pids[@]}" || break
    sleep 0.1
  done
  # Anything forked meanwhile (a task that was starting) is collected again.
  mapfile -t pids < <(collect_pids | sort -un)
  if ((${#pids[@]})) && alive "${pids[@]}"; then
    kill -KILL "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 50); do
      alive "${pids[@]}" || break
      sleep 0.1
    done
  fi
fi

# /etc/hosts may be a bind mount (containers): rewrite it in place instead of renaming over it.
if grep -qF "$SG_HOSTS_BEGIN" /etc/hosts 2>/dev/null; then
  hosts_new=$(awk -v b="$SG_HOSTS_BEGIN" -v e="$SG_HOSTS_END" '
    $0 == b {skip = 1; next}
    $0 == e {skip = 0; next}
    !skip' /etc/hosts)
  printf '%s\n' "$hosts_new" >/etc/hosts
fi

# Veths before namespaces: a veth whose peer still lingers blocks an immediate re-create.
for v in $(sg_veths); do
  ip link del "$v" 2>/dev/null || true
done
for ns in $(sg_namespaces); do
  ip netns del "$ns" 2>/dev/null || true
done
if ip link show "$SG_BRIDGE" >/dev/null 2>&1; then
  ip link del "$SG_BRIDGE" 2>/dev/null || true
fi

# sshd insists on /run/sshd; up.sh made it only if it was missing and left a note saying so.
if [[ -e /run/sshd/.slurmgen-cluster-made-this ]]; then
  rm -f /run/sshd/.slurmgen-cluster-made-this
  rmdir /run/sshd 2>/dev/null || true
fi
if [[ -e $SG_DIR/$SG_MARKER ]]; then
  rm -rf "$SG_DIR"
elif [[ -d $SG_DIR ]]; then
  rmdir "$SG_DIR" 2>/dev/null || true
fi

# Say exactly what survived, so a broken tear-down is loud instead of poisoning the next run.
left=()
[[ -n $(collect_pids) ]] && left+=("processes: $(collect_pids | tr '\n' ' ')")
[[ -n $(sg_namespaces) ]] && left+=("namespaces: $(sg_namespaces | tr '\n' ' ')")
[[ -n $(sg_veths) ]] && left+=("veths: $(sg_veths | tr '\n' ' ')")
ip link show "$SG_BRIDGE" >/dev/null 2>&1 && left+=("bridge $SG_BRIDGE")
grep -qF "$SG_HOSTS_BEGIN" /etc/hosts 2>/dev/null && left+=("/etc/hosts block")
[[ -e $SG_DIR ]] && left+=("state directory $SG_DIR")
if ((${#left[@]})); then
  sg_die "tear-down left: ${left[*]}"
fi
exit 0
