#!/usr/bin/env bash
# Set up everything (system packages, venv, test tools) and run the whole test suite:
# unit tests, and integration tests against real processes, a real Slurm and real sshd
# (the throwaway cluster of scripts/cluster/, brought up and torn down by the tests).
# Extra arguments go to pytest, e.g. `scripts/test.sh tests/unit -k hostlist`.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$repo/scripts/setup.sh" --test
cd "$repo"
exec "${SLURMGEN_VENV:-$repo/.venv}/bin/python" -m pytest -ra "$@"
