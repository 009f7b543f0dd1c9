"""Every `SLURMGEN_*` environment variable: its name, the part of slurmgen that owns it, what it means.

One table, so that a name is spelt once (code takes the constant, templates are handed it),
the reference page is generated from it, and a test can find a variable used anywhere that is
not declared here. "Owner" is the part that sets the variable or, for a setting a user gives,
the part that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Var:
    name: str
    owner: str
    meaning: str
    user: bool = False  # a setting people give (True) or one slurmgen passes between its own parts


_VARS = (
    # What every rank sees, whichever launcher started it.
    Var(
        "SLURMGEN_BACKEND",
        "generated scripts, launch, coordinator",
        "The torch.distributed backend the job asked for (auto, nccl, gloo); the trainer's --backend default.",
    ),
    Var(
        "SLURMGEN_HEARTBEAT_DIR",
        "every launcher",
        "Directory where each rank writes its heartbeat file (the heartbeat protocol); unset: no heartbeats.",
    ),
    Var(
        "SLURMGEN_HEARTBEAT_BASE",
        "run_slurm.sh",
        "Per-attempt parent of the nodes' heartbeat directories in a Slurm job.",
    ),
    Var(
        "SLURMGEN_HANG_FACTOR",
        "the spec's hang_factor (observe reads it)",
        "k of the learned hang timeout, max(floor, k x p99 step time) (contract/hangs.py; default 3, 0: off).",
        user=True,
    ),
    Var(
        "SLURMGEN_HANG_FLOOR",
        "the spec's hang_floor (observe reads it)",
        "Seconds below which a learned hang timeout never goes (contract/hangs.py; default 30).",
        user=True,
    ),
    Var(
        "SLURMGEN_PYSPY",
        "generated scripts' hang watchers",
        "0: never run py-spy on a hung rank whose program registered no stack signal (default: when installed).",
        user=True,
    ),
    Var(
        "SLURMGEN_TIMELINE_FILE",
        "every launcher (run_slurm.sh, launch, launch_multi_node.sh, coordinator)",
        "JSON Lines file where each rank (and its launcher) appends its phases and step samples "
        "(contract/phases.py); unset: none.",
    ),
    Var(
        "SLURMGEN_GROUP",
        "every launcher (tracking reads it)",
        "Run group of a job's run records (slurm-<id>, launch-<id>, the coordinator group's name).",
        user=True,
    ),
    Var(
        "SLURMGEN_JOB_TYPE", "tracking", "Template of a run record's job type, e.g. node_{node}_rank_{rank}.", user=True
    ),
    Var(
        "SLURMGEN_RUN_NAME", "tracking", "Name of the run record (default: the trainer's output directory).", user=True
    ),
    Var("SLURMGEN_DESCRIPTION", "tracking", "Free text stored in the run record.", user=True),
    Var("SLURMGEN_TRACK", "train", "Which ranks keep run records: rank0, per-process or off.", user=True),
    Var("SLURMGEN_TRACKERS", "tracking", "Comma-separated tracker adapters to mirror run records to.", user=True),
    Var(
        "SLURMGEN_ATTEMPT",
        "launch, run_slurm.sh, coordinator",
        "Number of this attempt of the job, from 1 (restarts and requeues count; contract/attempts.py).",
    ),
    Var("SLURMGEN_LAUNCH_ID", "launch", "Id of one `slurmgen launch` run, shared by all its nodes."),
    # The Slurm job's script and the trainer.
    Var(
        "SLURMGEN_REQUEUE",
        "run_slurm.sh (train reads it)",
        "1/0: whether the trainer asks Slurm to requeue the job on the time-limit warning signal.",
    ),
    Var(
        "SLURMGEN_PREEMPT_SIGNAL",
        "run_slurm.sh (train reads it)",
        "The time-limit warning signal (USR2 or USR1) the trainer checkpoints and requeues on.",
    ),
    Var(
        "SLURMGEN_STRATEGY",
        "the spec's env (train reads it)",
        "ddp or fsdp: how the bundled trainer distributes the model; the trainer's --strategy default.",
        user=True,
    ),
    Var(
        "SLURMGEN_PREEMPT_CONTRACT",
        "jobs (cancel --signal reads the job's spec env)",
        "1: the program declares it checkpoints on the preemption signal (the bundled trainer does).",
        user=True,
    ),
    Var("SLURMGEN_SWEEP_INDEX", "run_slurm.sh", "This array task's row of the sweep grid."),
    Var("SLURMGEN_SWEEP_FILE", "run_slurm.sh", "The sweep grid file (JSON Lines), relative to SLURM_SUBMIT_DIR."),
    Var(
        "SLURMGEN_CHAIN",
        "jobs (submit --chain), run_slurm.sh",
        "The chain a link belongs to: its first link's job id (one run directory and run record for every link).",
    ),
    # launch_multi_node.sh and the SSH launcher's node bootstrap.
    Var("SLURMGEN_LOG_DIR", "launch_multi_node.sh", "Where per-rank logs go (default: the spec's log_dir).", user=True),
    Var("SLURMGEN_RANK_OFFSET", "launch, launch_multi_node.sh", "First RANK on this node when nodes differ in size."),
    Var("SLURMGEN_WORLD_SIZE", "launch, launch_multi_node.sh", "WORLD_SIZE when nodes differ in size."),
    Var(
        "SLURMGEN_STOP_GRACE",
        "launch_multi_node.sh",
        "Seconds between TERM and KILL when the node stops its ranks (default 30).",
        user=True,
    ),
    Var(
        "SLURMGEN_FAIL_GRACE",
        "launch_multi_node.sh",
        "Seconds a failed rank's peers get to exit on their own before they are stopped.",
        user=True,
    ),
    Var(
        "SLURMGEN_START_TIMEOUT",
        "launch_multi_node.sh",
        "Seconds the master waits for every node to join the link (default 300).",
        user=True,
    ),
    Var(
        "SLURMGEN_LINK",
        "launch_multi_node.sh",
        "on/off: the node link that stops every node when one fails.",
        user=True,
    ),
    Var(
        "SLURMGEN_LINK_PORT", "launch_multi_node.sh", "TCP port of the node link (default MASTER_PORT + 1).", user=True
    ),
    Var(
        "SLURMGEN_LINK_TOKEN",
        "launch_multi_node.sh",
        "Shared secret of the node link; the same on every node.",
        user=True,
    ),
    Var("SLURMGEN_PYTHON", "launch_multi_node.sh", "Python 3.8+ that runs the node link agent.", user=True),
    Var("SLURMGEN_EVENT_FD", "launch", "File descriptor on which a node reports rank events to `slurmgen launch`."),
    Var(
        "SLURMGEN_WARM_DIR",
        "launch (--restart-mode warm), run_slurm.sh (restart_mode: warm)",
        "A directory of the node's own where the launcher writes the new world of a warm restart "
        "(contract/warm.py); unset: a failed peer ends the rank as before.",
    ),
    Var(
        "SLURMGEN_WARM_GENERATION",
        "launch (--restart-mode warm), run_slurm.sh (restart_mode: warm)",
        "The generation of the world a fresh process joins after a warm restart (absent: 0, the first).",
    ),
    Var(
        "SLURMGEN_WARM_BASE",
        "run_slurm.sh (restart_mode: warm)",
        "Per-attempt parent of the nodes' warm restart directories in a Slurm job (SLURMGEN_WARM_DIR is its "
        "node's own below it).",
    ),
    Var(
        "SLURMGEN_STOP_FILE",
        "launch",
        "A file the node bootstrap creates before it stops the node script by TERM, which a script "
        "started a moment too late to catch the signal finds once its traps are set.",
    ),
    # Commands run by people.
    Var(
        "SLURMGEN_REGISTRY",
        "jobs (submit, launch and serve record runs in it)",
        "The SQLite registry of runs (default ~/.local/state/slurmgen/jobs.sqlite).",
        user=True,
    ),
    Var("SLURMGEN_SERVER", "coordinator", "URL of `slurmgen serve` for agents and `slurmgen group`.", user=True),
    Var("SLURMGEN_TOKEN", "coordinator", "The coordinator's access token.", user=True),
    Var(
        "SLURMGEN_SLURM_TIMEOUT",
        "jobs",
        "Seconds `status`, `jobs`, `cancel` wait for each Slurm query (asked twice) before saying the controller "
        "does not answer (default 0.8).",
        user=True,
    ),
    Var(
        "SLURMGEN_DOCTOR_PORT_TIMEOUT",
        "doctor",
        "Seconds every node has to reach MASTER_PORT in the preflight.",
        user=True,
    ),
    # Internal to one part.
    Var("SLURMGEN_TRAIN_SPAWNED", "train", "Set in the processes `python -m slurmgen.train --nproc N` spawns itself."),
    Var(
        "SLURMGEN_TRAIN_SLOW",
        "train",
        "Test hook: RANK:SECONDS makes that rank sleep SECONDS in each step (a straggler).",
    ),
    Var("SLURMGEN_TRAIN_FAULT", "train", "Test hook: a named fault injected into checkpoint writes."),
)
VARS: dict[str, Var] = {v.name: v for v in _VARS}

# The names code sets or reads, one constant each (a test finds any "SLURMGEN_..." literal elsewhere);
# a name only the templates use (SLURMGEN_PYSPY, SLURMGEN_STOP_FILE) is in the table alone.

BACKEND = "SLURMGEN_BACKEND"
HEARTBEAT_DIR = "SLURMGEN_HEARTBEAT_DIR"
HEARTBEAT_BASE = "SLURMGEN_HEARTBEAT_BASE"
TIMELINE_FILE = "SLURMGEN_TIMELINE_FILE"
HANG_FACTOR = "SLURMGEN_HANG_FACTOR"
HANG_FLOOR = "SLURMGEN_HANG_FLOOR"
GROUP = "SLURMGEN_GROUP"
JOB_TYPE = "SLURMGEN_JOB_TYPE"
RUN_NAME = "SLURMGEN_RUN_NAME"
DESCRIPTION = "SLURMGEN_DESCRIPTION"
TRACK = "SLURMGEN_TRACK"
TRACKERS = "SLURMGEN_TRACKERS"
ATTEMPT = "SLURMGEN_ATTEMPT"
LAUNCH_ID = "SLURMGEN_LAUNCH_ID"
REQUEUE = "SLURMGEN_REQUEUE"
PREEMPT_SIGNAL = "SLURMGEN_PREEMPT_SIGNAL"
PREEMPT_CONTRACT = "SLURMGEN_PREEMPT_CONTRACT"
STRATEGY = "SLURMGEN_STRATEGY"
SWEEP_INDEX = "SLURMGEN_SWEEP_INDEX"
CHAIN = "SLURMGEN_CHAIN"
SWEEP_FILE = "SLURMGEN_SWEEP_FILE"
LOG_DIR = "SLURMGEN_LOG_DIR"
RANK_OFFSET = "SLURMGEN_RANK_OFFSET"
WORLD_SIZE = "SLURMGEN_WORLD_SIZE"
STOP_GRACE = "SLURMGEN_STOP_GRACE"
FAIL_GRACE = "SLURMGEN_FAIL_GRACE"
START_TIMEOUT = "SLURMGEN_START_TIMEOUT"
LINK = "SLURMGEN_LINK"
LINK_PORT = "SLURMGEN_LINK_PORT"
LINK_TOKEN = "SLURMGEN_LINK_TOKEN"
PYTHON = "SLURMGEN_PYTHON"
EVENT_FD = "SLURMGEN_EVENT_FD"
WARM_DIR = "SLURMGEN_WARM_DIR"
WARM_GENERATION = "SLURMGEN_WARM_GENERATION"
WARM_BASE = "SLURMGEN_WARM_BASE"
REGISTRY = "SLURMGEN_REGISTRY"
SERVER = "SLURMGEN_SERVER"
TOKEN = "SLURMGEN_TOKEN"
SLURM_TIMEOUT = "SLURMGEN_SLURM_TIMEOUT"
DOCTOR_PORT_TIMEOUT = "SLURMGEN_DOCTOR_PORT_TIMEOUT"
TRAIN_SPAWNED = "SLURMGEN_TRAIN_SPAWNED"
TRAIN_FAULT = "SLURMGEN_TRAIN_FAULT"
TRAIN_SLOW = "SLURMGEN_TRAIN_SLOW"
