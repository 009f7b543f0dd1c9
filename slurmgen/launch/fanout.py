"""`slurmgen launch`: start every node at once over SSH, watch them, and fail as one.

Threads only read: per node, one reads the session's output (shown as is) and one its event
channel (contract/node_events.py), and both put typed inputs on one queue. The main thread alone prints
and decides: each pass of its loop takes whatever has arrived, feeds the node inputs and then
a `ClockTick` to the attempt's state machine (attempt.py), and carries out the actions it returns.
The first failure anywhere (a rank's non-zero exit, a rank whose heartbeat went stale, a node
that cannot start, a lost connection) or Ctrl-C / SIGTERM closes the stdin of every node's
session, and each node's bootstrap then stops its process groups (TERM, KILL after the stop
grace). Until then a thread per node writes a keepalive line on that stdin (contract/node_events.py): a
node cut off from the launcher stops its own ranks when they stop arriving. The exit code is
the first failing rank's (124 for a hung rank, 255 for a lost connection, 130/143 after
Ctrl-C/SIGTERM). A hang the launcher judged first asks the rank's node for its Python stack (at
most node_events.STACK_ASK_WAIT seconds) and then stops every node. With --max-restarts the
whole group starts again after a failure. A stop request from the page or `slurmgen cancel` (a
file the loop looks for on every pass: runs/stop_request.py) stops every node as SIGTERM does,
with its own words ("stopped by you"): exit code 143, state stopped.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Protocol

from slurmgen.contract import exitcodes, warm
from slurmgen.contract.node_events import (
    KEEPALIVE_COUNT,
    KEEPALIVE_INTERVAL,
    LIFELINE_PING,
    STACK_ASK,
    STACK_ASK_WAIT,
    parse_event,
)
from slurmgen.contract.world import fewer_nodes
from slurmgen.errors import EXIT_RUN_FAILED, SlurmgenError
from slurmgen.launch import attempt as machine
from slurmgen.launch.display import LineSplitter, NodeResult, Prefixer, log_line, summary_table
from slurmgen.launch.plan import LaunchPlan, NodePlan, move_to_spare, shrink
from slurmgen.launch.registry_entry import LaunchRecord
from slurmgen.launch.remote import heartbeat_ms, payload, remote_command, world_line
from slurmgen.runs import stop_request
from slurmgen.runs.model import Failure
from slurmgen.ssh.connect import ConnectError, Connection, SSHOptions, connect_all

STOP_WAIT_EXTRA = 5.0  # after a stop, wait this much beyond the grace for nodes to report
PASS_SECONDS = 0.1  # the longest a loop pass waits for input before ticking anyway
BATCH = 512  # inputs handled per pass at most, so ticks keep coming under a flood


class NodeProcess(Protocol):
    """What the runner needs of a node's session (slurmgen.ssh.connect.RemoteProcess)."""

    def read(self) -> bytes: ...

    def read_stderr(self) -> bytes: ...

    def close_stdin(self) -> None: ...

    def send(self, data: bytes) -> None: ...

    def exit_status(self) -> int | None: ...


@dataclass(frozen=True)
class NodeOutput:
    """A line a node printed (or a stray line on its event channel): shown, never interpreted."""

    host: str
    line: str


@dataclass(frozen=True)
class Opened:
    """A node's session started; `proc` stays with the runner (the state machine sees none)."""

    host: str
    proc: NodeProcess
    at: float


Queued = NodeOutput | Opened | machine.Input


