"""What `slurmgen launch` will start where: hosts, ranks, environment. Pure.

Hosts come from a Slurm hostlist (`--hosts`) or a DeepSpeed host file, filtered with
DeepSpeed's `--include` / `--exclude` syntax (`node1:0,1@node2`: all of node2, slots 0 and 1
of node1), then numbered by the topology rules of `create` (`topology.py`): master first,
the rest in alphabetical (default) or natural order, nodes may differ in size.

The environment every process gets, lowest precedence first:
1. variables of this shell whose names match the allow-list (`FORWARDED_ENV`);
2. env files (`KEY=VALUE` lines, DeepSpeed's `.deepspeed_env` format);
3. the spec's `env` and `--env K=V` (written into the node script itself).
Values of 1 and 2 travel on the SSH session's stdin, never on a command line.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from slurmgen.contract import envvars, warm
from slurmgen.contract.world import min_nodes_refusal
from slurmgen.errors import SlurmgenError, show
from slurmgen.generate.hostlist import is_host_name
from slurmgen.generate.spec import RESERVED_ENV
from slurmgen.generate.topology import Host, RankEntry, order_hosts, rank_table
from slurmgen.generate.user_files import read_text

if TYPE_CHECKING:
    from slurmgen.generate.spec import JobSpec

# Names forwarded from the launching shell (fnmatch patterns): settings of the job, the same
# on every node. Deliberately an explicit list: PATH, HOME and the like describe this
# machine, and so do its device selections (CUDA_VISIBLE_DEVICES from a one-GPU salloc would
# leave every other local rank of every node without a GPU) and its cache paths (HF_HOME,
# TORCH_HOME). Each node gets its own device list from its slots (`LaunchPlan.node_env`).
FORWARDED_ENV = (
    "NCCL_*",
    "GLOO_*",
    "UCX_*",
    "FI_*",
    "TORCH_NCCL_*",
    "TORCH_DISTRIBUTED_DEBUG",
    "TORCH_CPP_LOG_LEVEL",
    "TORCH_SHOW_CPP_STACKTRACES",
    "TORCH_LOGS",
    "CUDA_LAUNCH_BLOCKING",
    "PYTHONPATH",
    "PYTHONUNBUFFERED",
    "PYTHONFAULTHANDLER",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "HF_TOKEN",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "TRANSFORMERS_VERBOSITY",
    "WANDB_API_KEY",
    "WANDB_PROJECT",
    "WANDB_ENTITY",
    "WANDB_MODE",
    "WANDB_BASE_URL",
    "WANDB_TAGS",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_EXPERIMENT_NAME",
    "SWANLAB_API_KEY",
    "SWANLAB_PROJECT",
    "SWANLAB_WORKSPACE",
    "SWANLAB_MODE",
    # run records (slurmgen.tracking): names and trackers chosen where the job is launched
    envvars.GROUP,
    envvars.JOB_TYPE,
    envvars.RUN_NAME,
    envvars.DESCRIPTION,
    envvars.TRACK,
    envvars.TRACKERS,
)
# Values of names like these are never printed (dry run, errors).
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)
# Set by `slurmgen launch` itself for every node; users cannot override them.
LAUNCHER_ENV = RESERVED_ENV | {
    envvars.RANK_OFFSET,
    envvars.WORLD_SIZE,
    envvars.LOG_DIR,
    envvars.STOP_GRACE,
    envvars.FAIL_GRACE,
    envvars.EVENT_FD,
    envvars.WARM_DIR,
    envvars.WARM_GENERATION,
}
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# ---- --include / --exclude ------------------------------------------------------------------
def parse_filter(text: str, flag: str) -> dict[str, tuple[int, ...] | None]:
    """`node1:0,1@node2` -> {'node1': (0, 1), 'node2': None} (None: the whole host)."""
    result: dict[str, tuple[int, ...] | None] = {}
    if not text.strip():
        raise SlurmgenError(f"{flag}: empty filter (got {show(text)})", hint="e.g. node1:0,1@node2")
    for part in text.split("@"):
        name, sep, slots_text = part.strip().partition(":")
        if not is_host_name(name):
            raise SlurmgenError(f"{flag}: bad host {show(name)} in {show(text)}", hint="e.g. node1:0,1@node2")
        slots: tuple[int, ...] | None = None
        if sep:
            items = [s.strip() for s in slots_text.split(",")]
            if not items or not all(s.isdigit() for s in items):
                raise SlurmgenError(
                    f"{flag}: slots of {name} must be whole numbers separated by commas (got {show(slots_text)})"
                )
            slots = tuple(sorted({int(s) for s in items}))
        if name in result:
            raise SlurmgenError(f"{flag}: host {show(name)} is named twice in {show(text)}")
        result[name] = slots
    return result


def select_hosts(hosts: Sequence[Host], include: str | None = None, exclude: str | None = None) -> list[Host]:
    """Apply DeepSpeed-style filters; hosts left without slots drop out."""
    if include is not None and exclude is not None:
        raise SlurmgenError("include: --include and --exclude cannot be used together")
    if include is None and exclude is None:
        return list(hosts)
    flag = "include" if include is not None else "exclude"
    wanted = parse_filter(include if include is not None else exclude or "", flag)
    by_name = {h.name: h for h in hosts}
    for name, slots in wanted.items():
        if name not in by_name:
            raise SlurmgenError(f"{flag}: host {show(name)} is not one of the hosts {list(by_name)}")
        bad = sorted(set(slots or ()) - set(by_name[name].slots))
        if bad:
            raise SlurmgenError(f"{flag}: host {name} has no slot {bad[0]} (its slots: {list(by_name[name].slots)})")
    out: list[Host] = []
    for host in hosts:
        if flag == "include":
            if host.name not in wanted:
                continue
            chosen = wanted[host.name]
            out.append(Host(host.name, chosen if chosen is not None else host.slots))
        else:
            dropped = wanted.get(host.name, ())
            if dropped is None:
                continue
            left = tuple(s for s in host.slots if s not in dropped)
            if left:
                out.append(Host(host.name, left))
    if not out:
        raise SlurmgenError(f"{flag}: no host is left after the filter")
    return out


# ---- environment ------------------------------------------------------------------------------
def forwarded_env(environ: Mapping[str, str], patterns: Sequence[str] = FORWARDED_ENV) -> dict[str, str]:
    """The variables of `environ` whose names match one of `patterns` (and are not the launcher's)."""
    return {
        k: v
        for k, v in sorted(environ.items())
        if any(fnmatch.fnmatchcase(k, p) for p in patterns) and k not in LAUNCHER_ENV and _ENV_KEY.match(k)
    }


def parse_env_file(text: str, source: str) -> dict[str, str]:
    """`KEY=VALUE` lines as in DeepSpeed's .deepspeed_env; `#` comments, blank lines and an
    `export ` prefix are allowed; one pair of quotes around the whole value is removed."""
    env: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not _ENV_KEY.match(key):
            raise SlurmgenError(f"{source}:{number}: expected KEY=VALUE (got {show(key if sep else line)})")
        if key in LAUNCHER_ENV:
            raise SlurmgenError(f"{source}:{number}: {key} is set by slurmgen launch itself")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key] = value
    return env


