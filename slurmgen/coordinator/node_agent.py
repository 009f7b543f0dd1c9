"""`slurmgen agent`: one per node; registers `<host>-<id>` workers and runs what the server says.

Every `interval` seconds (and at once when a rank exits) it posts a report of its slots and
their new output lines; the answer holds start and stop orders. Output lines do not wait for
that beat: a thread sends them as soon as they wait, batched (at most one message per
LINES_GAP, bounded in lines and bytes), so a rank's newest line reaches the page within a
fraction of a second while a heartbeat stays what it was. If the server is away the
ranks keep running and the agent keeps trying, then re-attaches by simply reporting again:
a server restart costs nothing. But not forever: once the agent has not reached the server
for longer than the server's `--agent-timeout` (sent with every answer) plus a margin, the
server has failed this node's groups and stopped or restarted their other ranks, so the ones
here, cut off by a partition, only hold their GPUs: the agent stops them (`--cut-off-after`).
It reads its ranks' trainer heartbeats itself (same clock as the writer) and reports each
quiet one's age, step and whether its process is stopped; the server judges the hang across
every agent's reports (group_blame.py), since this node alone would blame its own rank waiting in a
collective for a rank frozen on another node. No torch here: the agent is small and starts fast.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import threading
import time
import uuid
from collections.abc import Set as AbstractSet
from pathlib import Path

from slurmgen.contract import hangs, signals
from slurmgen.contract.states import HEARTBEAT_WORD, State
from slurmgen.coordinator.client import Client, ClientError
from slurmgen.coordinator.models import AgentLines, AgentOrders, AgentReport, QuietBeat
from slurmgen.coordinator.procs import Procs, Slot, write_world

log = logging.getLogger("slurmgen.agent")
LINES_PER_REPORT = 2000
CHARS_PER_REPORT = 1 << 20  # ...and at most this many characters of lines (the newest kept)
# Lines are sent as soon as they wait, then at most once per LINES_GAP seconds while more come,
# or per LINES_BACKOFF times the last send's round trip when that is longer: a busy server (1,000
# agents) is asked less often, never more than about 1/(1 + LINES_BACKOFF) of an agent's time.
LINES_GAP = 0.1
LINES_BACKOFF = 4.0
LINES_TIMEOUT = 2.0  # seconds a send may take: the heartbeat waits for it (see `shipping`)
CHANGES_POLL = 25.0  # seconds a long poll for new orders stays open
# Seconds beyond the server's --agent-timeout before a cut-off agent stops its ranks: the
# server has judged the silence by then, whatever the clocks and the last request's latency.
CUT_OFF_MARGIN = 5.0
DEFAULT_SERVER_TIMEOUT = 10.0  # until the first answer says otherwise (serve's default)


def is_stale(beat: dict | None, now: float, timeout: float, pid: int | None = None) -> bool:
    """A trainer heartbeat is stale when it is older than its limit by the watchers' one rule
    (contract.hangs.beat_limit: `timeout` for a running rank, or the shorter one it learned from
    its own step times; a learned one for an evaluation or a checkpoint; as a running one when
    its process, the beat's writer or else `pid`, is stopped). No file, or a status not judged
    (an ended rank, a phase nothing bounds), is never stale."""
    quiet = quiet_beat(beat, now, timeout, pid)
    return quiet is not None and quiet.judged and quiet.age > (quiet.limit or timeout)


def _read_beat(path: Path | None) -> dict | None:
    try:
        return json.loads(path.read_text()) if path else None
    except (OSError, ValueError):
        return None


def is_stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP: T, a debugger: t), from /proc/PID/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(") ")[2][:1] in ("T", "t")


def quiet_beat(beat: dict | None, now: float, timeout: float, pid: int | None) -> QuietBeat | None:
    """The beat as the server judges it, once it is older than half its limit (contract.hangs.
    beat_limit, as is_stale; a phase nothing bounds by `timeout`, as a rank that may have
    waited, never hung); None otherwise, and for an ended rank."""
    if not beat or beat.get("status") not in (HEARTBEAT_WORD[State.RUNNING], *hangs.LEARNED_PHASES):
        return None
    writer = beat.get("pid") if isinstance(beat.get("pid"), int) else pid
    stopped = writer is not None and is_stopped(writer)
    limit = hangs.beat_limit(beat, timeout, stopped)
    try:
        age = now - float(beat["time"])
    except (KeyError, TypeError, ValueError):
        return None
    if age * 2 <= (limit or timeout):
        return None
    step = beat.get("step")
    return QuietBeat(
        age=max(0.0, age),
        step=step if isinstance(step, int) else None,
        stopped=stopped,
        limit=None if limit is None or limit == timeout else limit,  # learned: shorter, or longer (an evaluation)
        judged=limit is not None,
    )


class WorkerAgent:
    def __init__(
        self,
        client: Client,
        workers: int,
        host: str | None = None,
        state_dir: Path | None = None,
        interval: float = 1.0,
        grace: float = 10.0,
        cut_off_after: float | None = None,
    ):
        self.client = client
        self.host = host or socket.gethostname().split(".")[0]
        self.instance = uuid.uuid4().hex[:16]
        self.interval = interval
        self.grace = grace
        self.cut_off_after = cut_off_after  # None: the server's agent timeout + CUT_OFF_MARGIN
        self.server_timeout = DEFAULT_SERVER_TIMEOUT
        self.last_heard = time.monotonic()
        base = state_dir or Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local/state")) / "slurmgen" / "agent"
        self.log_dir = base / self.host / "logs"
        self.hb_root = base / self.host / "heartbeats"
        self.warm_root = base / self.host / "warm"  # where ranks wait for a warm restart's world
        self.wake = threading.Event()
        self.procs = Procs(workers, self.log_dir, self.wake)
        self.stopping = False
        self.connected: bool | None = None
        # Held while lines are taken and sent, by the heartbeat and by `ship_lines`: a rank's last
        # lines reach the server before the heartbeat that reports its exit (and ends the attempt).
        self.shipping = threading.Lock()

    def _hung(self, slot: Slot, now: float) -> bool:
        return bool(
            slot.running
            and slot.order
            and is_stale(
                _read_beat(slot.hb_file), now, slot.order.heartbeat_timeout, slot.proc.pid if slot.proc else None
            )
        )

    def _quiet(self, slot: Slot, now: float) -> QuietBeat | None:
        if not (slot.running and slot.order and slot.proc):
            return None
        return quiet_beat(_read_beat(slot.hb_file), now, slot.order.heartbeat_timeout, slot.proc.pid)

    def report(self) -> tuple[AgentReport, int]:
        lines, dropped = self.procs.output.take(LINES_PER_REPORT, CHARS_PER_REPORT)
        now = time.time()
        return AgentReport(
            host=self.host,
            instance=self.instance,
            lines=lines,
            dropped=dropped,
            workers=[s.report(self._hung(s, now), self._quiet(s, now)) for s in self.procs.slots],
        ), dropped

    @property
    def cut_off_limit(self) -> float:
        """Seconds without reaching the server after which this node's ranks are stopped."""
        return self.cut_off_after if self.cut_off_after is not None else self.server_timeout + CUT_OFF_MARGIN

    def beat_timeout(self) -> float | None:
        """While ranks run, a heartbeat waits no longer than the agent's next own deadline (the
        cut-off, a KILL after a grace), at least 1 s: a request hanging in a partition would
        otherwise hold them up by the client's whole timeout. None: the client's own."""
        running = [s for s in self.procs.slots if s.running]
        if not running:
            return None
        deadlines = [self.last_heard + self.cut_off_limit, *(s.kill_at for s in running if s.kill_at is not None)]
        return max(1.0, min(self.client.timeout, min(deadlines) - time.monotonic()))

    def beat(self) -> None:
        try:
            with self.shipping:
                report, dropped = self.report()
                try:
                    orders = self.client.heartbeat(report, timeout=self.beat_timeout())
                except ClientError:
                    self.procs.output.give_back(report.lines, dropped)
                    raise
        except ClientError as e:
            if e.status == 401 and self.connected is None:
                raise  # a wrong token at start-up is a mistake to fix, not an outage to wait out
            if self.connected is not False:
                log.warning(
                    "server unreachable or refusing (%s); ranks keep running for up to %g s, retrying",
                    e,
                    self.cut_off_limit,
                )
            self.connected = False
            self.stop_if_cut_off()
            return
        self.last_heard = time.monotonic()
        self.server_timeout = orders.agent_timeout or self.server_timeout
        if not self.connected:
            log.info("connected to %s as %s with %d workers", self.client.base_url, self.host, len(self.procs.slots))
        self.connected = True
        self.apply(orders)

    def stop_if_cut_off(self) -> None:
        """Stop every running rank (TERM, KILL after the grace) once the server has been out of
        reach for longer than `cut_off_limit`; a shorter outage (a restart) keeps them."""
        silent = time.monotonic() - self.last_heard
        running = [s for s in self.procs.slots if s.running and s.kill_at is None]
        if not running or silent <= self.cut_off_limit:
            return
        why = (
            f"--cut-off-after {self.cut_off_after:g} s"
            if self.cut_off_after is not None
            else f"the server's agent timeout ({self.server_timeout:g} s) + {CUT_OFF_MARGIN:g} s"
        )
        log.warning(
            "server unreachable for %.1f s, longer than %s: it has failed this node's groups; stopping %d rank(s)",
            silent,
            why,
            len(running),
        )
        for slot in running:
            self.procs.stop(slot.idx, self.grace)

    def apply(self, orders: AgentOrders) -> None:
        for stop in orders.stop:
            if stop.worker < len(self.procs.slots):
                if stop.stack:
                    self.procs.take_stack(stop.worker)
                self.procs.stop(stop.worker, stop.grace)
        for world in orders.worlds:  # before the starts: a rank started anew finds its world there
            if write_world(self.warm_root, world):
                log.info("warm restart: generation %d of %s attempt %d", world.generation, world.group, world.attempt)
        for start in orders.start:
            if start.worker < len(self.procs.slots):
                log.info(
                    "starting %s-%d as rank %d of %s attempt %d",
                    self.host,
                    start.worker,
                    start.rank,
                    start.group,
                    start.attempt,
                )
                self.procs.start(start, self.hb_root, self.warm_root)
        self.procs.keep_spares({(g, n) for g, n in orders.warm})
        self.clear_ended({(g, n) for g, n in orders.warm})

    def clear_ended(self, warm: AbstractSet[tuple[str, int]]) -> None:
        """Remove the heartbeat and warm-world directories (`<group>-<attempt>`) of the attempts
        this node no longer runs: none of its ranks runs one, and the server keeps no warm restart
        of it here (AgentOrders.warm: a rank of it may be started anew). Every attempt makes one
        of each, so a restart a minute would leave two a minute for the node's life. The ranks'
        logs stay; a run record a rank announced beside its heartbeat is read before it goes."""
        live = {f"{group}-{attempt}" for group, attempt in warm}
        live |= {f"{s.order.group}-{s.order.attempt}" for s in self.procs.slots if s.running and s.order}
        for slot in self.procs.slots:
            if slot.order and f"{slot.order.group}-{slot.order.attempt}" not in live:
                slot.announced_runs()
        for root in (self.hb_root, self.warm_root):
            with contextlib.suppress(FileNotFoundError):
                for entry in os.scandir(root):
                    if entry.name not in live and entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)

    def watch_changes(self) -> None:
        """Thread: keep a long poll open and wake the main loop when orders may have changed
        (see `changes`); its own connection, so a held poll never delays a heartbeat."""
        client, since = Client(self.client.base_url, self.client.token), -1
        while not self.stopping:
            try:
                version = client.changes(since, CHANGES_POLL)
            except ClientError:
                time.sleep(self.interval)
                continue
            if version != since:
                since = version
                self.wake.set()

    def send_lines(self) -> float:
        """Send the lines waiting, if any, between heartbeats (none while the server is out of
        reach: the heartbeat that reaches it again carries them); the seconds it took."""
        began = time.monotonic()
        with self.shipping:
            if not self.connected:
                return 0.0
            lines, dropped = self.procs.output.take(LINES_PER_REPORT, CHARS_PER_REPORT)
            if not lines and not dropped:
                return 0.0
            try:
                self.client.lines(
                    AgentLines(host=self.host, instance=self.instance, lines=lines, dropped=dropped),
                    timeout=LINES_TIMEOUT,
                )
            except ClientError:
                self.procs.output.give_back(lines, dropped)
        return time.monotonic() - began

    def ship_lines(self) -> None:
        """Thread: lines go as soon as they wait, then at most once per LINES_GAP (longer after a
        slow answer), so a flood is sent in batches and a single line at once."""
        while not self.stopping:
            if self.procs.output.waiting.wait(self.interval):
                took = self.send_lines()
                time.sleep(max(LINES_GAP, LINES_BACKOFF * took))

    def pause(self, started: float) -> None:
        """Until the next heartbeat: `interval` after the last one began, sooner when woken
        (output lines do not wait for it: `ship_lines`)."""
        left = self.interval - (time.monotonic() - started)
        if left > 0:
            self.wake.wait(left)

    def run(self) -> None:
        """Heartbeat until SIGTERM/SIGINT, then stop every rank (TERM, KILL after the grace)."""

        def on_signal(signum, frame):
            self.stopping = True
            self.wake.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        for warning in signals.WARNINGS:  # the ranks' to take or die of: the agent outlives them
            signal.signal(signal.Signals["SIG" + warning], lambda signum, frame: None)
        threading.Thread(target=self.watch_changes, daemon=True).start()
        threading.Thread(target=self.ship_lines, daemon=True).start()
        try:
            while not self.stopping:
                started = time.monotonic()
                self.wake.clear()
                self.beat()
                self.procs.enforce_grace()
                self.pause(started)
        finally:
            self.procs.stop_all(self.grace)
            with contextlib.suppress(ClientError):
                self.beat()  # tell the server how the ranks ended
            self.clear_ended(frozenset())  # every rank is stopped: no attempt runs here any more
