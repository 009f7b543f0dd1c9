#!/usr/bin/env bash
# Bring up a throwaway Slurm cluster with sshd on this one machine (run as root).
#
#   scripts/cluster/up.sh [N]       # N nodes node1..nodeN, default 2, at most 32
#   source /tmp/slurmgen-cluster/env.sh && srun -N2 hostname
#   scripts/cluster/down.sh
#
# Each node is a network namespace (sg-nodeK, address $SUBNET.(10+K) on bridge sgbr0) with its
# own hostname, its own slurmd and its own sshd on port 22. munged and slurmctld run in the root
# namespace on the bridge address. Nodes beyond the first SLURMGEN_CLUSTER_SLURM_NODES (at most
# 8) run sshd only: enough for `slurmgen launch`. Facts behind the choices:
# shared/notes/cluster-in-a-box.md.
#
# Accounting (unless SLURMGEN_CLUSTER_ACCOUNTING=0): MariaDB 10.11 on a unix socket inside its
# 0700 data directory, no TCP, and slurmdbd 22.05 on it (port 6819), so that `sacct` answers.
# Found out on Slurm 22.05.8: the client side toward slurmdbd takes the munge socket from
# AccountingStoragePass, not AuthInfo; slurmdbd.conf has no socket option, so slurmdbd gets
# MYSQL_UNIX_PORT; nothing is registered by hand (slurmctld adds the cluster, account root and
# user root; without AccountingStorageEnforce every job is recorded); jobacct_gather/none still
# records every step (batch, 0, 1, ...; no extern step without PrologFlags=Contain) with its
# state and exit code; sacct has a job's end up to a second after scontrol. Measured on the
# 2-core machine (`time scripts/cluster/up.sh 2`): 0.9-1.2 s without accounting, 3.2 s with it
# when quiet; alternated at load 4-8, 3.0-7.1 s with, 1.1-2.6 s without. slurmdbd creating its
# tables and slurmctld registering the cluster take most of it. mariadb-install-db is not run: the
# server skips its grant tables (only root reaches the socket), which saves 0.5-4 s.
#
# Environment (all optional):
#   SLURMGEN_CLUSTER_DIR     state directory (default /tmp/slurmgen-cluster)
#   SLURMGEN_CLUSTER_SUBNET  first three octets of the private /24 (default 10.213.57)
#   SLURMGEN_CLUSTER_GPUS    fake GPUs declared per node as Slurm GRES (default 4; 0 = none)
#   SLURMGEN_CLUSTER_CPUS    CPUs declared per node (default 8; a declaration only)
#   SLURMGEN_CLUSTER_TIMEOUT seconds to wait for each readiness step (default 30)
#   SLURMGEN_CLUSTER_SLURM_NODES  nodes with slurmd (default min(N, 8); 0 = no Slurm at all)
#   SLURMGEN_CLUSTER_KEEP_ON_FAIL=1  leave a failed bring-up in place for inspection
#   SLURMGEN_CLUSTER_OWNER   pid of the process that owns this cluster (the pytest fixture)
#   SLURMGEN_CLUSTER_FORCE=1 replace a cluster even if its owner is alive
#   SLURMGEN_CLUSTER_ACCOUNTING=0  no MariaDB and slurmdbd: `sacct` then says accounting is off
#
# Exit status: 0 up; 1 failed (cleaned up again); 3 this machine cannot host it (not root,
# commands missing, namespaces refused); 4 busy (another live test session owns it).
#
# Writes $SLURMGEN_CLUSTER_DIR/env.sh (source it) and cluster.json with the same facts.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"

n=${1:-2}
if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > SG_MAX_NODES)); then
  sg_die "node count must be 1..$SG_MAX_NODES (got '$n')"
