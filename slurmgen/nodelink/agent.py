"""One node's agent of launch_multi_node.sh: the launchers of a job stop as one.

Embedded in the generated script and run on every node beside the ranks; standard library
only, Python 3.8 or newer (slurmgen need not be installed on the nodes):

    python3 -c CODE ME MASTER_ADDR LINK_PORT NODE_RANK NNODES START_TIMEOUT LINK_TIMEOUT GRACE

with the job's token in SLURMGEN_LINK_TOKEN. Node 0's agent, the master, listens on
MASTER_ADDR:LINK_PORT (that address only); the others connect to it.

From its launcher, on stdin, one line each:
    rank PGID            a rank's process group: stopped here should the launcher die
    failed RANK CODE     a rank exited with CODE
    failed RANK CODE hung  a rank's heartbeat went stale: the launcher's watcher killed it
    signal CODE          the launcher got SIGINT or SIGTERM
    done                 every rank of this node exited 0
Stdin ending before one of the last three (or the launcher's pid changing) means the launcher
died: the agent stops the ranks itself and reports the node lost.

To its launcher: one line on stdout, `linked`, once this node is part of the job (the master:
listening; the others: welcomed by the master). The launcher starts no rank before it, so every
running rank hears of a failure anywhere. Then the exit status: 0 when the job went well as far
as this node knows, else the code of the job's first failure, whose cause it prints as one line
on stderr; the launcher then stops its ranks and exits.

On the wire, text lines of at most MAX_LINE bytes:
    master -> node   challenge NONCE | welcome | refused WHY | stop NODE RANK CODE KIND | bye | ping
    node -> master   hello NODE NNODES MAC | failed RANK CODE KIND | done | ping
MAC = HMAC-SHA256(token, "NONCE NODE NNODES"): a node proves it knows the job's token without
sending it. KIND is what failed: rank, hung (a rank that stopped beating), signal, lost (a
launcher or its connection gone), absent (no word before the start timeout), nnodes (started
with another node count).
A connection can do no more than stop the job: nothing it sends is run or used as a path.

What the agent decides is one pure function, `step(link, input)` (like slurmgen's
launch/attempt.py): the classes below only turn the launcher's words, the other nodes' lines
and the clock into its inputs and carry out the actions it returns. Its verdict is the rule of
slurmgen/contract/verdict.py, the first failure of the job wins with its code, written here
again because this file runs on nodes where slurmgen is not installed and is embedded in the
generated script as this one text: tests/unit/contract/test_verdict.py runs the same event sequences
through both and requires the same first failure and code.
"""

import contextlib
import hashlib
import hmac
import os
import secrets
import selectors
import signal
import socket
import sys
import time
from dataclasses import dataclass, replace
from typing import FrozenSet, List, Optional, Tuple, Union

# slurmgen/contract/exitcodes.py's codes (a unit test keeps them equal): slurmgen may not be installed.
BAD_INPUT, HUNG, LOST = 2, 124, 255
# The code a failure of each kind gives when it carries none of its own (a rank's exit and a
# signal do): slurmgen/contract/verdict.py's CODES for the same causes (a unit test keeps them equal).
KIND_CODES = {"lost": LOST, "absent": HUNG, "nnodes": BAD_INPUT}
MAX_LINE = 256
TICK = 0.05
PING_EVERY = 1.0
# A connection that has not proved it knows the token within this time is closed.
HELLO_WITHIN = 5.0
# A pass of the main loop takes about TICK; a gap longer than this means this process itself
# was not running (a loaded machine, a stopped process), and the other side's words of that
# time may still be on their way: the gap, beyond the one pass that was run, does not count as
# their silence. (So silence is counted in time this agent ran: a peer that is frozen while
# every pass here stalls is still declared lost, after link_timeout / TICK passes.)
STALL = PING_EVERY


def explain(node, rank, code, kind):
    """The first failure of the job, as a phrase naming the node (and rank) and the code."""
    if kind == "rank":
        return f"rank {rank} on node {node} exited with code {code}"
    if kind == "hung":
        return f"rank {rank} on node {node} stopped beating (hung, code {code})"
    what = {
        "signal": "was interrupted by a signal",
        "absent": "never showed up",
        "nnodes": "was started with another number of nodes",
    }.get(kind, "was lost (its launcher died or the connection to it broke)")
    return f"node {node} {what} (code {code})"


