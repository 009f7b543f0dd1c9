"""The coordinator's API models: the one definition of every JSON body, shared by the server,
the CLI client, the agent and the web page. pydantic only (no web stack), so the client and
unit tests import it cheaply. Request models forbid unknown fields and validate names, so a
bad body is a 422 naming the field before anything is stored.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from slurmgen.contract import envvars, ports
from slurmgen.contract.backends import DEFAULT_BACKEND
from slurmgen.contract.strategies import DEFAULT_STRATEGY
from slurmgen.contract.world import min_nodes_refusal
from slurmgen.errors import show

# Names travel into paths, log file names and environment values, never into a shell; they
# are still kept to a safe alphabet so every one of them can be shown and typed as is.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# The variables the coordinator sets for every rank; a group's env may not override them.
RESERVED_ENV = (
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "GROUP_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    envvars.BACKEND,
    envvars.STRATEGY,
    envvars.GROUP,
    envvars.HEARTBEAT_DIR,
    envvars.WARM_DIR,
    envvars.WARM_GENERATION,
)

WorkerState = Literal["idle", "starting", "running", "exited", "lost"]
GroupState = Literal["idle", "starting", "running", "succeeded", "failed", "stopping", "stopped"]


def check_name(value: str, what: str = "name") -> str:
    if not NAME_RE.match(value):
        raise ValueError(
            f"{what} {show(value)} must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value


def split_worker_name(name: str) -> tuple[str, int]:
    """`gn6-0` -> ("gn6", 0); a host may itself contain '-', the id is after the last one."""
    host, sep, idx = name.rpartition("-")
    if not sep or not host or not idx.isdigit() or not NAME_RE.match(host):
        raise ValueError(f"worker {show(name)} is not of the form <host>-<id> (e.g. gn6-0)")
    return host, int(idx)


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GroupCreate(_Request):
    name: str

    _name = field_validator("name")(lambda v: check_name(v, "group"))


class MoveRequest(_Request):
    """Move workers into a group, or out of every group with `group: null`."""

    workers: list[str] = Field(min_length=1)
    group: str | None = None

    @field_validator("workers")
    @classmethod
    def _workers(cls, v: list[str]) -> list[str]:
        for name in v:
            split_worker_name(name)
        return v

    @field_validator("group")
    @classmethod
    def _group(cls, v: str | None) -> str | None:
        return None if v is None else check_name(v, "group")


class GroupConfig(_Request):
    """A group's torch.distributed config and command (the seed's 'PyTorch 配置')."""

    master: str | None = Field(
        None, description="master node name (not a worker name); default: the first node in alphabetical order"
    )
    master_addr: str | None = Field(None, description="address ranks reach the master at; default: master")
    world_size: int | None = Field(None, ge=1, description="default: the group's worker count")
    master_port: int = Field(ports.DEFAULT_MASTER_PORT, ge=1, le=65535)
    backend: Literal["auto", "nccl", "gloo"] = DEFAULT_BACKEND  # contract.backends.BACKENDS (a test keeps them equal)
    strategy: Literal["ddp", "fsdp"] = Field(  # contract.strategies.STRATEGIES (a test keeps them equal)
        DEFAULT_STRATEGY, description="the bundled trainer's --strategy default (SLURMGEN_STRATEGY): ddp or fsdp"
    )
    argv: list[str] = Field(default_factory=list, description="the command, an argv list (no shell)")
    cwd: str | None = Field(None, description="absolute working directory on every node")
    env: dict[str, str] = Field(default_factory=dict)
    max_restarts: int = Field(0, ge=0, le=1000)
    spare_nodes: int = Field(
        0,
        ge=0,
        le=1000,
        description="the group's last N nodes in its order run nothing: a restart moves a failed or lost node's "
        "ranks to one of them",
    )
    min_nodes: int | None = Field(
        None,
        description="a smaller world: when a failed or lost node's ranks have no spare left to move to, a restart "
        "goes on without that node (ranks dense over the nodes left) while at least this many are left; "
        "null: never on fewer nodes",
    )
    restart_mode: Literal["cold", "warm"] = Field(  # contract.warm.RESTART_MODES (a test keeps them equal)
        "cold",
        description="warm: a rank that exits with a code worth a retry is started anew while the others keep their "
        "processes and wait for the new world (contract/warm.py); each counts against max_restarts",
    )
    heartbeat_timeout: float = Field(
        120.0, ge=1, description="seconds before a rank's trainer heartbeat counts as stale (hung)"
    )
    stop_grace: float = Field(10.0, ge=0, le=600, description="seconds between TERM and KILL")

    @field_validator("min_nodes")
    @classmethod
    def _min_nodes(cls, v: int | None, info: ValidationInfo) -> int | None:
        """min_nodes against the restart budget here; against the group's nodes once its members
        are known (ranks.py), by the one rule of a smaller world (contract/world.py)."""
        restarts = info.data.get("max_restarts", 0)
        refused = min_nodes_refusal(v, None, restarts, give="max_restarts (--max-restarts N)")
        if refused:
            raise ValueError(refused)
        return v

    @field_validator("restart_mode")
    @classmethod
    def _warm_needs_restarts(cls, v: str, info: ValidationInfo) -> str:
        """A warm restart is a restart: without one to spend it never happens, which a setting
        that asks for it should not hide (max_restarts is validated before this field)."""
        if v == "warm" and info.data.get("max_restarts", 0) < 1:
            raise ValueError("warm needs max_restarts of at least 1: each warm restart counts against it")
        return v

    @field_validator("master")
    @classmethod
    def _master(cls, v: str | None) -> str | None:
        return None if v is None else check_name(v, "master")

    @field_validator("master_addr")
    @classmethod
    def _master_addr(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[A-Za-z0-9_.:-]{1,253}$", v):
            raise ValueError(f"master_addr {show(v)} is not a host name or IP address")
        return v

    @field_validator("cwd")
    @classmethod
    def _cwd(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"cwd {show(v)} must be an absolute path")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not ENV_KEY_RE.match(key):
                raise ValueError(f"env key {show(key)} is not a variable name")
            if key in RESERVED_ENV:
                raise ValueError(f"env key {key!r} is set by the coordinator for every rank")
            if "\0" in value:
                raise ValueError(f"env {key}: value contains a NUL byte")
        return v

    @field_validator("argv")
    @classmethod
    def _argv(cls, v: list[str]) -> list[str]:
        if any("\0" in a for a in v):
            raise ValueError("argv: an argument contains a NUL byte")
        return v


def merged_config(saved: dict[str, object], changes: dict[str, object]) -> GroupConfig:
    """PATCH of a group's config: the saved one with the given top-level fields replaced, and a
    field given as null set back to its default (RFC 7396 at the top level; `env` and `argv`
    are replaced whole). Raises pydantic's ValidationError naming each bad field."""
    merged = dict(saved)
    for key, value in changes.items():
        if value is None and key in GroupConfig.model_fields:
            merged.pop(key, None)
        else:
            merged[key] = value
    return GroupConfig(**merged)