fi
gpus=${SLURMGEN_CLUSTER_GPUS:-4}
cpus=${SLURMGEN_CLUSTER_CPUS:-8}
wait_s=${SLURMGEN_CLUSTER_TIMEOUT:-30}
slurm_n=${SLURMGEN_CLUSTER_SLURM_NODES:-$((n < SG_MAX_SLURM_NODES ? n : SG_MAX_SLURM_NODES))}
accounting=${SLURMGEN_CLUSTER_ACCOUNTING:-1}
[[ $accounting == [01] ]] || sg_die "SLURMGEN_CLUSTER_ACCOUNTING must be 0 or 1 (got '$accounting')"
[[ $gpus =~ ^[0-9]+$ && $cpus =~ ^[1-9][0-9]*$ && $wait_s =~ ^[1-9][0-9]*$ && $slurm_n =~ ^[0-9]+$ ]] ||
  sg_die "SLURMGEN_CLUSTER_GPUS, _CPUS, _TIMEOUT and _SLURM_NODES must be whole numbers"
((slurm_n <= n && slurm_n <= SG_MAX_SLURM_NODES)) ||
  sg_die "SLURMGEN_CLUSTER_SLURM_NODES must be at most the node count and at most $SG_MAX_SLURM_NODES (got $slurm_n)"