def mac(token, nonce, node, nnodes):
    return hmac.new(token.encode(), f"{nonce} {node} {nnodes}".encode(), hashlib.sha256).hexdigest()


# ---- the rule: what this node knows of the job and what to do. Pure: no clock, no I/O ----------
Cause = Tuple[object, str, int, str]  # (node, rank, code, kind); rank "-" when not a rank's
# The master hears the first failure and names it to every node; a worker that reported its own
# waits this long for that answer before it ends with its own.
ANSWER_WITHIN = 1.0
# A worker whose ranks all ended well waits this long (after the start timeout, should it not be
# linked yet) for the master's `bye`.
BYE_WITHIN = 2.0


@dataclass(frozen=True)
class Failed:
    """A failure: this node's (from its launcher) or, heard by the master, any node's."""

    node: object  # a node number; for absent nodes "1,2"
    rank: str
    code: int
    kind: str  # rank, hung, signal, lost, absent, nnodes
    at: float = 0.0


@dataclass(frozen=True)
class Done:
    """Every rank of `node` exited 0."""

    node: int
    at: float = 0.0


@dataclass(frozen=True)
class LauncherDied:
    """This node's launcher ended without its last word: its ranks are stopped here."""

    at: float = 0.0


@dataclass(frozen=True)
class Ended:
    """A worker hears how the job ended from outside: the master's `stop` (its verdict), `bye`,
    `refused`, or no master at all."""

    code: int
    cause: Optional[Cause] = None


@dataclass(frozen=True)
class MasterGone:
    """A worker's connection to the master ended; `ready`: it had said hello."""

    ready: bool


@dataclass(frozen=True)
class Tick:
    at: float


Input = Union[Failed, Done, LauncherDied, Ended, MasterGone, Tick]


@dataclass(frozen=True)
class Send:
    """The master: to every node; a worker: to the master."""

    text: str


@dataclass(frozen=True)
class StopRanks:
    pass


@dataclass(frozen=True)
class Finish:
    code: int
    cause: Optional[Cause] = None


Action = Union[Send, StopRanks, Finish]


@dataclass(frozen=True)
class Link:
    node: int
    nnodes: int
    start_by: float = 0.0
    done: FrozenSet[int] = frozenset()  # nodes whose ranks all exited 0
    leave: Optional[Tuple[float, int, Optional[Cause]]] = None  # a worker's own end: (at, code, cause)
    code: Optional[int] = None  # the exit status, once decided

    @property
    def master(self):
        return self.node == 0


def step(link: Link, event: Input) -> Tuple[Link, List[Action]]:
    """The next state and what to do, for one input. The first end decides; inputs after it
    change nothing."""
    if isinstance(event, LauncherDied):  # its ranks are stopped here whatever else was decided
        link, actions = failed(link, Failed(link.node, "-", KIND_CODES["lost"], "lost", event.at))
        return end(link, actions + [StopRanks()], LOST, (link.node, "-", LOST, "lost"))
    if link.code is not None:
        return link, []
    if isinstance(event, Failed):
        return failed(link, event)
    if isinstance(event, Done):
        return done(link, event)
    if isinstance(event, Ended):
        return end(link, [], event.code, event.cause)
    if isinstance(event, MasterGone):
        if link.node in link.done:
            return end(link, [], 0)
        return end(link, [], LOST, (0, "-", LOST, "lost")) if event.ready else (link, [])
    if link.leave is not None and event.at >= link.leave[0]:
        return end(link, [], *link.leave[1:])
    return link, []


def end(link, actions, code, cause=None):
    if link.code is not None:
        return link, actions
    return replace(link, code=code), actions + [Finish(code, cause)]


def failed(link, event):
    """The master: the first failure stops the job, every node hears of it in one line. A
    worker tells the master and waits for its answer, which names the job's first failure."""
    cause = (event.node, event.rank, event.code, event.kind)
    if not link.master:
        leave = (event.at + ANSWER_WITHIN, event.code, cause)
        return replace(link, leave=leave), [Send(f"failed {event.rank} {event.code} {event.kind}")]
    if link.code is not None:
        return link, []
    return end(link, [Send(f"stop {event.node} {event.rank} {event.code} {event.kind}")], event.code, cause)


