"""`slurmgen launch`: start every node at once over SSH, watch them, and fail as one.

One thread per node starts its command (see remote.py) and turns its output into
events on a queue; the main thread alone prints and decides. The first failure anywhere (a
rank's non-zero exit, a rank whose heartbeat went stale, a node that cannot start, a lost
connection) or Ctrl-C / SIGTERM closes the stdin of every node's session, and each node's
bootstrap then stops its process groups (TERM, KILL after the stop grace). The exit code is
the first failing rank's (124 for a hung rank, 255 for a lost connection, 130/143 after
Ctrl-C/SIGTERM). With --max-restarts the whole group starts again after a failure.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from typing import IO, Callable

from slurmgen import exitcodes
from slurmgen.errors import EXIT_RUN_FAILED, SlurmgenError
from slurmgen.launch.display import LineSplitter, NodeResult, Prefixer, parse_event, summary_table
from slurmgen.launch.plan import LaunchPlan, NodePlan
from slurmgen.launch.remote import env_text, payload, remote_command
from slurmgen.launch.ssh.connect import Connection, ConnectError, SSHOptions, connect_all, describe_targets

EXIT_LOST = exitcodes.LOST
KEEPALIVE_INTERVAL = 5.0  # like ServerAliveInterval 5 ...
KEEPALIVE_COUNT = 3       # ... and ServerAliveCountMax 3: a silent host is lost after ~15 s
STOP_WAIT_EXTRA = 5.0     # after a stop, wait this much beyond the grace for nodes to report


class Launcher:
    def __init__(self, plan: LaunchPlan, opts: SSHOptions, out: IO[str] | None = None, err: IO[str] | None = None,
                 colour: bool | None = None, keepalive: float = KEEPALIVE_INTERVAL,
                 connector: Callable[..., dict[str, Connection]] = connect_all):
        self.plan, self.opts, self.connector = plan, opts, connector
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        if colour is None:
            colour = self.out.isatty() and "NO_COLOR" not in os.environ
        self.colour = colour
        self.prefixer = Prefixer([n.host for n in plan.nodes], colour)
        self.keepalive = keepalive
        self.conns: dict[str, Connection] = {}
        self.signals: list[int] = []
        self.t0 = time.monotonic()

    # ---- output ---------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        print(f"slurmgen: {text}", file=self.err, flush=True)

    def _show(self, host: str, line: str) -> None:
        print(self.prefixer.format(host, line), file=self.out, flush=True)

    # ---- the whole run --------------------------------------------------------------------------
    def run(self) -> int:
        """Connect, run up to 1 + max_restarts attempts, print the summary; the exit code."""
        hosts = [n.host for n in self.plan.nodes]
        self.conns = self.connector(hosts, self.opts, notify=self.say)
        self.say(f"connected to {len(hosts)} host(s) in {time.monotonic() - self.t0:.2f}s")
        for conn in self.conns.values():
            conn.start_keepalive(self.keepalive)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        attempts = self.plan.max_restarts + 1
        try:
            for attempt in range(1, attempts + 1):
                code, results, verdict = self._attempt(attempt)
                if code == 0 or self.signals or attempt == attempts:
                    break
                self.say(f"attempt {attempt} of {attempts} failed ({verdict}); starting all nodes again")
                self._reconnect_lost()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            for conn in self.conns.values():
                conn.close()
        title = verdict if code == 0 else f"{verdict}, exit code {code}"
        print(summary_table(results, attempt, attempts, title, self.colour), file=self.err, end="", flush=True)
        return code

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)

    def _reconnect_lost(self) -> None:
        lost = [h for h, c in self.conns.items() if not c.is_active()]
        if not lost:
            return
        for h in lost:
            self.conns[h].close()
        self.say(f"reconnecting to {', '.join(lost)}")
        fresh = self.connector(lost, self.opts, notify=self.say)
        for h, conn in fresh.items():
            conn.start_keepalive(self.keepalive)
            self.conns[h] = conn

    # ---- one attempt ----------------------------------------------------------------------------
    def _attempt(self, attempt: int) -> tuple[int, list[NodeResult], str]:
        plan = self.plan
        events: queue.Queue = queue.Queue()
        results = {n.host: NodeResult(n.host, n.node_rank, n.ranks) for n in plan.nodes}
        procs: dict[str, object] = {}
        started_at = time.monotonic()
        for node in plan.nodes:
            threading.Thread(target=self._node_thread, args=(node, attempt, events), daemon=True,
                             name=f"node-{node.host}").start()
        first: tuple[str, str] | None = None   # (host, verdict) of the first failure
        code = 0
        stop_deadline: float | None = None
        handled_signals = 0
        running_announced = False
        pending = set(results)

        spared: str | None = None  # the failed node: it is stopping its ranks itself

        def stop(reason: str, spare: str | None = None) -> None:
            nonlocal stop_deadline, spared
            if stop_deadline is not None:
                return
            self.say(f"stopping all nodes: {reason}")
            stop_deadline = time.monotonic() + plan.stop_grace + STOP_WAIT_EXTRA
            spared = spare
            for host, proc in procs.items():
                if host != spare:
                    proc.close_stdin()  # type: ignore[attr-defined]

        def fail(host: str, state: str, rc: int, verdict: str) -> None:
            nonlocal first, code
            r = results[host]
            r.state, r.code = state, rc
            if first is None and stop_deadline is None:
                first, code = (host, verdict), rc
                r.note = "first failure: " + verdict
                stop(f"{verdict} on {host}", spare=host if state in ("failed", "hung") else None)
            elif not r.note:
                r.note = "after the first failure" if first else "while stopping"

        while pending:
            if len(self.signals) > handled_signals:
                handled_signals = len(self.signals)
                name = signal.Signals(self.signals[-1]).name
                if handled_signals == 1:
                    if first is None:
                        code = 128 + self.signals[0]
                    stop(f"got {name}")
                else:
                    self.say(f"got {name} again: closing every connection now")
                    for conn in self.conns.values():
                        conn.close()
            try:
                kind, host, value = events.get(timeout=0.1)
            except queue.Empty:
                now = time.monotonic()
                for h in list(pending):
                    conn = self.conns[h]
                    if conn.silent_for(self.keepalive) > self.keepalive * KEEPALIVE_COUNT:
                        fail(h, "lost", EXIT_LOST, f"no answer from {h} for {self.keepalive * (KEEPALIVE_COUNT + 1):.0f}s")
                        conn.close()
                if spared in pending and stop_deadline is not None and now > stop_deadline - STOP_WAIT_EXTRA:
                    procs[spared].close_stdin()  # type: ignore[attr-defined]  # it did not stop by itself
                    spared = None
                if stop_deadline is not None and now > stop_deadline:
                    for h in pending:
                        results[h].state, results[h].note = "lost", "no exit status after the stop"
                        self.conns[h].close()
                    break
                continue
            r = results[host]
            if kind == "proc":
                procs[host] = value
                if stop_deadline is not None and host != spared:
                    value.close_stdin()
            elif kind == "line":
                self._show(host, value)
                event = parse_event(value)
                if event is None:
                    continue
                if event.kind == "started":
                    r.state, r.started = "running", time.monotonic()
                    if not running_announced and all(x.started is not None for x in results.values()):
                        running_announced = True
                        self.say(f"all {len(results)} node(s) running {plan.world_size} rank(s) "
                                 f"{r.started - started_at:.2f}s after the start of attempt {attempt} "
                                 f"({r.started - self.t0:.2f}s after launch)")
                elif event.kind == "failed":
                    fail(host, "failed", event.code or 1, f"rank {event.rank} exited with code {event.code}")
                elif event.kind == "hung":
                    fail(host, "hung", event.code or exitcodes.HUNG, f"rank {event.rank} hung ({event.detail})")
            elif kind in ("exit", "error"):
                pending.discard(host)
                r.ended = time.monotonic()
                if r.started is None:
                    r.started = started_at
                if kind == "error":
                    fail(host, "error", EXIT_RUN_FAILED, str(value))
                elif value is None:
                    if r.state not in ("lost",):
                        fail(host, "lost", EXIT_LOST, f"lost the connection to {host}")
                elif r.state in ("failed", "hung"):
                    pass  # already counted from its message; keep the rank's code
                elif value == 0:
                    r.state, r.code = "ok", 0
                elif stop_deadline is not None and value in (130, 137, 143):
                    r.state, r.code = "stopped", value
                    r.note = r.note or ("stopped by slurmgen" if first or self.signals else "")
                else:
                    fail(host, "failed", value, f"node exited with code {value}")
        if self.signals and first is None:
            verdict = f"interrupted by {signal.Signals(self.signals[0]).name}"
        elif first is not None:
            verdict = f"{first[1]} on {first[0]}"
        else:
            verdict = "all ranks succeeded"
        return code, [results[n.host] for n in plan.nodes], verdict

    def _node_thread(self, node: NodePlan, attempt: int, events: queue.Queue) -> None:
        conn = self.conns[node.host]
        try:
            proc = conn.start(remote_command(self.plan, node, attempt), payload(self.plan, node),
                              timeout=self.opts.connect_timeout)
        except ConnectError as exc:
            events.put(("error", node.host, exc.message))
            return
        events.put(("proc", node.host, proc))
        splitter = LineSplitter()
        while True:
            try:
                data = proc.read()
            except Exception:  # the transport died under us
                data = b""
            if not data:
                break
            for line in splitter.feed(data):
                events.put(("line", node.host, line))
        for line in splitter.flush():
            events.put(("line", node.host, line))
        try:
            status = proc.exit_status()
        except Exception:
            status = None
        events.put(("exit", node.host, status))


def dry_run_text(plan: LaunchPlan, opts: SSHOptions, show: Callable[[str, str], str] | None = None) -> str:
    """Per host exactly what would run: the SSH target, the command line, the environment
    sent on stdin (secret-looking values hidden), then the bootstrap and node script."""
    from slurmgen.launch.remote import BOOTSTRAP

    targets = describe_targets([n.host for n in plan.nodes], opts)
    lines = [f"# slurmgen launch --dry-run: {len(plan.nodes)} node(s), {plan.world_size} rank(s), "
             f"master {plan.master_addr}:{plan.master_port}, working directory {plan.workdir}",
             "# Each host runs the command line below over SSH; its stdin then carries the bootstrap,",
             "# the node script and the environment shown, and stays open as the node's lifeline.", ""]
    for node in plan.nodes:
        lines += [f"# ===== {node.host} ({targets[node.host]}): node rank {node.node_rank}, ranks {node.ranks} =====",
                  remote_command(plan, node, 1), "# environment (on stdin):"]
        env = env_text(plan.node_env(node), show_secrets=False).rstrip("\n")
        lines += [env] if env else ["# (none beyond the node script's own)"]
        lines.append("")
    lines += [f"# ===== bootstrap (on stdin, {len(BOOTSTRAP.encode())} bytes) =====", BOOTSTRAP.rstrip("\n"), "",
              f"# ===== launch_multi_node.sh (on stdin, {len(plan.script.encode())} bytes) =====",
              plan.script.rstrip("\n")]
    return "\n".join(lines) + "\n"


def launch(plan: LaunchPlan, opts: SSHOptions) -> int:
    """Run the plan; the exit code of the job (see the module docstring)."""
    try:
        return Launcher(plan, opts).run()
    except ConnectError as exc:
        raise SlurmgenError(exc.line(), exit_code=EXIT_RUN_FAILED) from None
    except KeyboardInterrupt:  # before any node started: nothing to stop yet
        raise SlurmgenError("interrupted while connecting", exit_code=exitcodes.INTERRUPTED) from None