class WorkerOut(BaseModel):
    name: str
    host: str
    id: int
    group: str | None
    state: WorkerState
    exit_code: int | None = None
    pid: int | None = None
    rank: int | None = None
    attempt: int | None = None
    run_group: str | None = Field(
        None, description="the group of the run it last ran (`attempt` is that run's): its group's until it is moved"
    )
    seen_ago: float | None = Field(None, description="seconds since its agent's last heartbeat")
    stopped: bool = Field(False, description="it exited because its attempt was stopped on request")
    stopped_after: int | None = Field(
        None,
        description="the rank its attempt failed on while it still ran: it was stopped then "
        "(its exit code is the stop's doing, not a failure of its own)",
    )
    cause: str | None = Field(
        None,
        description="how its last attempt ended for it: the cause, for the rank the attempt failed on "
        "or a stop asked for; 'stopped (after rank N): CAUSE' for a rank stopped after rank N failed",
    )


class AttemptOut(BaseModel):
    number: int
    state: GroupState
    started: float
    ended: float | None = None
    reason: str | None = None
    exit_code: int | None = None
    exit_codes: dict[str, int] = Field(default_factory=dict, description="rank -> exit code")
    run_attempt: int | None = Field(
        None, description="its number within its run (contract/attempts.py), as users see it; `number` is the key"
    )
    runs: list[str] = Field(
        default_factory=list,
        description="run record directories its ranks announced (as their agents saw them), for its curves",
    )
    moved: list[str] = Field(
        default_factory=list,
        description="the nodes moved to a spare before it started ('node N moved from ...'), or left out of a "
        "smaller world ('2 -> 1 nodes: HOST lost, --min-nodes 1')",
    )
    warm: list[str] = Field(
        default_factory=list,
        description="the warm restarts inside it ('warm restart G: rank R started anew after ...')",
    )
    took: list[str] = Field(
        default_factory=list,
        description="beside each of `warm`, where its rank went on once its agent said: 'HOST's warm spare "
        "(pid N)', or '' (a fresh process, or not said yet)",
    )


class GroupOut(BaseModel):
    name: str
    state: GroupState
    config: GroupConfig
    members: int
    attempt: int | None = Field(None, description="its current attempt's key in the API (counted over every start)")
    restarts: int = 0
    run_attempt: int | None = Field(None, description="its current attempt within its run, as users see it")
    warm_restarts: int = Field(
        0, description="the warm restarts of its current run, which count against max_restarts as `restarts` do"
    )
    world_size: int | None = Field(None, description="its current attempt's ranks (a smaller world has fewer)")
    reason: str | None = None
    exit_code: int | None = None


class RankOut(BaseModel):
    """`slurmgen.generate.topology.RankEntry` as the API shows it: the slot becomes the worker's name,
    so the page and the CLI never rebuild `<host>-<id>` themselves."""

    worker: str
    host: str
    rank: int
    local_rank: int
    node_rank: int
    local_world_size: int
    world_size: int