def done(link, event):
    link = replace(link, done=link.done | {event.node})
    if link.master:
        return end(link, [], 0) if len(link.done) == link.nnodes else (link, [])
    # Not linked yet: the master must still hear it (or be reported absent at the start timeout).
    leave = (max(event.at, link.start_by) + BYE_WITHIN, 0, None)
    return replace(link, leave=leave), [Send("done")]


class Lines:
    """Whole text lines out of a byte stream, each split into words."""

    def __init__(self):
        self.buf = b""

    def feed(self, data):
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        if len(self.buf) > MAX_LINE or any(len(line) > MAX_LINE for line in lines):
            raise ValueError("line too long")
        return [line.decode("ascii", "replace").split() for line in lines if line.strip()]


def send(conn, text):
    try:
        conn.sendall(text.encode() + b"\n")
        return True
    except OSError:
        return False


class Agent:
    """What both roles share: the launcher's words, its death, carrying out `step`'s actions."""

    def __init__(self, me, node, nnodes, token, grace, start_by):
        self.me, self.node, self.nnodes, self.token, self.grace = me, node, nnodes, token, grace
        self.sel = selectors.DefaultSelector()
        self.parent = os.getppid()
        self.pgids = []
        self.said = None  # the launcher's last word: failed, signal, done; or died
        self.stdin = Lines()
        self.link = Link(node, nnodes, start_by)
        self.awake = time.monotonic()  # the last pass of the main loop

    @property
    def code(self):
        """The exit status once decided, else None."""
        return self.link.code

    def feed(self, event):
        self.link, actions = step(self.link, event)
        for action in actions:
            if isinstance(action, Send):
                self.tell(action.text)
            elif isinstance(action, StopRanks):
                self.stop_ranks()
            else:
                self.finish(action.cause)

    def linked(self):
        print("linked", flush=True)

    def say(self, text):
        with contextlib.suppress(OSError):
            print(f"{self.me}: {text}", file=sys.stderr, flush=True)

    def finish(self, cause):
        """The end is decided; `cause` (node, rank, code, kind) is the job's first failure."""
        if cause is not None:
            self.say(f"first failure of the job: {explain(*cause)}; stopping the ranks on node {self.node}")

    def on_stdin(self, _):
        data = os.read(0, 4096)
        if not data:
            self.sel.unregister(0)
            if self.said is None:
                self.launcher_died()
            return
        for words in self.stdin.feed(data):
            if words[0] == "rank":
                self.pgids.append(int(words[1]))
            elif words[0] == "failed":
                self.said = "failed"
                kind = "hung" if words[3:] == ["hung"] else "rank"
                self.feed(Failed(self.node, words[1], int(words[2]), kind, time.monotonic()))
            elif words[0] == "signal":
                self.said = "signal"
                self.feed(Failed(self.node, "-", int(words[1]), "signal", time.monotonic()))
            elif words[0] == "done":
                self.said = "done"
                self.feed(Done(self.node, time.monotonic()))

    def launcher_died(self):
        self.said = "died"
        self.feed(LauncherDied(time.monotonic()))

    def stop_ranks(self):
        """TERM every rank's process group, KILL what is left after the grace time."""
        deadline = time.monotonic() + self.grace
        alive = [g for g in self.pgids if signal_group(g, signal.SIGTERM)]
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [g for g in alive if signal_group(g, 0)]
        for group in alive:
            signal_group(group, signal.SIGKILL)

    def run(self):
        self.sel.register(0, selectors.EVENT_READ, self.on_stdin)
        while self.code is None:
            for key, _ in self.sel.select(TICK):
                if self.code is None:
                    key.data(key.fileobj)
            if self.said is None and os.getppid() != self.parent:
                self.launcher_died()
            if self.code is None:
                self.tick(time.monotonic())
        return self.code

    def tick(self, now):
        """Time passes: pings, and the verdicts on silence, counted only while this agent ran."""
        stalled = now - self.awake
        self.awake = now
        if stalled > STALL:
            self.excuse(stalled - TICK)
        self.on_time(now)