class Launcher:
    def __init__(
        self,
        plan: LaunchPlan,
        opts: SSHOptions,
        out: IO[str] | None = None,
        err: IO[str] | None = None,
        colour: bool | None = None,
        keepalive: float = KEEPALIVE_INTERVAL,
        connector: Callable[..., dict[str, Connection]] = connect_all,
        record: LaunchRecord | None = None,
    ):
        self.plan, self.opts, self.connector, self.record = plan, opts, connector, record
        self.first_failure: Failure | None = None  # of the current attempt, for the run registry
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        if colour is None:
            colour = self.out.isatty() and "NO_COLOR" not in os.environ
        self.colour = colour
        self.prefixer = Prefixer([n.host for n in plan.nodes], colour)
        self.keepalive = keepalive
        self.conns: dict[str, Connection] = {}
        self.signals: list[tuple[int, str]] = []  # (signal, a stop request's words or "")
        self.stop_reason = ""  # the first stop request's words, for the registry
        self.t0 = time.monotonic()

    # ---- output ---------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        print(f"slurmgen: {text}", file=self.err, flush=True)

    def _show(self, host: str, line: str) -> None:
        print(self.prefixer.format(host, line), file=self.out, flush=True)
        if self.record:
            self.record.log_line(log_line(host, line))

    # ---- the whole run --------------------------------------------------------------------------
    def run(self) -> int:
        """Connect, run up to 1 + max_restarts attempts, print the summary; the exit code."""
        hosts = [n.host for n in self.plan.nodes]
        self.conns = self.connector(hosts, self.opts, notify=self.say)
        self.say(f"connected to {len(hosts)} host(s) in {time.monotonic() - self.t0:.2f}s")
        for conn in self.conns.values():
            conn.start_keepalive(self.keepalive)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        attempts, restarts, attempt = self.plan.max_restarts + 1, 0, 0
        try:
            while True:
                attempt += 1
                if self.record:
                    self.record.attempt_started(attempt)
                code, results, verdict, warm_restarts = self._attempt(attempt, self.plan.max_restarts - restarts)
                restarts += warm_restarts  # every restart counts against --max-restarts, warm or whole
                if self.record:
                    stopped = Failure(cause=self.stop_reason) if self.stop_reason else None
                    self.record.attempt_ended(
                        attempt, code, bool(self.signals) and self.first_failure is None, self.first_failure or stopped
                    )
                if not machine.restart_after(code, bool(self.signals), restarts + 1, attempts):
                    break
                restarts += 1
                self.say(f"attempt {attempt} of {attempts} failed ({verdict}); starting all nodes again")
                self._move_lost(results, attempt)
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
        self.signals.append((signum, ""))

    def _take_stop_request(self) -> None:
        """A person's stop request (the page, `slurmgen cancel`), taken as a SIGTERM with its words."""
        asked = stop_request.take(self.record.stop_file if self.record else None)
        if asked is not None:
            self.stop_reason = self.stop_reason or asked
            self.signals.append((signal.SIGTERM, asked))
            if self.record is not None:
                self.record.stopping()

    def _move_lost(self, results: list[NodeResult], attempt: int) -> None:
        """Each host that was lost or could not start in `attempt` hands its node (node rank, ranks)
        to a spare host for the next attempt, while spares last (--spare-hosts); the run registry
        keeps each move with the attempt it followed."""
        for node in results:
            moved = move_to_spare(self.plan, node.host) if node.state in (machine.LOST, machine.ERROR) else None
            if moved is None:
                if node.state in (machine.LOST, machine.ERROR):
                    self._drop_lost(node.host, attempt)
                continue
            spare = next(n.host for n in moved.nodes if n.node_rank == node.node_rank)
            self.say(f"node {node.node_rank} moves from {node.host} to the spare host {spare}")
            if self.record:
                self.record.recovered(
                    attempt, f"node {node.node_rank} moved from {node.host} to the spare host {spare}"
                )
            self.plan = moved
            self.conns.pop(node.host).close()
            fresh = self.connector([spare], self.opts, notify=self.say)
            for conn in fresh.values():
                conn.start_keepalive(self.keepalive)
            self.conns.update(fresh)
            self.prefixer = Prefixer([n.host for n in moved.nodes], self.colour)

    def _drop_lost(self, host: str, attempt: int) -> None:
        """With --min-nodes and no spare for it: the next attempt goes on without `host` (a smaller
        world, `shrink`) while enough hosts are left; the run registry keeps it with the attempt,
        in the words Slurm's in-job restart uses."""
        shrunk = shrink(self.plan, host)
        if shrunk is None:
            return
        told = fewer_nodes(len(self.plan.nodes), len(shrunk.nodes), host, self.plan.min_nodes or 0)
        self.say(f"the next attempt runs without {host} ({told})")
        if self.record:
            self.record.recovered(attempt, told)
        self.plan = shrunk
        self.conns.pop(host).close()
        self.prefixer = Prefixer([n.host for n in shrunk.nodes], self.colour)

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
    def _attempt(self, attempt: int, restarts_left: int) -> tuple[int, list[NodeResult], str, int]:
        """One attempt to its end: its exit code, the nodes' results, its verdict and the warm
        restarts it ordered (at most `restarts_left`)."""
        plan = self.plan
        inputs: queue.Queue[Queued] = queue.Queue()
        procs: dict[str, NodeProcess] = {}
        self.first_failure = None
        limits = machine.Limits(
            connect=self.opts.connect_timeout,
            keepalive=self.keepalive,
            keepalive_count=KEEPALIVE_COUNT,
            stop_grace=plan.stop_grace,
            stop_wait=STOP_WAIT_EXTRA,
            heartbeat_ms=heartbeat_ms(plan),
            stack_wait=STACK_ASK_WAIT,
        )
        state = machine.initial(
            [NodeResult(n.host, n.node_rank, n.ranks) for n in plan.nodes],
            attempt,
            time.monotonic(),
            self.t0,
            plan.world_size,
            limits,
            machine.WarmPlan(restarts_left, plan.master_addr, plan.master_port)
            if plan.restart_mode == warm.WARM
            else None,
        )
        for node in plan.nodes:
            threading.Thread(
                target=self._node_thread, args=(node, attempt, inputs), daemon=True, name=f"node-{node.host}"
            ).start()
        handled_signals = 0
        while not state.done:
            batch: list[Queued] = []
            try:
                batch.append(inputs.get(timeout=PASS_SECONDS))
                while len(batch) < BATCH:
                    batch.append(inputs.get_nowait())
            except queue.Empty:
                pass
            self._take_stop_request()
            now = time.monotonic()
            batch += [machine.Signalled(s, now, why) for s, why in self.signals[handled_signals:]]
            handled_signals = len(self.signals)
            for item in batch:
                if isinstance(item, NodeOutput):
                    self._show(item.host, item.line)
                    continue
                if isinstance(item, Opened):
                    procs[item.host] = item.proc
                    item = machine.SessionOpened(item.host, item.at)
                state = self._apply(state, item, procs)
            overdue = {h: self.conns[h].silent_for(self.keepalive) for h in state.pending if h in self.conns}
            state = self._apply(state, machine.ClockTick(time.monotonic(), overdue), procs)
        return state.code, list(state.nodes.values()), state.verdict, state.generation

    def _apply(
        self, state: machine.AttemptState, item: machine.Input, procs: dict[str, NodeProcess]
    ) -> machine.AttemptState:
        """One step of the state machine, and its actions carried out."""
        before = state.first
        state, actions = machine.step(state, item)
        if state.first is not None and state.first != before:  # new, or a hang's stack came
            self.first_failure = _failure(state, item)
        for action in actions:
            if isinstance(action, machine.Say):
                self.say(action.text)
            elif isinstance(action, machine.CloseStdin):
                if action.host in procs:
                    procs[action.host].close_stdin()
            elif isinstance(action, machine.AskStack):
                if action.host in procs:
                    procs[action.host].send(f"{STACK_ASK} {action.rank}\n".encode())
            elif isinstance(action, machine.NewWorld):
                if self.record and action.what:
                    self.record.recovered(state.attempt, action.what)
                for host in state.pending & state.opened:
                    if host in procs:
                        procs[host].send(world_line(action.world, action.starts.get(host, ())))
            elif isinstance(action, machine.Disconnect):
                self.conns[action.host].close()
            else:
                for conn in self.conns.values():
                    conn.close()
        return state

    def _node_thread(self, node: NodePlan, attempt: int, inputs: queue.Queue) -> None:
        """Start the node's session; read its output here and its events in a second thread."""
        host = node.host
        try:
            proc = self.conns[host].start(
                remote_command(self.plan, node, attempt, self.keepalive),
                payload(self.plan, node),
                timeout=self.opts.connect_timeout,
                separate_stderr=True,
            )
        except ConnectError as exc:
            inputs.put(machine.StartFailed(host, exc.message, time.monotonic()))
            return
        inputs.put(Opened(host, proc, time.monotonic()))
        events = threading.Thread(target=_read_events, args=(host, proc, inputs), daemon=True, name=f"events-{host}")
        events.start()
        ended = threading.Event()
        threading.Thread(
            target=_keep_lifeline, args=(proc, self.keepalive, ended), daemon=True, name=f"lifeline-{host}"
        ).start()
        for line in _lines(proc.read):
            inputs.put(NodeOutput(host, line))
        events.join()
        ended.set()
        try:
            status = proc.exit_status()
        except Exception:
            status = None
        inputs.put(machine.SessionEnded(host, status, time.monotonic()))