[[ $SG_SUBNET =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] ||
  sg_die "SLURMGEN_CLUSTER_SUBNET must be three octets like 10.213.57 (got '$SG_SUBNET')"

if ((slurm_n == 0)); then accounting=0; fi

sg_require_root
sg_serialise "$@"
missing=()
needed=(ip nsenter unshare munged mungekey munge unmunge slurmctld slurmd sbatch srun sinfo
  scontrol squeue ssh ssh-keygen timeout /usr/sbin/sshd)
if ((accounting)); then needed+=(mariadbd mariadb-install-db mariadb slurmdbd sacctmgr); fi
for c in "${needed[@]}"; do
  command -v "$c" >/dev/null || missing+=("$c")
done
((${#missing[@]} == 0)) ||
  sg_unavailable "missing commands: ${missing[*]} (Debian packages slurmctld slurmd slurm-client munge openssh-server openssh-client iproute2 util-linux, and for accounting slurmdbd mariadb-server; scripts/setup.sh --test installs them; SLURMGEN_CLUSTER_ACCOUNTING=0 runs without accounting)"
sg_check_dir

# Exit 4 = busy: another live test session owns the cluster; the fixture waits and retries.
owner=$(sg_live_foreign_owner)
if [[ -n $owner && ${SLURMGEN_CLUSTER_FORCE:-0} != 1 ]]; then
  sg_log "busy: the cluster in $SG_DIR belongs to live pid $owner; wait for it, or SLURMGEN_CLUSTER_FORCE=1"
  exit 4
fi

# Idempotent: whatever an earlier (possibly crashed) run left goes first.
"$here/down.sh"

# The /24 must be ours alone: if any interface already has an address in it, traffic for the
# nodes could go somewhere else.
if ip -o -4 addr show | awk '{print $4}' | grep -q "^${SG_SUBNET//./\\.}\."; then
  sg_die "subnet $SG_SUBNET.0/24 is already in use on this machine; set SLURMGEN_CLUSTER_SUBNET"
fi

t_start=$EPOCHREALTIME
d=$SG_DIR
ctl_ip=$(sg_ctl_ip)
ctl_host=$(hostname -s)
dbd_port=6819 # slurmdbd's default port; it listens on every address, as slurmctld does
nodes=()
for ((i = 1; i <= n; i++)); do nodes+=("node$i"); done

on_exit() {
  local rc=$?
  trap - EXIT
  ((rc != 0)) || return 0
  sg_log "bring-up failed (exit $rc); last log lines:"
  local f
  for f in "$d"/log/*; do
    [[ -f $f ]] || continue
    printf '==> %s <==\n' "$f" >&2
    tail -n 15 "$f" >&2 || true
  done
  if [[ ${SLURMGEN_CLUSTER_KEEP_ON_FAIL:-0} == 1 ]]; then
    sg_log "SLURMGEN_CLUSTER_KEEP_ON_FAIL=1: left in place; run $here/down.sh when done"
  else
    "$here/down.sh" || true
  fi
  exit "$rc"
}
# Any failure (or a kill from a test's timeout) tears the half-built cluster down again.
trap on_exit EXIT
trap 'exit 143' TERM INT HUP

# --- state directory ---------------------------------------------------------------------
# 0755 everywhere: munged refuses a socket directory that others cannot traverse.
mkdir -p "$d"
touch "$d/$SG_MARKER"
if [[ -n ${SLURMGEN_CLUSTER_OWNER:-} ]]; then echo "$SLURMGEN_CLUSTER_OWNER" >"$d/owner"; fi
mkdir -p "$d"/{etc,log,run,munge,ssh,state/ctld}
for ((i = 1; i <= slurm_n; i++)); do mkdir -p "$d/state/node$i"; done # slurmd does not create it
chmod 755 "$d" "$d"/{etc,log,run,munge,ssh,state}
if [[ ! -d /run/sshd ]]; then
  mkdir -p /run/sshd
  chmod 755 /run/sshd
  # The note lives inside /run/sshd so that down.sh finds it even if the state dir is gone.
  touch /run/sshd/.slurmgen-cluster-made-this
fi

# --- keys: all fresh per cluster, so nothing trusts a key from an earlier run ------------------
mungekey --create --keyfile="$d/munge/munge.key"
chmod 600 "$d/munge/munge.key"
ssh-keygen -q -t ed25519 -N '' -C "slurmgen-cluster client" -f "$d/ssh/id_ed25519"
cp "$d/ssh/id_ed25519.pub" "$d/ssh/authorized_keys"
: >"$d/ssh/known_hosts"
for ((i = 1; i <= n; i++)); do
  node=node$i
  ssh-keygen -q -t ed25519 -N '' -C "$node host key" -f "$d/ssh/host_${node}_ed25519"
  # Written from the key we just generated: no keyscan, no trust on first use.
  printf '%s,%s %s\n' "$node" "$(sg_node_ip "$i")" \
    "$(cut -d' ' -f1,2 "$d/ssh/host_${node}_ed25519.pub")" >>"$d/ssh/known_hosts"
done

# --- network: bridge, one namespace + veth per node, no default route anywhere --------------
# A sandbox may refuse bridges or namespaces: that is "unavailable" (exit 3), not a bug.
if ! err=$(ip link add "$SG_BRIDGE" type bridge forward_delay 0 2>&1); then
  sg_unavailable "cannot create bridge $SG_BRIDGE: $err"
fi
ip addr add "$ctl_ip/24" dev "$SG_BRIDGE"
ip link set "$SG_BRIDGE" up
for ((i = 1; i <= n; i++)); do
  ns=$SG_NS_PREFIX$i
  if ! err=$(ip netns add "$ns" 2>&1); then
    sg_unavailable "ip netns add $ns refused: $err"
  fi
  ip link add "$SG_VETH_PREFIX$i" type veth peer name eth0 netns "$ns"
  ip link set "$SG_VETH_PREFIX$i" master "$SG_BRIDGE" up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$(sg_node_ip "$i")/24" dev eth0
  ip -n "$ns" link set eth0 up
done

# --- names: node1..nodeN resolve on every "node" (one machine, one /etc/hosts) ---------------
{
  printf '%s\n' "$SG_HOSTS_BEGIN"
  for ((i = 1; i <= n; i++)); do printf '%s node%d\n' "$(sg_node_ip "$i")" "$i"; done
  printf '%s\n' "$SG_HOSTS_END"
} >>/etc/hosts

# --- Slurm configuration ------------------------------------------------------------------------
conf=$d/etc/slurm.conf
node_gres=()
if ((gpus > 0)); then node_gres=("Gres=gpu:$gpus"); fi
{
  cat <<EOF
# Generated by scripts/cluster/up.sh for the slurmgen test cluster; deleted by down.sh.
ClusterName=slurmgen
SlurmctldHost=$ctl_host($ctl_ip)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge/munged.sock
StateSaveLocation=$d/state/ctld
SlurmdSpoolDir=$d/state/%n
SlurmctldPidFile=$d/run/slurmctld.pid
SlurmdPidFile=$d/run/slurmd-%n.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in the namespaces: track tasks by process tree, gather no usage (jobs, steps and
# their exit codes reach the accounting database without a gather plugin).
ProctrackType=proctrack/linuxproc
# Binding with sched_setaffinity, which needs no cgroups, so that srun --cpu-bind binds as on a
# real site. Found out on Slurm 22.05.8: each step is held to the CPUs the job has on the node,
# mapped onto the machine's real ones (a node declares more CPUs than the machine has: CPUs past
# them are dropped, and a job given only those runs unbound); a --cpu-bind step can lay out at
# most as many tasks per node as the machine has cores ("Unable to layout tasks on given cpus").
# TaskPluginParam=none: no binding unless asked; the default binds a step whose tasks fill its
# cores, and a whole-node step (-c $cpus) then failed that layout.
TaskPlugin=task/affinity
TaskPluginParam=none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
EOF
  if ((accounting)); then
    printf 'AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=%s\nAccountingStoragePort=%s\n' \
      "$ctl_ip" "$dbd_port"
    # Toward slurmdbd, Slurm 22.05 takes the munge socket from here, not from AuthInfo: without
    # it sacctmgr, sacct and slurmctld fail with "Failed to access /run/munge/munge.socket.2".
    echo "AccountingStoragePass=$d/munge/munged.sock"
  else
    echo "AccountingStorageType=accounting_storage/none"
  fi
  cat <<EOF
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# CPUs, memory and GPUs below are declarations bigger than the machine: trust them instead of
# draining the node for "Low socket*core*thread count".
SlurmdParameters=config_overrides
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
# Short grace between SIGTERM and SIGKILL for cancelled jobs: tests wait for tasks to vanish.
KillWait=5
# Ended jobs stay visible to scontrol for 5 minutes (afterwards only sacct knows them).
MinJobAge=300
# Start batch jobs as soon as they are allocated: the default delay (up to 3 s, meant for high
# submission rates) was 2-3 s of every test job's pending time here.
SchedulerParameters=batch_sched_delay=0
EOF
  if ((gpus > 0)); then echo "GresTypes=gpu"; fi
  for ((i = 1; i <= slurm_n; i++)); do
    echo "NodeName=node$i NodeAddr=$(sg_node_ip "$i") CPUs=$cpus RealMemory=16000 ${node_gres[*]} State=UNKNOWN"
  done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
} >"$conf"
# Fake GPUs, enough for --gpus-per-node / --gres=gpu:K to schedule. Slurm 22.05 drops a gpu
# GRES without File= ("Removing file-less GPU"), and a regular file logs "not a valid character
# or block device": so each fake GPU is a character device with /dev/null's numbers (1,3).
if ((gpus > 0)); then
  mkdir -p "$d/dev"
  for ((g = 0; g < gpus; g++)); do mknod -m 666 "$d/dev/fakegpu$g" c 1 3; done
  echo "Name=gpu File=$d/dev/fakegpu[0-$((gpus - 1))]" >"$d/etc/gres.conf"
else
  : >"$d/etc/gres.conf"
fi
export SLURM_CONF=$conf

# --- daemons: foreground, stdin from /dev/null, output to files, exact pid recorded ---------------
# Output to files (not our stdout) so no daemon holds the caller's pipe open after we exit.
start() {
  local name=$1
  shift
  "$@" </dev/null >"$d/log/$name.out" 2>&1 &
  echo $! >"$d/run/$name.pid"
}
pid_of() { cat "$d/run/$1.pid"; }
pid_or_null() { cat "$d/run/$1.pid" 2>/dev/null || echo null; } # no Slurm daemon on an SSH-only node
# Poll "$@" every 0.2 s until it succeeds or $wait_s seconds pass; fail naming $what.
# Exit status 99 from "$@" means "this will never succeed": give up at once. A wait of 5 s or
# more is logged, so that a slow bring-up names its slow step.
wait_for() {
  local what=$1 deadline rc started=$SECONDS
  shift
  deadline=$(($(date +%s) + wait_s))
  while :; do
    rc=0
    "$@" >/dev/null 2>&1 || rc=$?
    if ((rc == 0)); then
      ((SECONDS - started < 5)) || sg_log "slow: $((SECONDS - started))s waiting for $what"
      return 0
    fi
    ((rc != 99)) || { sg_log "gave up waiting for $what"; return 1; }
    (($(date +%s) < deadline)) || { sg_log "timed out after ${wait_s}s waiting for $what"; return 1; }
    sleep 0.2
  done
}
check_alive() { [[ -e /proc/$(pid_of "$1") ]] || { sg_log "$1 died at start"; return 1; }; }
in_own_namespaces() {
  [[ $(readlink "/proc/$1/ns/net") != "$(readlink /proc/self/ns/net)" &&
    $(readlink "/proc/$1/ns/uts") != "$(readlink /proc/self/ns/uts)" ]]
}

# Accounting, so that `sacct` answers as on a real site: MariaDB on a unix socket in the state
# directory (no TCP at all), then slurmdbd on it, both before slurmctld so the controller
# registers with a database that already answers.
start_accounting() {
  # The socket lives in the 0700 data directory: only root reaches it, so the server can skip
  # its grant tables and with them mariadb-install-db (0.5 s idle, 4 s under load here).
  local db=$d/mariadb sock=$d/mariadb/mariadb.sock
  # Small InnoDB files and no fsync (the data is thrown away): with the defaults (a 96 MB redo
  # log, a sync per commit) slurmdbd's first CREATE TABLEs took 2 s longer.
  mkdir -m 700 "$db"
  start mariadb mariadbd --no-defaults --user=root --datadir="$db" --socket="$sock" --skip-networking \
    --skip-grant-tables --skip-name-resolve --pid-file="$d/run/mariadb.pid.own" --log-error="$d/log/mariadb.log" \
    --innodb-log-file-size=4M --innodb-buffer-pool-size=16M --innodb-data-file-path=ibdata1:4M:autoextend \
    --innodb-flush-method=nosync --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 --innodb-file-per-table=0
  db_up() {
    check_alive mariadb || return 99
    mariadb --no-defaults --socket="$sock" --user=root --execute='SELECT 1'
  }
  wait_for "MariaDB to answer on $sock (log: $d/log/mariadb.log)" db_up

  # No password to keep (the server checks none, see above); 0600 all the same, as slurmdbd wants.
  (
    umask 077
    cat >"$d/etc/slurmdbd.conf" <<EOF
# Generated by scripts/cluster/up.sh for the slurmgen test cluster; deleted by down.sh.
AuthType=auth/munge
AuthInfo=socket=$d/munge/munged.sock
DbdHost=$ctl_host
DbdPort=$dbd_port
SlurmUser=root
PidFile=$d/run/slurmdbd.pid.own
LogFile=$d/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
# "localhost": the MariaDB client library connects through the unix socket that
# MYSQL_UNIX_PORT names (slurmdbd.conf has no socket option).
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
EOF
  )
  # slurmdbd has no config flag: it reads slurmdbd.conf beside $SLURM_CONF (exported above).
  start slurmdbd env MYSQL_UNIX_PORT="$sock" slurmdbd -D
  dbd_up() {
    check_alive slurmdbd || return 99
    timeout 5 sacctmgr --noheader --parsable2 list cluster format=cluster
  }
  wait_for "slurmdbd to answer sacctmgr (log: $d/log/slurmdbd.log)" dbd_up
}

# Slurm: munged, slurmctld and a slurmd per Slurm node (none at all with 0 Slurm nodes).
if ((slurm_n > 0)); then
  start munged munged --foreground --key-file="$d/munge/munge.key" --socket="$d/munge/munged.sock" \
    --pid-file="$d/run/munged.pid.own" --log-file="$d/log/munged.log" --seed-file="$d/munge/munged.seed"
  munge_ok() { munge -n -S "$d/munge/munged.sock" | unmunge -S "$d/munge/munged.sock"; }
  wait_for "munged to answer on $d/munge/munged.sock" munge_ok

  if ((accounting)); then start_accounting; fi

  # -c: start from empty state; -i: ignore state we cannot recover (throwaway cluster).
  start slurmctld slurmctld -D -c -i -f "$conf"
  ctld_up() { check_alive slurmctld && timeout 5 scontrol ping | grep -q 'is UP'; }
  wait_for "slurmctld to answer scontrol ping" ctld_up

  for ((i = 1; i <= slurm_n; i++)); do
    node=node$i
    # nsenter, not `ip netns exec`: that remounts /sys and slurmd then fails to find cgroups.
    # unshare --uts gives the node its own hostname; each exec keeps the pid, so $! is slurmd.
    # The single quotes are intended: the inner sh expands its own positional parameters.
    # shellcheck disable=SC2016
    start "slurmd-$node" nsenter --net="/run/netns/$SG_NS_PREFIX$i" -- \
      unshare --uts -- /bin/sh -c 'hostname "$1" && exec slurmd -D -N "$1" -f "$2"' sh "$node" "$conf"
  done
fi

for ((i = 1; i <= n; i++)); do
  node=node$i
  cat >"$d/etc/sshd_$node.conf" <<EOF
# sshd of $node (slurmgen test cluster): key-only root login with the cluster's client key.
ListenAddress $(sg_node_ip "$i")
Port 22
HostKey $d/ssh/host_${node}_ed25519
PidFile $d/run/sshd-$node.pid.own
AuthorizedKeysFile $d/ssh/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
# Keys live under /tmp (world-writable): strict mode checks would reject them.
StrictModes no
UseDNS no
# Tests and the SSH benchmark open up to 8 x N connections at once.
MaxStartups 100:30:200
MaxSessions 64
AcceptEnv SLURMGEN_* MASTER_* WORLD_SIZE RANK LOCAL_RANK NODE_RANK
Subsystem sftp internal-sftp
LogLevel INFO
EOF
  # Join the node's network and UTS namespaces so `ssh nodeK hostname` prints nodeK; an
  # SSH-only node gets a UTS namespace of its own, as slurmd does above.
  if ((i <= slurm_n)); then
    # Not before slurmd's nsenter/unshare chain has entered both: under load sshd once joined
    # the root namespace and failed with "Bind to port 22 on <node ip> failed".
    wait_for "slurmd on $node to enter its namespaces" in_own_namespaces "$(pid_of "slurmd-$node")"
    start "sshd-$node" nsenter -t "$(pid_of "slurmd-$node")" --net --uts -- \
      /usr/sbin/sshd -D -e -f "$d/etc/sshd_$node.conf"
  else
    # shellcheck disable=SC2016
    start "sshd-$node" nsenter --net="/run/netns/$SG_NS_PREFIX$i" -- unshare --uts -- \
      /bin/sh -c 'hostname "$1" && exec /usr/sbin/sshd -D -e -f "$2"' sh "$node" "$d/etc/sshd_$node.conf"
  fi
done

# --- readiness ------------------------------------------------------------------------------
all_idle() {
  local state
  for ((i = 1; i <= n; i++)); do
    check_alive "sshd-node$i" || return 1
    ((i > slurm_n)) || check_alive "slurmd-node$i" || return 1
  done
  ((slurm_n > 0)) || return 0
  state=$(timeout 5 sinfo -h -N -o '%N %t' | sort -u)
  # A node the controller rejected (bad GRES, config mismatch) stays so: fail fast.
  if grep -Eq ' (inval|drain|drng|drained|fail)' <<<"$state"; then return 99; fi
  [[ $(grep -c ' idle$' <<<"$state") -eq $slurm_n ]]
}
if ! wait_for "all $n nodes up ($slurm_n of them idle in sinfo)" all_idle; then
  timeout 5 sinfo -N -o '%N %t %E' >&2 || true
  false
fi

cat >"$d/ssh/config" <<EOF
# ssh -F $d/ssh/config node1 hostname
Host ${nodes[*]}
  User root
  IdentityFile $d/ssh/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $d/ssh/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 5
  LogLevel ERROR
EOF
ssh_ok() { [[ $(timeout 5 ssh -F "$d/ssh/config" "$1" hostname) == "$1" ]]; }
for node in "${nodes[@]}"; do
  wait_for "sshd on $node to accept the client key and report hostname $node" ssh_ok "$node"
done

# --- facts for shells and tests --------------------------------------------------------------------
ips=()
for ((i = 1; i <= n; i++)); do ips+=("$(sg_node_ip "$i")"); done
join() {
  local IFS=$1
  shift
  echo "$*"
}
{
  echo "# Generated by scripts/cluster/up.sh: source it to use the test cluster."
  echo "export SLURMGEN_CLUSTER_DIR=$d"
  echo "export SLURM_CONF=$conf"
  echo "export SLURMGEN_CLUSTER_NODES=$(join , "${nodes[@]}")"
  echo "export SLURMGEN_CLUSTER_IPS=$(join , "${ips[@]}")"
  for ((i = 1; i <= n; i++)); do echo "export SLURMGEN_NODE${i}_IP=$(sg_node_ip "$i")"; done
  echo "export SLURMGEN_CLUSTER_CONTROLLER_IP=$ctl_ip"
  echo "export SLURMGEN_CLUSTER_GPUS_PER_NODE=$gpus"
  echo "export SLURMGEN_CLUSTER_CPUS_PER_NODE=$cpus"
  echo "export SLURMGEN_SSH_USER=root"
  echo "export SLURMGEN_SSH_KEY=$d/ssh/id_ed25519"
  echo "export SLURMGEN_KNOWN_HOSTS=$d/ssh/known_hosts"
  echo "export SLURMGEN_SSH_CONFIG=$d/ssh/config"
} >"$d/env.sh"
{
  printf '{\n  "dir": "%s",\n  "slurm_conf": "%s",\n' "$d" "$conf"
  printf '  "controller": {"host": "%s", "ip": "%s", "pid": %s},\n' "$ctl_host" "$ctl_ip" "$(pid_or_null slurmctld)"
  printf '  "munged_pid": %s,\n  "gpus_per_node": %s,\n  "cpus_per_node": %s,\n' "$(pid_or_null munged)" "$gpus" "$cpus"
  printf '  "accounting": %s,\n' "$( ((accounting)) && echo true || echo false)"
  printf '  "ssh": {"user": "root", "key": "%s", "known_hosts": "%s", "config": "%s"},\n' \
    "$d/ssh/id_ed25519" "$d/ssh/known_hosts" "$d/ssh/config"
  printf '  "nodes": [\n'
  for ((i = 1; i <= n; i++)); do
    printf '    {"name": "node%d", "ip": "%s", "netns": "%s", "slurmd_pid": %s, "sshd_pid": %s}%s\n' \
      "$i" "$(sg_node_ip "$i")" "$SG_NS_PREFIX$i" "$(pid_or_null "slurmd-node$i")" "$(pid_of "sshd-node$i")" \
      "$( ((i < n)) && echo ,)"
  done
  printf '  ]\n}\n'
} >"$d/cluster.json"

trap - EXIT
sg_log "$n nodes up in $(awk -v a="$t_start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}')s; source $d/env.sh"
