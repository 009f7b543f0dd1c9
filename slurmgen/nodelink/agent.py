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
"""

import hashlib
import hmac
import os
import secrets
import selectors
import signal
import socket
import sys
import time

# slurmgen/contract/exitcodes.py's codes (a unit test keeps them equal): slurmgen may not be installed.
BAD_INPUT, HUNG, LOST = 2, 124, 255
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
    what = {"signal": "was interrupted by a signal", "absent": "never showed up",
            "nnodes": "was started with another number of nodes"}.get(kind, "was lost (its launcher died "
                                                                              "or the connection to it broke)")
    return f"node {node} {what} (code {code})"


def mac(token, nonce, node, nnodes):
    return hmac.new(token.encode(), f"{nonce} {node} {nnodes}".encode(), hashlib.sha256).hexdigest()


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
    """What both roles share: the launcher's commands, its death, the verdict."""

    def __init__(self, me, node, nnodes, token, grace):
        self.me, self.node, self.nnodes, self.token, self.grace = me, node, nnodes, token, grace
        self.sel = selectors.DefaultSelector()
        self.parent = os.getppid()
        self.pgids = []
        self.said = None  # the launcher's last word: failed, signal, done; or died
        self.stdin = Lines()
        self.code = None
        self.awake = time.monotonic()  # the last pass of the main loop

    def linked(self):
        print("linked", flush=True)

    def say(self, text):
        try:
            print(f"{self.me}: {text}", file=sys.stderr, flush=True)
        except OSError:
            pass

    def finish(self, code, cause=None):
        """End with `code`; `cause` (node, rank, code, kind) is the job's first failure."""
        if self.code is not None:
            return
        if cause is not None:
            self.say(f"first failure of the job: {explain(*cause)}; stopping the ranks on node {self.node}")
        self.code = code

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
                self.report(words[1], int(words[2]), "hung" if words[3:] == ["hung"] else "rank")
            elif words[0] == "signal":
                self.said = "signal"
                self.report("-", int(words[1]), "signal")
            elif words[0] == "done":
                self.said = "done"
                self.node_done()

    def launcher_died(self):
        self.said = "died"
        self.report("-", LOST, "lost")
        self.stop_ranks()
        self.finish(LOST, (self.node, "-", LOST, "lost"))

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
        super().__init__(me, 0, nnodes, token, grace)
        family, kind, proto, _, where = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
        self.server = socket.socket(family, kind, proto)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(where)
        self.server.listen(64)
        self.sel.register(self.server, selectors.EVENT_READ, self.on_accept)
        self.peers = {}   # socket -> Peer
        self.nodes = {0}  # every node that has said hello
        self.done = set()
        now = time.monotonic()
        self.start_by, self.link_timeout, self.next_ping = now + start_timeout, link_timeout, now

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
                self.fail(peer.node, words[1], int(words[2]), words[3])
            elif words[0] == "done":
                self.done.add(peer.node)
                send(conn, "bye")
                self.check_all_done()
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
            self.fail(node, "-", BAD_INPUT, "nnodes")
        else:
            send(peer.conn, "welcome")

    def drop(self, peer):
        self.sel.unregister(peer.conn)
        peer.conn.close()
        del self.peers[peer.conn]
        if peer.node is not None and peer.node not in self.done:
            self.fail(peer.node, "-", LOST, "lost")

    def fail(self, node, rank, code, kind):
        """The first failure stops the job: every node hears of it, in one line (also one whose
        hello is still on its way: it may have started its ranks)."""
        if self.code is not None:
            return
        for peer in self.peers.values():
            send(peer.conn, f"stop {node} {rank} {code} {kind}")
        self.finish(code, (node, rank, code, kind))

    def report(self, rank, code, kind):
        self.fail(0, rank, code, kind)

    def node_done(self):
        self.done.add(0)
        self.check_all_done()

    def check_all_done(self):
        if len(self.done) == self.nnodes:
            self.finish(0)

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
            try:
                conn.shutdown(socket.SHUT_WR)
            except OSError:
                pass

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
        if missing and now >= self.start_by:
            self.fail(",".join(missing), "-", HUNG, "absent")