def read_env_file(path: Path) -> dict[str, str]:
    return parse_env_file(read_text(path, "env_file"), str(path))


def masked(key: str, value: str) -> str:
    """A value as it may be shown to people: hidden for names that look like secrets."""
    return "<hidden>" if SECRET_NAME.search(key) else value


# ---- the plan ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodePlan:
    """One host of the launch: where it is in the job and which ranks it runs."""

    host: str
    node_rank: int
    entries: tuple[RankEntry, ...]

    @property
    def nproc(self) -> int:
        return len(self.entries)

    @property
    def rank_offset(self) -> int:
        return self.entries[0].rank

    @property
    def ranks(self) -> str:
        """`4-7`, or `4` for a single rank: how the summary and prefixes show them."""
        first, last = self.entries[0].rank, self.entries[-1].rank
        return str(first) if first == last else f"{first}-{last}"

    @property
    def slots(self) -> tuple[int, ...]:
        return tuple(e.slot for e in self.entries)


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start the job on every host, decided before any connection."""

    nodes: tuple[NodePlan, ...]
    world_size: int
    master_addr: str
    master_port: int
    workdir: str
    log_dir: str
    script: str  # the rendered launch_multi_node.sh
    env: dict[str, str] = field(default_factory=dict)  # forwarded + env files, sent on stdin
    stop_grace: int = 1
    heartbeat_timeout: float | None = None
    max_restarts: int = 0
    bind: str = "none"  # the spec's: each node plans its ranks' CPUs at start (templates/bind_cores.sh.j2)
    restart_mode: str = warm.COLD  # warm: the healthy ranks keep their processes (contract/warm.py)
    spares: tuple[Host, ...] = ()  # hot spare hosts: a lost host's node moves to the first that fits
    spare_addrs: Mapping[str, str] = field(default_factory=dict)  # a spare's address, should node 0 move there
    # A smaller world (--min-nodes): a lost host no spare replaces drops out while this many are left.
    min_nodes: int | None = None
    host_addrs: Mapping[str, str] = field(default_factory=dict)  # a job host's address, should node 0 drop out

    def node_env(self, node: NodePlan) -> dict[str, str]:
        """The stdin environment of one node: the shared one plus its GPU list when the
        slots are a subset (DeepSpeed does the same for `--include host:1,3`)."""
        env = dict(self.env)
        if node.slots != tuple(range(node.nproc)):
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s) for s in node.slots)
        return env


def node_plans(hosts: Sequence[Host], master: str | None = None, order: str = "alphabetical") -> tuple[NodePlan, ...]:
    """Hosts -> nodes in NODE_RANK order with their rank entries (`topology.order_hosts`)."""
    table = rank_table(order_hosts(hosts, master, order))
    nodes: list[NodePlan] = []
    for entry in table:
        if not nodes or nodes[-1].host != entry.host:
            nodes.append(NodePlan(entry.host, entry.node_rank, (entry,)))
        else:
            last = nodes[-1]
            nodes[-1] = NodePlan(last.host, last.node_rank, (*last.entries, entry))
    return tuple(nodes)


def build_plan(
    spec: JobSpec,
    hosts: Sequence[Host],
    *,
    master: str | None = None,
    order: str = "alphabetical",
    master_addr: str | Callable[[str], str] | None = None,
    workdir: str = ".",
    env: Mapping[str, str] | None = None,
    stop_grace: int = 1,
    heartbeat_timeout: float | None = None,
    max_restarts: int = 0,
    restart_mode: str = warm.COLD,
    spares: Sequence[Host] = (),
    min_nodes: int | None = None,
) -> LaunchPlan:
    """The plan for `hosts` (already filtered) running `spec`'s command.

    `master_addr`: the address every rank uses for rank 0; the spec's master_addr wins, else
    this string, else this function of the master's host name (e.g. its HostName in
    ~/.ssh/config), else the master's name as given.
    """
    from slurmgen.contract.ports import DEFAULT_MASTER_PORT
    from slurmgen.generate.preflight import warm_refusal
    from slurmgen.generate.render import launch_script

    if spec.container is not None and spec.container.runtime == "pyxis":
        raise SlurmgenError("container.runtime: pyxis needs Slurm's srun; use runtime apptainer with slurmgen launch")
    nodes = node_plans(hosts, master, order)
    world = sum(n.nproc for n in nodes)
    sized = msgspec.structs.replace(spec, nodes=len(nodes), gpus=max(n.nproc for n in nodes))
    if spec.master_addr:
        addr = spec.master_addr
    elif callable(master_addr):
        addr = master_addr(nodes[0].host)
    else:
        addr = master_addr or nodes[0].host
    if max_restarts < 0:
        raise SlurmgenError(f"max_restarts: must be 0 or more (got {max_restarts})")
    if heartbeat_timeout is not None and not heartbeat_timeout > 0:
        raise SlurmgenError(f"heartbeat_timeout: must be more than 0 seconds (got {heartbeat_timeout})")
    if stop_grace < 0:
        raise SlurmgenError(f"stop_grace: must be 0 or more seconds (got {stop_grace})")
    refused = warm_refusal(restart_mode, list(spec.command), workdir)
    if refused:
        raise SlurmgenError(refused)
    taken = sorted({s.name for s in spares} & {n.host for n in nodes})
    if taken:
        raise SlurmgenError(f"spare_hosts: {taken[0]} is also one of the job's hosts (a spare must be idle)")
    refused = min_nodes_refusal(min_nodes, len(nodes), max_restarts, give="--max-restarts N")
    if refused:
        raise SlurmgenError(refused)
    # Where the rendezvous goes if node 0 moves to a spare (or drops out): nowhere when its address was given.
    follow = (lambda name: name) if master_addr is None else master_addr if callable(master_addr) else None
    spare_addrs = {s.name: follow(s.name) for s in spares} if follow and not spec.master_addr else {}
    host_addrs = {n.host: follow(n.host) for n in nodes[1:]} if min_nodes and follow and not spec.master_addr else {}
    return LaunchPlan(
        nodes=nodes,
        world_size=world,
        master_addr=addr,
        master_port=spec.master_port or DEFAULT_MASTER_PORT,
        workdir=workdir,
        log_dir=spec.logs,
        script=launch_script(sized),
        env=dict(env or {}),
        stop_grace=stop_grace,
        heartbeat_timeout=heartbeat_timeout,
        max_restarts=max_restarts,
        bind=spec.bind,
        restart_mode=restart_mode,
        spares=tuple(spares),
        spare_addrs=spare_addrs,
        min_nodes=min_nodes,
        host_addrs=host_addrs,
    )


def move_to_spare(plan: LaunchPlan, host: str) -> LaunchPlan | None:
    """The plan with `host`'s node (its node rank, its ranks) on the first spare host with enough
    slots, None when no spare fits. Node 0 moving takes the rendezvous with it, unless the
    master's address was given (`spare_addrs` is empty then)."""
    node = next((n for n in plan.nodes if n.host == host), None)
    spare = next((s for s in plan.spares if node is not None and len(s.slots) >= node.nproc), None)
    if node is None or spare is None:
        return None
    entries = tuple(replace(e, host=spare.name, slot=slot) for e, slot in zip(node.entries, spare.slots))
    master = plan.spare_addrs.get(spare.name) if node.node_rank == 0 else None
    return replace(
        plan,
        nodes=tuple(NodePlan(spare.name, n.node_rank, entries) if n is node else n for n in plan.nodes),
        spares=tuple(s for s in plan.spares if s is not spare),
        master_addr=master or plan.master_addr,
    )


def shrink(plan: LaunchPlan, host: str) -> LaunchPlan | None:
    """The plan without `host`'s node, while at least `min_nodes` are left (None otherwise): node
    ranks and ranks dense in the old order, WORLD_SIZE follows, and node 0 dropping out takes the
    rendezvous to the next first host (unless the master's address was given: `host_addrs` is
    empty then, and no smaller world can do without it)."""
    kept = [n for n in plan.nodes if n.host != host]
    if plan.min_nodes is None or len(kept) == len(plan.nodes) or len(kept) < plan.min_nodes:
        return None
    master = plan.master_addr if plan.nodes[0].host != host else plan.host_addrs.get(kept[0].host)
    if master is None:
        return None
    world = sum(n.nproc for n in kept)
    nodes: list[NodePlan] = []
    for node_rank, node in enumerate(kept):
        first = sum(n.nproc for n in nodes)
        entries = tuple(
            replace(e, rank=first + i, node_rank=node_rank, world_size=world) for i, e in enumerate(node.entries)
        )
        nodes.append(NodePlan(node.host, node_rank, entries))
    return replace(plan, nodes=tuple(nodes), world_size=world, master_addr=master)
