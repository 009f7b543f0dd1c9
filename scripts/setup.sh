#!/usr/bin/env bash
# Set up everything slurmgen needs on a fresh Debian/Ubuntu machine, idempotently:
#   system packages (apt, only what is missing) and a virtualenv with slurmgen installed.
#
#   scripts/setup.sh          # runtime: slurmgen + torch (the `train` extra) + the coordinator (`serve`)
#   scripts/setup.sh --test   # also the test tools and the test cluster's packages
#
# The venv lives in $SLURMGEN_VENV (default: .venv in the repository). torch is pinned
# with $SLURMGEN_TORCH (default torch==2.13.0, the version this project is tested with).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${SLURMGEN_VENV:-$repo/.venv}
torch_spec=${SLURMGEN_TORCH:-torch==2.13.0}
with_test=0
for arg in "$@"; do
  case $arg in
    --test) with_test=1 ;;
    *) echo "setup.sh: unknown argument: $arg (expected --test)" >&2; exit 2 ;;
  esac
done

# --- system packages -------------------------------------------------------------
# The shellcheck package lints every generated script; the rest run the throwaway test
# cluster (scripts/cluster/): Slurm, munge, sshd, network namespaces, and slurmdbd on MariaDB so
# that sacct answers there (9 s more to install, 23 packages). chromium is the real
# browser the coordinator's page is tested in (driven by the playwright Python package; never
# `playwright install`, which downloads a browser build this network cannot fetch).
pkgs=(python3-venv bash procps)
if ((with_test)); then
  pkgs+=(shellcheck slurmctld slurmd slurm-client munge openssh-server openssh-client iproute2 util-linux pdsh nftables chromium slurmdbd mariadb-server)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if ! command -v apt-get >/dev/null; then
    echo "setup.sh: missing system packages (${missing[*]}) and no apt-get to install them" >&2
    exit 1
  fi
  sudo=()
  if ((EUID != 0)); then sudo=(sudo); fi
  echo "setup.sh: installing system packages: ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- python environment -------------------------------------------------------------
if [[ ! -x $venv/bin/python ]]; then
  echo "setup.sh: creating virtualenv $venv"
  python3 -m venv "$venv"
fi
extras=train,serve
if ((with_test)); then extras=train,serve,test; fi
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
"$venv/bin/python" -m pip install -q "$torch_spec" numpy
"$venv/bin/python" -m pip install -q -e "${repo}[${extras}]"
echo "setup.sh: ready: $venv ($("$venv/bin/python" -c 'import torch, slurmgen; print("slurmgen", slurmgen.__version__, "torch", torch.__version__)'))"