def signal_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
        return True
    except OSError:
        return False


class Peer:
    def __init__(self, conn, addr, now):
        self.conn, self.addr, self.node, self.seen, self.since = conn, addr, None, now, now
        self.nonce = secrets.token_hex(16)
        self.lines = Lines()


class Master(Agent):
    """Node 0: hears every node, decides which failure was first, tells every node."""

    def __init__(self, me, nnodes, token, grace, addr, port, start_timeout, link_timeout):
        super().__init__(me, 0, nnodes, token, grace, time.monotonic() + start_timeout)
        family, kind, proto, _, where = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
        self.server = socket.socket(family, kind, proto)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(where)
        self.server.listen(64)
        self.sel.register(self.server, selectors.EVENT_READ, self.on_accept)
        self.peers = {}  # socket -> Peer
        self.nodes = {0}  # every node that has said hello
        self.link_timeout, self.next_ping = link_timeout, time.monotonic()

    def on_accept(self, server):
        conn, addr = server.accept()
        conn.settimeout(1.0)
        peer = self.peers[conn] = Peer(conn, addr[0], time.monotonic())
        self.sel.register(conn, selectors.EVENT_READ, self.on_peer)
        send(conn, f"challenge {peer.nonce}")

    def on_peer(self, conn):
        peer = self.peers[conn]
        try:
            data = conn.recv(4096)
            lines = peer.lines.feed(data) if data else None
        except (OSError, ValueError):
            lines = None
        if lines is None:
            self.drop(peer)
            return
        peer.seen = time.monotonic()
        for words in lines:
            if peer.node is None:
                self.hello(peer, words)
            elif words[0] == "failed" and len(words) == 4 and words[2].isdigit():
                self.feed(Failed(peer.node, words[1], int(words[2]), words[3]))
            elif words[0] == "done":
                send(conn, "bye")
                self.feed(Done(peer.node))
            if self.code is not None or conn not in self.peers:
                return

    def hello(self, peer, words):
        if len(words) != 4 or words[0] != "hello" or not words[1].isdigit():
            return self.drop(peer)
        node, nnodes, their_mac = int(words[1]), words[2], words[3]
        if not hmac.compare_digest(their_mac, mac(self.token, peer.nonce, words[1], nnodes)):
            why = "its token differs from the master's (SLURMGEN_LINK_TOKEN)"
        elif not 0 < node < self.nnodes or node in self.nodes:
            why = f"node {node} is already here or not of this job"
        else:
            why = None
        if why is not None:
            self.say(f"refused a connection from {peer.addr}: {why}")
            send(peer.conn, f"refused {why}")
            return self.drop(peer)
        peer.node = node
        self.nodes.add(node)
        if nnodes != str(self.nnodes):
            self.feed(Failed(node, "-", KIND_CODES["nnodes"], "nnodes"))
        else:
            send(peer.conn, "welcome")

    def drop(self, peer):
        self.sel.unregister(peer.conn)
        peer.conn.close()
        del self.peers[peer.conn]
        if peer.node is not None and peer.node not in self.link.done:
            self.feed(Failed(peer.node, "-", KIND_CODES["lost"], "lost"))

    def tell(self, text):
        """To every node (also one whose hello is still on its way: it may have started its ranks)."""
        for peer in self.peers.values():
            send(peer.conn, text)

    def close(self):
        """Leave so that the last `stop` arrives: a socket closed with unread bytes (a ping)
        is reset, and a reset may drop what was sent just before."""
        for conn in self.peers:
            try:
                conn.setblocking(False)
                while conn.recv(4096):
                    pass
            except OSError:
                pass
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_WR)

    def excuse(self, stalled):
        for peer in self.peers.values():
            peer.seen, peer.since = (min(t + stalled, self.awake) for t in (peer.seen, peer.since))

    def on_time(self, now):
        if now >= self.next_ping:
            self.next_ping = now + PING_EVERY
            for peer in list(self.peers.values()):
                if peer.node is not None:
                    send(peer.conn, "ping")
        for peer in list(self.peers.values()):
            if (peer.node is None and now - peer.since > HELLO_WITHIN) or now - peer.seen > self.link_timeout:
                self.drop(peer)
        missing = [str(n) for n in range(self.nnodes) if n not in self.nodes]
        if missing and now >= self.link.start_by:
            self.feed(Failed(",".join(missing), "-", KIND_CODES["absent"], "absent"))


