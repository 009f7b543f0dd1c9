"""Jobs that heal under Slurm: hang detection, the retry policy and the per-job attempts record.

The behaviour itself lives in the generated `run_slurm.sh` (bash, so nodes need nothing from
slurmgen): a watcher step reads the ranks' heartbeat files (the contract in
`slurmgen/train/logs.py`) and kills a rank that went stale; after the job step the script
decides whether to start a new step in the same allocation (`--restarts`, `--spare-nodes`) or
to requeue (`--retries`, `--retry-on`, `--exclude-failed-node`) and appends one line per
attempt to the attempts record. This package owns what Python needs of that:
the record's file names and format (`attempts.py`), read by `slurmgen status`, and the values
rendered into the script. Import-free of heavy modules: `slurmgen create` imports it.
"""