def _failure(state: machine.AttemptState, item: machine.Input) -> Failure:
    """The first failure as the run registry keeps it: the rank a node reported, else none."""
    host, verdict = state.first or ("", "")
    rank = state.first_rank
    if rank is None and isinstance(item, machine.Reported):
        rank = item.event.rank
    return Failure(cause=verdict, rank=rank, node=host, code=state.code)


def _lines(read: Callable[[], bytes]):
    """Complete lines from a stream until it ends (a transport that dies under us ends it)."""
    splitter = LineSplitter()
    while True:
        try:
            data = read()
        except Exception:
            data = b""
        if not data:
            break
        yield from splitter.feed(data)
    yield from splitter.flush()


def _keep_lifeline(proc: NodeProcess, interval: float, ended: threading.Event) -> None:
    """Thread: a keepalive line on the node's stdin every `interval` until its session ends
    (once stdin is closed, sending does nothing). Its own thread: a send never holds up the
    loop that decides."""
    while not ended.wait(interval):
        proc.send(LIFELINE_PING)


def _read_events(host: str, proc: NodeProcess, inputs: queue.Queue) -> None:
    for line in _lines(proc.read_stderr):
        event = parse_event(line)
        inputs.put(NodeOutput(host, line) if event is None else machine.Reported(host, event, time.monotonic()))


def launch(
    plan: LaunchPlan, opts: SSHOptions, keepalive: float = KEEPALIVE_INTERVAL, record: LaunchRecord | None = None
) -> int:
    """Run the plan; the exit code of the job (see the module docstring). `record` (the run
    registry's row) gets the verdict however the launch ends."""
    launcher = Launcher(plan, opts, keepalive=keepalive, record=record)
    code, failure, interrupted = exitcodes.FAILED, None, False
    try:
        code = launcher.run()
        interrupted = bool(launcher.signals) and launcher.first_failure is None
        return code
    except ConnectError as exc:
        code, failure = EXIT_RUN_FAILED, Failure(cause=exc.line())
        raise SlurmgenError(exc.line(), exit_code=EXIT_RUN_FAILED) from None
    except KeyboardInterrupt:  # before any node started: nothing to stop yet
        code, interrupted = exitcodes.INTERRUPTED, True
        failure = Failure(cause="interrupted while connecting")
        raise SlurmgenError("interrupted while connecting", exit_code=exitcodes.INTERRUPTED) from None
    except BaseException as exc:
        failure = Failure(cause=f"slurmgen launch failed: {exc!r}")
        raise
    finally:
        if record:
            record.ended(code, interrupted, failure)
