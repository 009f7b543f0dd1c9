# shellcheck shell=bash
# The variables are used by the scripts that source this file.
# shellcheck disable=SC2034
# Shared names and helpers of the throwaway test cluster (sourced by up.sh and down.sh).
#
# Every object the cluster creates carries a prefix, so tear-down can find leftovers of a
# crashed run without a state file and never touches anything it did not create:
#   bridge sgbr0, namespaces sg-node<N>, veths sgv<N>, an /etc/hosts block between markers,
#   daemons whose command line names the state directory, the state directory itself.

SG_DIR=${SLURMGEN_CLUSTER_DIR:-/tmp/slurmgen-cluster}
# First three octets of the private /24 that lives on our own bridge only. The namespaces get
# no default route, so nothing they send can leave this /24.
SG_SUBNET=${SLURMGEN_CLUSTER_SUBNET:-10.213.57}
SG_BRIDGE=sgbr0
SG_NS_PREFIX=sg-node
SG_VETH_PREFIX=sgv
# Up to 32 nodes for the launch benchmark (sshd and a shell per node); Slurm daemons run on
# at most the first 8 (the rest are SSH-only nodes).
SG_MAX_NODES=32
SG_MAX_SLURM_NODES=8
SG_HOSTS_BEGIN="# >>> slurmgen test cluster (scripts/cluster) >>>"
SG_HOSTS_END="# <<< slurmgen test cluster <<<"
# A file inside the state directory that proves we made it: down.sh deletes the directory
# recursively only when this marker is there (SLURMGEN_CLUSTER_DIR could point anywhere).
SG_MARKER=.slurmgen-cluster
# Daemons we start; used to recognise our own processes when pid files are gone.
SG_DAEMONS=(munged slurmctld slurmd slurmstepd sshd mariadbd slurmdbd)

sg_log() { printf '%s: %s\n' "${0##*/}" "$*" >&2; }
sg_die() { sg_log "error: $*"; exit 1; }
# Exit 3 = this machine cannot host the cluster (not root, packages missing, namespaces
# refused): the test fixture turns it into a skip naming the reason (a failure under CI=true).
sg_unavailable() { sg_log "unavailable: $*"; exit 3; }

sg_node_ip() { printf '%s.%d' "$SG_SUBNET" $((10 + $1)); }
sg_ctl_ip() { printf '%s.1' "$SG_SUBNET"; }

# Refuse state directories where a recursive delete would be a disaster.
sg_check_dir() {
  case $SG_DIR in
    /*) ;;
    *) sg_die "SLURMGEN_CLUSTER_DIR must be an absolute path (got '$SG_DIR')" ;;
  esac
  case ${SG_DIR%/} in
    "" | /tmp | /var/tmp | /root | /home | /etc | /usr | /var | /run | /work)
      sg_die "SLURMGEN_CLUSTER_DIR=$SG_DIR is too broad to be a private state directory" ;;
  esac
  if [[ -d $SG_DIR && ! -e $SG_DIR/$SG_MARKER ]] && [[ -n $(ls -A "$SG_DIR") ]]; then
    sg_die "$SG_DIR exists, is not empty and was not made by up.sh (no $SG_MARKER): refusing to use it"
  fi
}

sg_require_root() {
  ((EUID == 0)) || sg_unavailable "must run as root (network namespaces, slurmd and sshd need it)"
}

# One up.sh or down.sh at a time on this machine (the names they use are fixed), so that the
# owner check below and the bring-up after it are one step: two test sessions starting together
# could otherwise both find no owner. `flock -o` holds the lock in flock itself, not in the
# daemons we start; waiting longer than a bring-up takes counts as busy (exit 4). Re-runs the
# calling script under the lock; a down.sh that up.sh runs inherits it.
SG_LOCK=/run/lock/slurmgen-cluster.lock
sg_serialise() {
  [[ -z ${SG_LOCKED:-} ]] || return 0
  mkdir -p "${SG_LOCK%/*}"
  SG_LOCKED=1 exec flock -o -w 120 -E 4 "$SG_LOCK" "$BASH" "$0" "$@"
}

# A live process that owns the running cluster (a pytest session sets SLURMGEN_CLUSTER_OWNER to
# its pid): printed if it is alive and is not us, so a second test run does not tear down the
# cluster under the first one. A cluster brought up by hand has no owner and may be replaced.
sg_live_foreign_owner() {
  local owner
  owner=$(cat "$SG_DIR/owner" 2>/dev/null) || return 0
  [[ $owner =~ ^[0-9]+$ && -e /proc/$owner && $owner != "${SLURMGEN_CLUSTER_OWNER:-}" ]] || return 0
  printf '%s (%s)\n' "$owner" "$(tr '\0' ' ' </proc/"$owner"/cmdline 2>/dev/null | cut -c1-120)"
}

# Print the pids of our daemons in the root namespace: those whose executable is one of
# SG_DAEMONS and whose command line names our state directory (we pass every daemon its
# config file from there, so this matches our processes and no one else's). slurmdbd takes no
# config path: it reads slurmdbd.conf beside $SLURM_CONF, so its environment names the directory.
sg_own_daemon_pids() {
  local p comm stat cmd
  for p in /proc/[0-9]*; do
    # Builtin reads only: this loop visits every process on the machine.
    read -r comm 2>/dev/null <"$p/comm" || continue
    case " ${SG_DAEMONS[*]} " in *" $comm "*) ;; *) continue ;; esac
    read -r stat 2>/dev/null <"$p/stat" || continue
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]] || continue # a zombie is gone already, only not yet reaped
    cmd=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline") || continue
    if [[ $comm == slurmdbd ]]; then
      cmd=$(tr '\0' '\n' 2>/dev/null <"$p/environ" | grep -F "SLURM_CONF=$SG_DIR/") || continue
    fi
    [[ $cmd == *"$SG_DIR/"* ]] && printf '%s\n' "${p#/proc/}"
  done
  return 0
}

# Our namespaces that exist now (names only).
sg_namespaces() {
  ip netns list 2>/dev/null | awk -v pre="$SG_NS_PREFIX" '$1 ~ "^" pre "[0-9]+$" {print $1}'
}

# Our veths in the root namespace (names only, without the @peer suffix).
sg_veths() {
  ip -o link show 2>/dev/null | awk -F': ' -v pre="$SG_VETH_PREFIX" '{split($2, a, "@"); if (a[1] ~ "^" pre "[0-9]+$") print a[1]}'
}
