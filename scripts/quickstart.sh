#!/usr/bin/env bash
# Set everything up and run the main job on this one machine, no cluster needed:
# render the scripts for 2 nodes x 2 processes (gloo, CPU), then start launch_multi_node.sh
# twice, as node 0 and node 1 of a job whose master is 127.0.0.1, exactly as you would on
# two real machines. The job is the bundled DDP trainer on its synthetic data set: a small
# GPT for 40 steps, checkpointed and logged by rank 0 into runs/quickstart.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$repo/scripts/setup.sh"
venv=${SLURMGEN_VENV:-$repo/.venv}
export PATH="$venv/bin:$PATH"
cd "$repo"

slurmgen create --nodes 2 --gpus 2 --backend gloo --output-dir out --force -- \
  python -m slurmgen.train --max-steps 40 --out-dir runs/quickstart --resume never
export MASTER_PORT=${MASTER_PORT:-29517}

out/launch_multi_node.sh 127.0.0.1 2 2 1 &
node1=$!
trap 'kill "$node1" 2>/dev/null || true' EXIT
status=0
out/launch_multi_node.sh 127.0.0.1 2 2 0 || status=$?
node1_status=0
wait "$node1" || node1_status=$?
trap - EXIT
if ((status == 0)); then status=$node1_status; fi
if ((status == 0)); then
  echo "quickstart: 2 nodes x 2 ranks trained together; scripts in out/, logs in out/logs, run in runs/quickstart"
else
  echo "quickstart: the job failed with exit code $status; see out/logs" >&2
fi
exit "$status"