class GroupDetail(BaseModel):
    group: GroupOut
    workers: list[WorkerOut]
    attempts: list[AttemptOut]


# GET /api/groups/{name}/logs's header: how many lines after `after` its limit left out ("N", or
# "N+": at least N, older unread lines having been let go).
LINES_SKIPPED = "X-Lines-Skipped"


class LogLine(BaseModel):
    id: int
    attempt: int
    rank: int
    worker: str
    time: float
    line: str


class ErrorOut(BaseModel):
    detail: str


# --- agent protocol ---------------------------------------------------------------------------


class QuietBeat(BaseModel):
    """A rank's last trainer heartbeat, once it is older than half its hang limit."""

    age: float = Field(ge=0, description="seconds since the beat, on the node's clock")
    step: int | None = None
    stopped: bool = Field(False, description="the rank's process is stopped (SIGSTOP, a debugger)")
    limit: float | None = Field(
        None,
        gt=0,
        description="its own hang limit in seconds when it learned one (contract/hangs.py); None: the group's",
    )
    judged: bool = Field(
        True, description="False: a phase nothing bounds (a first checkpoint): it may have waited, never hung"
    )


class WorkerReport(BaseModel):
    """What one worker slot of an agent is doing; `attempt` names the group run it belongs to."""

    id: int = Field(ge=0, le=4095)
    state: Literal["idle", "running", "exited"]
    group: str | None = None
    attempt: int | None = None
    pid: int | None = None
    exit_code: int | None = None
    hung: bool = Field(False, description="its trainer heartbeat went stale")
    beat: QuietBeat | None = Field(None, description="its rank's heartbeat, when quiet for over half the limit")
    runs: list[str] = Field(
        default_factory=list, max_length=16, description="run record directories the rank announced (tracking)"
    )
    generation: int = Field(0, ge=0, description="the warm restart generation its rank was started in (StartOrder)")
    met: bool = Field(
        False, description="its rank has met its peers: its process group formed (contract/warm.py MET_PREFIX)"
    )
    spare: bool = Field(False, description="a warm restart's rank that went on in its node's warm spare (promoted)")
    stack: list[str] | None = Field(
        None,
        max_length=16,
        description="where its rank was stuck, once the server asked (StopOrder.stack): "
        "the innermost frames of its main thread, 'FILE:LINE FUNCTION' "
        "([]: none could be taken)",
    )


class ReportedLine(BaseModel):
    worker: int
    group: str
    attempt: int
    rank: int
    time: float
    line: str = Field(max_length=4096)


class AgentReport(_Request):
    host: str
    instance: str = Field(min_length=1, max_length=64, description="random per agent process")
    workers: list[WorkerReport] = Field(max_length=4096)
    lines: list[ReportedLine] = Field(default_factory=list, max_length=10000)
    dropped: int = Field(0, ge=0, description="lines dropped since the last report")

    _host = field_validator("host")(lambda v: check_name(v, "host"))


class AgentLines(_Request):
    """Output lines an agent sends as soon as they wait, between its heartbeats (a heartbeat
    carries only what is left at its time): a rank's newest line reaches the page without
    waiting up to a beat, and a heartbeat stays the size it was."""

    host: str
    instance: str = Field(min_length=1, max_length=64, description="random per agent process")
    lines: list[ReportedLine] = Field(max_length=10000)
    dropped: int = Field(0, ge=0, description="lines dropped since the last report")

    _host = field_validator("host")(lambda v: check_name(v, "host"))


class StartOrder(BaseModel):
    worker: int
    group: str
    attempt: int
    rank: int
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    heartbeat_timeout: float
    warm: bool = Field(
        False, description="the group restarts warm: give the rank the node's warm dir (contract/warm.py)"
    )
    generation: int = Field(0, ge=0, description="the warm restart generation the rank joins (0: the attempt's first)")


class WorldOrder(BaseModel):
    """A warm restart's new world (contract/warm.World), for the agent to write where its ranks
    of that attempt wait for it."""

    group: str
    attempt: int
    generation: int = Field(ge=1)
    master_addr: str
    master_port: int
    world_size: int


class StopOrder(BaseModel):
    worker: int
    grace: float
    stack: bool = Field(False, description="take the rank's Python stack before stopping it: the server judged it hung")


class Changed(BaseModel):
    version: int


class AgentOrders(BaseModel):
    start: list[StartOrder] = Field(default_factory=list)
    stop: list[StopOrder] = Field(default_factory=list)
    worlds: list[WorldOrder] = Field(default_factory=list)
    warm: list[tuple[str, int]] = Field(
        default_factory=list,
        description="the (group, attempt) runs restarting warm that this agent's workers are part of now: "
        "the agent keeps a warm spare for these only",
    )
    # The server's --agent-timeout: an agent that cannot reach the server for longer (plus a
    # margin) knows its groups have failed and stops its ranks (node_agent.py).
    agent_timeout: float | None = None
