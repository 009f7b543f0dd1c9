#!/usr/bin/env bash
# Set up everything (system packages, venv, test tools) and run the whole test suite:
# unit tests, and integration tests against real processes, a real Slurm and real sshd
# (the throwaway cluster of scripts/cluster/, brought up and torn down by the tests).
# Extra arguments go to pytest, e.g. `scripts/test.sh tests/unit -k hostlist`.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$repo/scripts/setup.sh" --test
cd "$repo"
venv=${SLURMGEN_VENV:-$repo/.venv}
# Generated scripts run `python ...`: it must be the venv's, with torch and slurmgen.
export PATH="$venv/bin:$PATH"
# Everything the tests and the programs they start put in TMPDIR (pytest's tmp_path,
# torchrun's torchelastic_* directories, ...) lives in one directory, removed at the end.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/slurmgen-tests.XXXXXX")
trap 'rm -rf -- "$scratch"' EXIT
export TMPDIR=$scratch
# ...and so do the caches they fill (slurmgen's compiled templates, chromium's): none is left in ~/.cache.
export XDG_CACHE_HOME=$scratch/cache
status=0
"$venv/bin/python" -m pytest -ra --basetemp="$scratch/pytest" "$@" || status=$?
exit "$status"
