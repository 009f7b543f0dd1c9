"""Names of the files slurmgen's parts hand each other beside a job's logs.

`run_slurm.sh` writes them (the template is handed the parts around the job id), `slurmgen
status` and the healing logic read them: one spelling for both sides. The attempts record's
format is described in `heal/attempts.py`, which reads it.
"""

ATTEMPTS_NAME = "slurmgen-{job_id}.attempts.jsonl"
FINISHED_NAME = "slurmgen-{job_id}.finished"
# Every rank's phases and step samples (contract/phases.py), appended by the ranks themselves.
TIMELINE_NAME = "slurmgen-{job_id}.timeline.jsonl"
# A chain of jobs (`submit --chain`), named by its first link's id: its links' job ids, one a
# line in order (written at submit time, read by each link to cancel the ones after it), and the
# line why the chain ended (written by the link that ended it; per array task, `{chain}_{task}`),
# which makes a later link that starts anyway exit 0 at once, as the finished marker does.
CHAIN_JOBS_NAME = "slurmgen-chain-{job_id}.jobs"
CHAIN_ENDED_NAME = "slurmgen-chain-{job_id}.ended"
# Beside the run registry, not beside logs: a request to stop a running `slurmgen launch` or a
# coordinator group's run, written by the page or `slurmgen cancel` (jobs/control.py), taken by the
# launcher or by the `slurmgen serve` that runs the group (runs/stop_request.py).
CONTROL_DIR = "control"
LAUNCH_STOP_NAME = "launch-{launch_id}.stop"
GROUP_STOP_NAME = "group-{key}.stop"
# Also beside the registry: every line the nodes of a `slurmgen launch` sent, as its launcher
# showed them, for its run page (launch/registry_entry.py writes it; a rank's lines as srun labels them).
LAUNCH_LOGS_DIR = "launch-logs"
LAUNCH_LOG_NAME = "launch-{launch_id}.log"
# It keeps at most this many bytes: a chatty run must not fill the disk that holds the registry
# (whose last write, the verdict, would then fail). Each node keeps every rank's whole log.
LAUNCH_LOG_LIMIT = 64 * 2**20
# The Python stacks of hung ranks, each appended by the watcher that killed it (contract/hangs.py).
STACKS_NAME = "slurmgen-{job_id}.stacks.txt"
# A hung rank's Python stack, copied into the log directory by the node that killed it, under
# `slurmgen launch` (its bootstrap) and launch_multi_node.sh: one file per rank, rewritten at each
# hang of that rank. The run page reads it (coordinator/web/run_stacks.py).
LAUNCH_STACK_NAME = "stack-rank-{rank}.txt"
# A rank's heartbeat file in the directory its launcher names in SLURMGEN_HEARTBEAT_DIR (the
# heartbeat protocol, observe/heartbeat.py), and the dump of a hung rank's Python stack beside it
# (contract/hangs.py). printf formats of the rank: Python fills them with `%`, the templates are
# handed them for bash's `printf -v`, and the watchers find every heartbeat by HEARTBEAT_GLOB.
HEARTBEAT_NAME = "rank-%05d.json"
HEARTBEAT_GLOB = HEARTBEAT_NAME.replace("%05d", "*")
STACK_NAME = "stack-%05d.txt"
# Prefix of torch's NCCL flight recorder dumps (TORCH_NCCL_DEBUG_INFO_TEMP_FILE): torch adds the rank.
NCCL_TRACE_NAME = "slurmgen-{job_id}.nccl-trace-rank"


def name_parts(name: str) -> tuple[str, str]:
    """A file name pattern split around its job id, for the template: ('slurmgen-', '.finished')."""
    before, _, after = name.partition("{job_id}")
    return before, after


# Where slurmgen.tracking.init() keeps run records unless told otherwise (one directory per group),
# relative to the working directory: the framework callbacks write there, `status` and the run
# page look there for any program but the bundled trainer (which keeps its own under OUT_DIR).
RECORDS_DIR = "runs"