class Worker(Agent):
    """Every other node: tells the master what happens here, stops when the master says so."""

    def __init__(self, me, node, nnodes, token, grace, addr, port, start_timeout, link_timeout):
        super().__init__(me, node, nnodes, token, grace)
        self.addr, self.port, self.link_timeout = addr, port, link_timeout
        now = time.monotonic()
        self.start_by, self.next_try, self.next_ping, self.seen = now + start_timeout, now, now, now
        self.conn = None
        self.ready = False    # hello sent: what this node says now reaches the master
        self.outbox = []      # what it said before
        self.leave = None     # (deadline, code, cause) once this node has said its last word
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
                self.ready = send(conn, f"hello {self.node} {self.nnodes} "
                                        f"{mac(self.token, words[1], self.node, self.nnodes)}")
                for text in self.outbox:
                    send(conn, text)
            elif words[0] == "welcome":
                self.linked()
            elif words[0] == "stop" and len(words) == 5 and words[3].isdigit():
                return self.finish(int(words[3]), tuple(words[1:]))
            elif words[0] == "refused":
                self.say(f"the master at {self.addr}:{self.port} refused this node: {' '.join(words[1:])}")
                return self.finish(BAD_INPUT)
            elif words[0] == "bye":
                return self.finish(0)

    def master_gone(self):
        self.sel.unregister(self.conn)
        self.conn.close()
        if self.said == "done":
            return self.finish(0)
        if not self.ready:  # the master is still starting up: try again
            self.conn = None
            return
        self.finish(LOST, (0, "-", LOST, "lost"))

    def tell(self, text):
        if self.ready and send(self.conn, text):
            return
        self.outbox.append(text)

    def report(self, rank, code, kind):
        # The master's answer (`stop`, naming the job's first failure) normally comes at once.
        self.tell(f"failed {rank} {code} {kind}")
        self.leave = (time.monotonic() + 1.0, code, (self.node, rank, code, kind))

    def node_done(self):
        # Not linked yet: the master must still hear it (or be reported absent at the start timeout).
        self.tell("done")
        self.leave = (max(time.monotonic(), self.start_by) + 2.0, 0, None)

    def excuse(self, stalled):
        self.seen = min(self.seen + stalled, self.awake)

    def on_time(self, now):
        if self.leave is not None and now >= self.leave[0]:
            return self.finish(*self.leave[1:])
        if self.conn is None:
            if now >= self.start_by:
                return self.finish(HUNG, (0, "-", HUNG, "absent"))
            if now >= self.next_try:
                self.connect(now)
        elif self.ready and now - self.seen > self.link_timeout:
            self.master_gone()
        elif self.ready and now >= self.next_ping:
            self.next_ping = now + PING_EVERY
            send(self.conn, "ping")


def main(argv):
    me, addr, port, node, nnodes, start_timeout, link_timeout, grace = argv
    token = os.environ.get("SLURMGEN_LINK_TOKEN", "")
    node, nnodes, port = int(node), int(nnodes), int(port)
    start_timeout, link_timeout, grace = float(start_timeout), float(link_timeout), float(grace)
    if node == 0:
        try:
            agent = Master(me, nnodes, token, grace, addr, port, start_timeout, link_timeout)
        except OSError as e:
            print(f"{me}: error: cannot listen on {addr}:{port} for the other nodes ({e.strerror or e}): "
                  f"set SLURMGEN_LINK_PORT to a free port, the same on every node", file=sys.stderr)
            return BAD_INPUT
        agent.linked()
        try:
            return agent.run()
        finally:
            agent.close()
    return Worker(me, node, nnodes, token, grace, addr, port, start_timeout, link_timeout).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