class Worker(Agent):
    """Every other node: tells the master what happens here, stops when the master says so."""

    def __init__(self, me, node, nnodes, token, grace, addr, port, start_timeout, link_timeout):
        now = time.monotonic()
        super().__init__(me, node, nnodes, token, grace, now + start_timeout)
        self.addr, self.port, self.link_timeout = addr, port, link_timeout
        self.next_try, self.next_ping, self.seen = now, now, now
        self.conn = None
        self.ready = False  # hello sent: what this node says now reaches the master
        self.outbox = []  # what it said before
        self.lines = Lines()

    def connect(self, now):
        self.next_try = now + 0.2
        try:
            self.conn = socket.create_connection((self.addr, self.port), timeout=0.5)
        except OSError:
            return
        self.conn.settimeout(1.0)
        self.seen = now
        self.sel.register(self.conn, selectors.EVENT_READ, self.on_master)

    def on_master(self, conn):
        try:
            data = conn.recv(4096)
            lines = self.lines.feed(data) if data else None
        except (OSError, ValueError):
            lines = None
        if lines is None:
            return self.master_gone()
        self.seen = time.monotonic()
        for words in lines:
            if words[0] == "challenge" and len(words) == 2 and not self.ready:
                self.ready = send(
                    conn, f"hello {self.node} {self.nnodes} {mac(self.token, words[1], self.node, self.nnodes)}"
                )
                for text in self.outbox:
                    send(conn, text)
            elif words[0] == "welcome":
                self.linked()
            elif words[0] == "stop" and len(words) == 5 and words[3].isdigit():
                return self.feed(Ended(int(words[3]), tuple(words[1:])))
            elif words[0] == "refused":
                self.say(f"the master at {self.addr}:{self.port} refused this node: {' '.join(words[1:])}")
                return self.feed(Ended(BAD_INPUT))
            elif words[0] == "bye":
                return self.feed(Ended(0))

    def master_gone(self):
        self.sel.unregister(self.conn)
        self.conn.close()
        self.feed(MasterGone(self.ready))
        if self.code is None:  # not linked yet: the master is still starting up, try again
            self.conn = None

    def tell(self, text):
        if self.ready and send(self.conn, text):
            return
        self.outbox.append(text)

    def excuse(self, stalled):
        self.seen = min(self.seen + stalled, self.awake)

    def on_time(self, now):
        self.feed(Tick(now))
        if self.code is not None:
            return
        if self.conn is None:
            if now >= self.link.start_by:
                return self.feed(Ended(HUNG, (0, "-", HUNG, "absent")))
            if now >= self.next_try:
                self.connect(now)
        elif self.ready and now - self.seen > self.link_timeout:
            self.master_gone()
        elif self.ready and now >= self.next_ping:
            self.next_ping = now + PING_EVERY
            send(self.conn, "ping")


def main(argv):
    me, addr, port, node, nnodes, start_timeout, link_timeout, grace = argv
    # The warning signals are the ranks' (slurmgen/contract/signals.py): the link outlives them.
    for warning in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(warning, lambda *_: None)
    token = os.environ.get("SLURMGEN_LINK_TOKEN", "")
    node, nnodes, port = int(node), int(nnodes), int(port)
    start_timeout, link_timeout, grace = float(start_timeout), float(link_timeout), float(grace)
    if node == 0:
        try:
            agent = Master(me, nnodes, token, grace, addr, port, start_timeout, link_timeout)
        except OSError as e:
            print(
                f"{me}: error: cannot listen on {addr}:{port} for the other nodes ({e.strerror or e}): "
                f"set SLURMGEN_LINK_PORT to a free port, the same on every node",
                file=sys.stderr,
            )
            return BAD_INPUT
        agent.linked()
        try:
            return agent.run()
        finally:
            agent.close()
    return Worker(me, node, nnodes, token, grace, addr, port, start_timeout, link_timeout).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
