"""`slurmgen serve`, `slurmgen agent`, `slurmgen workers` and `slurmgen group ...`.

Registered on the main Typer app by `register(app)`. The web stack (fastapi, uvicorn, httpx)
is imported inside each command, so `slurmgen --help` and `create` never load it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import typer

from slurmgen.cliopts import SERVER, TOKEN_FILE, parse_env, registry_option
from slurmgen.contract import exitcodes, ports
from slurmgen.contract.backends import BACKENDS
from slurmgen.contract.states import ACTIVE_WORDS, State
from slurmgen.contract.strategies import STRATEGIES
from slurmgen.contract.warm import RESTART_MODES
from slurmgen.errors import SlurmgenError

JSON = typer.Option(False, "--json", help="Print JSON instead of text.")
LOOPBACK = ("127.0.0.1", "localhost", "::1")

group_app = typer.Typer(
    help="Groups of workers: create, move workers in, config, start, stop, watch.", no_args_is_help=True
)


def _client(server: str | None, token_file: Path | None):
    from slurmgen.coordinator.client import DEFAULT_SERVER, Client
    from slurmgen.coordinator.tokens import client_token

    return Client(server or DEFAULT_SERVER, client_token(token_file))


def _print_json(models) -> None:
    data = [m.model_dump() for m in models] if isinstance(models, list) else models.model_dump()
    typer.echo(json.dumps(data, indent=2))


def url_of(host: str, port: int, *, tls: bool = False) -> str:
    """The URL a bound address is reached at; an IPv6 address goes in brackets (`http://[::]:8470`)."""
    return f"http{'s' if tls else ''}://{f'[{host}]' if ':' in host else host}:{port}"


def serve(
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to bind; anything but loopback needs TLS or a tunnel."
    ),
    port: int = typer.Option(ports.COORDINATOR_PORT, "--port"),
    db: Path | None = typer.Option(
        None, "--db", help="SQLite state [default: ~/.local/state/slurmgen/coordinator.db]."
    ),
    token_file: Path | None = typer.Option(None, "--token-file", help="[default: ~/.config/slurmgen/token]"),
    agent_timeout: float = typer.Option(
        10.0, "--agent-timeout", min=1, help="Seconds of agent silence before its workers count as lost."
    ),
    ssl_certfile: Path | None = typer.Option(None, "--ssl-certfile"),
    ssl_keyfile: Path | None = typer.Option(None, "--ssl-keyfile"),
    registry: Path | None = registry_option(
        "Run registry of this machine where each group's runs are recorded "
        "[default: $SLURMGEN_REGISTRY, else ~/.local/state/slurmgen/jobs.sqlite]."
    ),
) -> None:
    """Run the coordinator: JSON API (schema at /openapi.json, with the token) plus the web page.

    Each start of a group is recorded as a run (kind group) in the run registry of the machine
    that serves, so `slurmgen jobs` there lists it beside Slurm jobs and launches."""
    from slurmgen.coordinator.group_runs import GroupRuns
    from slurmgen.coordinator.server import run
    from slurmgen.coordinator.service import Coordinator
    from slurmgen.coordinator.store import Store
    from slurmgen.coordinator.tokens import default_db, default_token_file, load_or_create_token
    from slurmgen.runs.model import Recorder

    os.umask(0o077)  # the database and its WAL files hold commands and logs: owner only
    token_path = token_file or default_token_file()
    token, created = load_or_create_token(token_path)
    if created:
        typer.echo(
            f"slurmgen serve: new token (saved 0600 in {token_path}; agents and clients read it there):\n{token}"
        )
    if host not in LOOPBACK and not ssl_certfile:
        typer.echo(
            f"slurmgen serve: warning: {host} is not loopback and the token travels in clear text. "
            f"Use --ssl-certfile/--ssl-keyfile (uvicorn's TLS), or keep 127.0.0.1 and tunnel: "
            f"ssh -L {port}:127.0.0.1:{port} THIS_HOST",
            err=True,
        )
    recorder = Recorder(registry)
    recorder.check()  # a registry that cannot be opened stops the server before it serves
    store = Store(db or default_db())
    typer.echo(f"slurmgen serve: {url_of(host, port, tls=bool(ssl_certfile))} (state {store.path})")
    run(
        Coordinator(store, agent_timeout=agent_timeout, runs=GroupRuns(recorder)),
        token,
        host,
        port,
        ssl_certfile=str(ssl_certfile) if ssl_certfile else None,
        ssl_keyfile=str(ssl_keyfile) if ssl_keyfile else None,
    )


def agent(
    server: str | None = SERVER,
    token_file: Path | None = TOKEN_FILE,
    workers: int = typer.Option(1, "--workers", min=1, max=4096, help="Worker slots on this node (usually GPUs)."),
    name: str | None = typer.Option(None, "--name", help="Node name [default: short host name]."),
    state_dir: Path | None = typer.Option(
        None, "--state-dir", help="Per-rank logs and heartbeats [default: ~/.local/state/slurmgen/agent]."
    ),
    interval: float = typer.Option(1.0, "--interval", min=0.1, max=5, help="Seconds between heartbeats."),
    grace: float = typer.Option(
        10.0, "--grace", min=0, help="TERM-to-KILL seconds when the agent itself stops its ranks."
    ),
    cut_off_after: float | None = typer.Option(
        None,
        "--cut-off-after",
        help="Stop this node's ranks after the server has been unreachable this long "
        "[default: the server's --agent-timeout + 5].",
    ),
) -> None:
    """Run this node's agent: register its workers and run their ranks."""
    import logging

    from slurmgen.coordinator.models import check_name
    from slurmgen.coordinator.node_agent import WorkerAgent

    if name is not None:
        try:
            check_name(name, "--name")
        except ValueError as e:
            raise SlurmgenError(str(e)) from None
    if cut_off_after is not None and not cut_off_after >= 1:  # typer's own message leaves out the value
        raise SlurmgenError(f"cut_off_after: must be at least 1 second (got {cut_off_after:g})")
    logging.basicConfig(level=logging.INFO, format="slurmgen agent: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per heartbeat
    WorkerAgent(
        _client(server, token_file),
        workers,
        host=name,
        state_dir=state_dir,
        interval=interval,
        grace=grace,
        cut_off_after=cut_off_after,
    ).run()


def workers(server: str | None = SERVER, token_file: Path | None = TOKEN_FILE, as_json: bool = JSON) -> None:
    """List every worker the coordinator knows, with its group, state and rank."""
    rows = _client(server, token_file).workers()
    if as_json:
        return _print_json(rows)
    for w in rows:
        extra = f" exit {w.exit_code}" if w.state == "exited" else ""
        rank = f" rank {w.rank}" if w.rank is not None else ""
        typer.echo(f"{w.name:<20} {w.group or '-':<16} {w.state}{extra}{rank}")


@group_app.command("create")
def group_create(name: str, server: str | None = SERVER, token_file: Path | None = TOKEN_FILE) -> None:
    """Create an empty group."""
    typer.echo(f"created group {_client(server, token_file).create_group(name).name}")


@group_app.command("delete")
def group_delete(name: str, server: str | None = SERVER, token_file: Path | None = TOKEN_FILE) -> None:
    """Delete a group that is not running; its workers become ungrouped."""
    _client(server, token_file).delete_group(name)
    typer.echo(f"deleted group {name}")


@group_app.command("list")
def group_list(server: str | None = SERVER, token_file: Path | None = TOKEN_FILE, as_json: bool = JSON) -> None:
    """Every group with its state."""
    rows = _client(server, token_file).groups()
    if as_json:
        return _print_json(rows)
    for g in rows:
        typer.echo(f"{g.name:<16} {g.state:<10} {g.members} workers  {g.reason or ''}")


@group_app.command("move")
def group_move(
    workers: list[str] = typer.Argument(..., help="Worker names, e.g. gn6-0 gn6-1."),
    to: str | None = typer.Option(None, "--to", help="Target group; omit to ungroup."),
    server: str | None = SERVER,
    token_file: Path | None = TOKEN_FILE,
) -> None:
    """Move workers into a group (or out of theirs without --to)."""
    moved = _client(server, token_file).move(workers, to)
    typer.echo(f"moved {', '.join(w.name for w in moved)} to {to or '(no group)'}")


@group_app.command("config")
def group_config(
    name: str,
    command: list[str] | None = typer.Argument(None, help="The command every rank runs (after --)."),
    master: str | None = typer.Option(None, "--master", help="Master NODE name (e.g. gn6)."),
    master_addr: str | None = typer.Option(
        None, "--master-addr", help="Address to reach the master at [default: its name]."
    ),
    world_size: int | None = typer.Option(None, "--world-size", help="[default: the group's worker count]"),
    port: int | None = typer.Option(None, "--port", help=f"MASTER_PORT [default: {ports.DEFAULT_MASTER_PORT}]."),
    backend: str | None = typer.Option(None, "--backend", help=" | ".join(BACKENDS) + "."),
    strategy: str | None = typer.Option(
        None,
        "--strategy",
        help=" | ".join(STRATEGIES) + ": the bundled trainer's --strategy default (SLURMGEN_STRATEGY).",
    ),
    cwd: str | None = typer.Option(None, "--cwd", help="Absolute working directory on every node."),
    env: list[str] | None = typer.Option(None, "--env", help="KEY=VALUE for every rank (repeatable)."),
    max_restarts: int | None = typer.Option(None, "--max-restarts", help="Restart the whole group up to N times."),
    spare_nodes: int | None = typer.Option(
        None,
        "--spare-nodes",
        help="The last N nodes in rank order run nothing; a restart moves a failed or lost node's ranks to one.",
    ),
    min_nodes: int | None = typer.Option(
        None,
        "--min-nodes",
        help="A smaller world: with no spare left for a failed or lost node, a restart goes on without it "
        "while at least N nodes are left (needs --max-restarts).",
    ),
    restart_mode: str | None = typer.Option(
        None,
        "--restart-mode",
        help=" | ".join(RESTART_MODES) + ": warm starts a failed rank anew while the others keep their processes "
        "(each counts against --max-restarts).",
    ),
    heartbeat_timeout: float | None = typer.Option(
        None, "--heartbeat-timeout", help="Seconds before a trainer heartbeat is stale."
    ),
    stop_grace: float | None = typer.Option(None, "--stop-grace", help="Seconds from TERM to KILL."),
    server: str | None = SERVER,
    token_file: Path | None = TOKEN_FILE,
) -> None:
    """Set a group's torch.distributed config and command; flags not given keep their value."""
    given = {
        "master": master,
        "master_addr": master_addr,
        "world_size": world_size,
        "master_port": port,
        "backend": backend,
        "strategy": strategy,
        "cwd": cwd,
        "argv": command or None,
        "env": parse_env(env) if env else None,
        "max_restarts": max_restarts,
        "spare_nodes": spare_nodes,
        "min_nodes": min_nodes,
        "restart_mode": restart_mode,
        "heartbeat_timeout": heartbeat_timeout,
        "stop_grace": stop_grace,
    }
    g = _client(server, token_file).update_config(name, {k: v for k, v in given.items() if v is not None})
    typer.echo(
        f"group {g.name}: master {g.config.master or '(first node)'}, world size "
        f"{g.config.world_size or g.members}, port {g.config.master_port}, backend {g.config.backend}, "
        f"strategy {g.config.strategy}"
    )


@group_app.command("ranks")
def group_ranks(
    name: str, server: str | None = SERVER, token_file: Path | None = TOKEN_FILE, as_json: bool = JSON
) -> None:
    """The rank each worker gets under the group's config."""
    rows = _client(server, token_file).ranks(name)
    if as_json:
        return _print_json(rows)
    typer.echo("worker               RANK LOCAL_RANK NODE_RANK")
    for r in rows:
        typer.echo(f"{r.worker:<20} {r.rank:>4} {r.local_rank:>10} {r.node_rank:>9}")


@group_app.command("start")
def group_start(name: str, server: str | None = SERVER, token_file: Path | None = TOKEN_FILE) -> None:
    """Start the group's ranks on its workers (refused while it runs)."""
    g = _client(server, token_file).start(name)
    typer.echo(f"group {g.name}: {g.state} (attempt {g.run_attempt})")


@group_app.command("stop")
def group_stop(name: str, server: str | None = SERVER, token_file: Path | None = TOKEN_FILE) -> None:
    """Stop every rank of the group (TERM, then KILL after its stop grace)."""
    g = _client(server, token_file).stop(name)
    typer.echo(f"group {g.name}: {g.state}")


@group_app.command("status")
def group_status(
    name: str, server: str | None = SERVER, token_file: Path | None = TOKEN_FILE, as_json: bool = JSON
) -> None:
    """The group's state, its workers and its attempts."""
    d = _client(server, token_file).group(name)
    if as_json:
        return _print_json(d)
    g = d.group
    typer.echo(
        f"group {g.name}: {g.state} attempt {g.run_attempt or '-'} restarts {g.restarts}"
        + (f" - {g.reason}" if g.reason else "")
    )
    for w in sorted(d.workers, key=lambda w: (w.rank is None, w.rank, w.name)):
        typer.echo(
            f"  {w.name:<20} rank {'-' if w.rank is None else w.rank:<4} {w.state}"
            + (f" exit {w.exit_code}" if w.state == "exited" else "")
        )


@group_app.command("logs")
def group_logs(
    name: str,
    rank: int | None = typer.Option(None, "--rank"),
    attempt: int | None = typer.Option(None, "--attempt"),
    limit: int = typer.Option(500, "--limit", min=1, max=5000),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the group ends."),
    server: str | None = SERVER,
    token_file: Path | None = TOKEN_FILE,
) -> None:
    """Recent output lines of the group's ranks as [attempt:rank] line (full files stay on each node)."""
    client, after = _client(server, token_file), 0
    while True:
        lines = client.logs(name, rank=rank, attempt=attempt, after=after, limit=limit, tail=not after)
        for ln in lines:
            typer.echo(f"[{ln.attempt}:{ln.rank}] {ln.line}")
        after = lines[-1].id if lines else after
        if not follow or (not lines and client.group(name).group.state not in ACTIVE_WORDS):
            return
        time.sleep(0.5 if not lines else 0)


@group_app.command("wait")
def group_wait(
    name: str,
    timeout: float = typer.Option(0, "--timeout", help="Seconds; 0 waits forever."),
    server: str | None = SERVER,
    token_file: Path | None = TOKEN_FILE,
) -> None:
    """Wait until the group ends; exit with its exit code (0 succeeded, 143 stopped)."""
    client = _client(server, token_file)
    deadline = time.monotonic() + timeout if timeout else None
    while True:
        g = client.group(name).group
        if g.state not in ACTIVE_WORDS:  # a group ends succeeded, failed or stopped (or was never started: idle)
            break
        if deadline and time.monotonic() > deadline:
            raise SlurmgenError(f"group {name}: still {g.state} after {timeout:g} s", exit_code=exitcodes.HUNG)
        time.sleep(0.5)
    typer.echo(f"group {name}: {g.state}" + (f" - {g.reason}" if g.reason else ""))
    # (State is a str: a word the server sends, known or not, looks itself up.)
    code = {State.SUCCEEDED: exitcodes.OK, State.STOPPED: exitcodes.TERMINATED, State.IDLE: exitcodes.OK}.get(
        g.state, g.exit_code or exitcodes.FAILED
    )
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command()(serve)
    app.command()(agent)
    app.command()(workers)
    app.add_typer(group_app, name="group")
