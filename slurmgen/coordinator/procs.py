"""The agent's worker slots: start a rank in its own process group, collect its output, stop it.

No orphans, two ways: each rank's leader gets PR_SET_PDEATHSIG=SIGKILL (it dies the moment the
agent's main thread does), and a watchdog process holds a pipe from the agent and, when the
pipe closes because the agent died however it died, kills every process group still listed,
which also catches what the rank itself forked. Output goes line by line to a per-rank log
file and into a bounded queue the agent drains as lines wait (oldest lines dropped, counted).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import ctypes.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Set as AbstractSet
from pathlib import Path, PurePosixPath

from slurmgen.contract import envvars, exitcodes, files, phases
from slurmgen.contract import warm as protocol
from slurmgen.contract.states import HEARTBEAT_WORD, State
from slurmgen.contract.threads import default_omp_threads
from slurmgen.coordinator import stacks, watchdog
from slurmgen.coordinator.models import QuietBeat, ReportedLine, StartOrder, WorkerReport, WorldOrder
from slurmgen.observe.timeline_writer import TimelineWriter
from slurmgen.tracking.store import ANNOUNCE_FILE

MAX_LINE = 4096
QUEUE_LINES = 5000
PR_SET_PDEATHSIG = 1
# The watchdog runs by path, isolated (-I: no PYTHON* variables, no script or user directories on
# sys.path) and without site-packages (-S): it needs the standard library only, and starts faster.
WATCHDOG = [sys.executable, "-I", "-S", watchdog.__file__]


def _pdeathsig_hook():
    """A preexec_fn that asks the kernel to SIGKILL the child when the agent dies. Resolved
    before fork, so the child only makes one libc call."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    prctl, parent = libc.prctl, os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the agent died before prctl took effect
            os._exit(1)

    return hook


def private_dirs(path: Path, top: Path) -> None:
    """`path` and its parents up to and with `top`, owner-only (0700) whatever the umask: a
    rank's output may hold tokens, paths and data other users of the node must not read."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    d = path
    while True:
        if d.stat().st_mode & 0o777 != 0o700:
            d.chmod(0o700)
        if d == top or d == d.parent:
            return
        d = d.parent


def runs_python(argv: list[str]) -> bool:
    """Whether the program is a Python interpreter's (python, python3.11, /opt/venv/bin/python),
    which a warm spare can stand in for (generate/render.py's `runs_python` asks the same of a spec)."""
    return bool(argv) and bool(protocol.PYTHON.match(PurePosixPath(argv[0]).name))


def warm_dir(warm_root: Path, group: str, attempt: int) -> Path:
    """The directory, made private, where a group attempt's ranks on this node wait for a warm
    restart's new world (contract/warm.py: the agent writes it there, `write_world`)."""
    path = warm_root / f"{group}-{attempt}"
    private_dirs(path, warm_root)
    return path


def write_world(warm_root: Path, order: WorldOrder) -> bool:
    """Write a warm restart's new world for the attempt's ranks here, once (a world already there
    of that generation or a later one stays); whether it was written."""
    directory = str(warm_dir(warm_root, order.group, order.attempt))
    current = protocol.read(directory)
    if current is not None and current.generation >= order.generation:
        return False
    protocol.write(directory, protocol.World(order.generation, order.master_addr, order.master_port, order.world_size))
    return True


def exit_status(returncode: int) -> int:
    """A shell-style exit code: 128+N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class LineBuffer:
    """Lines for the server, bounded, the newest first: under a flood a message carries the
    newest `most` lines, so the page shows what a rank prints now, not what it printed seconds
    ago. What does not fit is counted as dropped, and said where it happened: a line per rank
    "... N lines skipped here" stands where they were (the rank's log file keeps them all)."""

    def __init__(self, limit: int = QUEUE_LINES):
        self.lines: collections.deque = collections.deque()
        self.limit = limit
        self.size = 0  # characters of the lines queued, for a bound in bytes on what one message carries
        self.waiting = threading.Event()  # set while lines wait: the agent's sender wakes at once
        self.dropped = 0
        self.skipped: dict[tuple[int, str, int, int], list] = {}  # a rank's key -> [count, its first line gone]
        self.sent_skipped: dict[tuple[int, str, int, int], list] = {}  # the last take()'s, for give_back
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.lines)

    def put(self, line: ReportedLine) -> None:
        with self.lock:
            if len(self.lines) >= self.limit:
                self._drop_oldest()
            self.lines.append(line)
            self.size += len(line.line)
        self.waiting.set()

    def _drop_oldest(self) -> None:
        gone = self.lines.popleft()
        self.size -= len(gone.line)
        self.dropped += 1
        key = (gone.worker, gone.group, gone.attempt, gone.rank)
        self.skipped.setdefault(key, [0, gone])[0] += 1

    def take(self, most: int, most_chars: int | None = None) -> tuple[list[ReportedLine], int]:
        """Every line waiting, at most the newest `most` and `most_chars` characters of them
        (the older ones dropped, counted, said by a marker per rank), and the count dropped."""
        with self.lock:
            while len(self.lines) > most or (most_chars is not None and self.size > most_chars and self.lines):
                self._drop_oldest()
            markers = [
                first.model_copy(
                    update={"line": f"… {count} lines skipped here (every line is in the rank's log on its node)"}
                )
                for count, first in self.skipped.values()
            ]
            taken = markers + [self.lines.popleft() for _ in range(len(self.lines))]
            self.size = 0
            self.waiting.clear()
            dropped, self.dropped, self.sent_skipped, self.skipped = self.dropped, 0, self.skipped, {}
            return taken, dropped

    def give_back(self, lines: list[ReportedLine], dropped: int) -> None:
        """Lines a failed heartbeat did not deliver go back to the front (still bounded; the
        oldest that no longer fit are counted as skipped, as any); its "skipped" lines become
        counts again, so the next heartbeat says one sum per rank."""
        with self.lock:
            sent, self.sent_skipped = self.sent_skipped, {}
            lines = lines[len(sent) :]
            room = max(0, self.limit - len(self.lines))
            self.dropped += dropped
            for key, (count, first) in sent.items():
                self.skipped.setdefault(key, [0, first])[0] += count
            for gone in lines[: max(0, len(lines) - room)]:
                self.dropped += 1
                key = (gone.worker, gone.group, gone.attempt, gone.rank)
                self.skipped.setdefault(key, [0, gone])[0] += 1
            kept = lines[len(lines) - room :] if room else []
            self.lines.extendleft(reversed(kept))
            self.size += sum(len(line.line) for line in kept)
            if self.lines or self.skipped:
                self.waiting.set()


class Slot:
    """One worker `<host>-<id>`: idle, running a rank of (group, attempt), or exited."""

    def __init__(self, idx: int):
        self.idx = idx
        self.order: StartOrder | None = None
        self.proc: subprocess.Popen | None = None
        self.exit_code: int | None = None
        self.kill_at: float | None = None
        self.hb_file: Path | None = None
        self.warm_dir: Path | None = None  # where its rank waits for a warm restart's world, if it may
        self.in_spare = False  # its rank went on in the node's warm spare (promoted), not a fresh process
        self.runs: list[str] = []
        self.timeline: TimelineWriter | None = None  # the run's timeline, where the group has one
        self.stack: list[str] | None = None  # where its hung rank was stuck, once the server asked

    def started(self, at: float) -> None:
        """The launcher's side of the timeline (contract/phases.py): the agent started the rank."""
        if self.timeline is not None and self.proc is not None:
            self.timeline.write(phases.PROCESS, at, pid=self.proc.pid, by=phases.BY_LAUNCHER)

    def ended(self, code: int) -> None:
        """...and saw it exit, whatever the program wrote itself."""
        if self.timeline is not None:
            status = HEARTBEAT_WORD[
                State.SUCCEEDED if code == 0 else State.FAILED
            ]  # as launch_multi_node.sh's launcher says
            self.timeline.write(phases.END, status=status, code=code, by=phases.BY_LAUNCHER)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.exit_code is None

    def report(self, hung: bool = False, beat: QuietBeat | None = None) -> WorkerReport:
        o = self.order
        state = State.RUNNING.value if self.running else ("exited" if o else State.IDLE.value)
        return WorkerReport(
            id=self.idx,
            state=state,
            group=o.group if o else None,
            attempt=o.attempt if o else None,
            pid=self.proc.pid if self.proc is not None and self.running else None,
            exit_code=self.exit_code,
            hung=hung,
            beat=beat,
            runs=self.announced_runs(),
            generation=o.generation if o else 0,
            met=bool(o and self.warm_dir and protocol.has_met(str(self.warm_dir), o.rank)),
            spare=self.in_spare,
            stack=self.stack,
        )

    def announced_runs(self) -> list[str]:
        """The run record directory the rank announced beside its heartbeat (tracking's
        ANNOUNCE_FILE), read once: a run's record keeps its place for the whole attempt."""
        if self.runs or self.order is None or self.hb_file is None:
            return self.runs
        note = self.hb_file.parent / ANNOUNCE_FILE.format(rank=self.order.rank)
        try:
            run_dir = json.loads(note.read_text())["dir"]
        except (OSError, ValueError, KeyError, TypeError):
            return []
        if isinstance(run_dir, str) and run_dir.startswith("/") and len(run_dir) < MAX_LINE:
            self.runs = [run_dir]
        return self.runs


class Procs:
    """All slots of one agent, plus the watchdog. Start and stop from the main thread only
    (PR_SET_PDEATHSIG fires when the thread that forked exits)."""

    def __init__(self, count: int, log_dir: Path, wake: threading.Event):
        self.slots = [Slot(i) for i in range(count)]
        self.log_dir = log_dir
        self.wake = wake
        self.output = LineBuffer()
        self.hook = _pdeathsig_hook()
        self.watchdog = subprocess.Popen(WATCHDOG, stdin=subprocess.PIPE, text=True, start_new_session=True)
        # (group, attempt) -> its warm spare on this node and the write end of the spare's orders
        self.spares: dict[tuple[str, int], tuple[subprocess.Popen, int]] = {}

    def _tell_watchdog(self, sign: str, pgid: int) -> None:
        assert self.watchdog.stdin is not None  # for type checkers: opened with stdin=PIPE
        try:
            self.watchdog.stdin.write(f"{sign}{pgid}\n")
            self.watchdog.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def start(self, order: StartOrder, hb_root: Path, warm_root: Path | None = None) -> None:
        """Start the order's rank in its slot (not over a running one); with `warm_root`, a group
        that restarts warm gets its ranks of this attempt a directory of this node's under it
        (SLURMGEN_WARM_DIR), where they wait for the new world after a peer's failure."""
        slot = self.slots[order.worker]
        if slot.running:
            return
        run_dir = self.log_dir / order.group / f"attempt-{order.attempt}"
        hb_dir = hb_root / f"{order.group}-{order.attempt}"
        private_dirs(run_dir, self.log_dir)
        private_dirs(hb_dir, hb_root)
        env = {**os.environ, **order.env, envvars.HEARTBEAT_DIR: str(hb_dir)}
        slot.warm_dir = warm_dir(warm_root, order.group, order.attempt) if order.warm and warm_root else None
        if slot.warm_dir is not None:
            env[envvars.WARM_DIR] = str(slot.warm_dir)
        ranks_here = int(env.get("LOCAL_WORLD_SIZE") or 1)
        threads = default_omp_threads(env, ranks_here, ranks_here)
        if threads is not None:
            env["OMP_NUM_THREADS"] = threads
        slot.order, slot.exit_code, slot.kill_at, slot.proc, slot.runs, slot.stack = order, None, None, None, [], None
        slot.hb_file = hb_dir / (files.HEARTBEAT_NAME % order.rank)
        slot.timeline = TimelineWriter.from_env(order.rank, env)
        log = open(os.open(run_dir / f"rank-{order.rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")  # noqa: SIM115  (held past this line: a child's output or a writer kept open)
        os.fchmod(log.fileno(), 0o600)  # a file an older agent made 0644 becomes private too
        at = time.time()
        slot.in_spare, spare = False, self.spares.get((order.group, order.attempt), (None, 0))[0]
        try:
            slot.proc = self._process(order, env)
            slot.in_spare = bool(order.generation) and spare is not None and slot.proc is spare
        except OSError as e:
            message = f"slurmgen agent: cannot start {order.argv[0]!r}: {e.strerror or e}"
            log.write(message.encode() + b"\n")
            log.close()
            self._line(order, message)
            slot.proc, slot.exit_code = None, exitcodes.NOT_FOUND
            slot.ended(exitcodes.NOT_FOUND)
            self.wake.set()
            return
        self._tell_watchdog("+", slot.proc.pid)
        slot.started(at)
        threading.Thread(target=self._follow, args=(slot, slot.proc, order, log), daemon=True).start()

    def _process(self, order: StartOrder, env: dict[str, str]) -> subprocess.Popen:
        """The rank's process: when a warm restart starts it anew, the attempt's warm spare on this
        node if one is ready (promoted: no interpreter start, no `import torch`), else a new one;
        a warm group's Python program gets a spare beside it (again, once one was promoted).
        Raises OSError when the program cannot be started."""
        proc = self._promote(order) if order.generation else None
        if proc is None:
            proc = subprocess.Popen(
                order.argv,
                cwd=order.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=self.hook,
            )
        if order.warm and (order.group, order.attempt) not in self.spares and runs_python(order.argv):
            self._spare(order, env)
        return proc

    def _spare(self, order: StartOrder, env: dict[str, str]) -> None:
        """Start the attempt's warm spare on this node (slurmgen/train/spare.py: the program's
        Python with torch imported, idle until its orders' pipe gives it a rank). Best effort: a
        spare that cannot start leaves the fresh process to a warm restart."""
        read, write = os.pipe()
        try:
            proc = subprocess.Popen(
                [order.argv[0], "-m", "slurmgen.train.spare", str(read), *order.argv[1:]],
                cwd=order.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=self.hook,
                pass_fds=(read,),
            )
        except OSError:
            os.close(write)
            return
        finally:
            os.close(read)
        self.spares[(order.group, order.attempt)] = (proc, write)
        self._tell_watchdog("+", proc.pid)

    def _promote(self, order: StartOrder) -> subprocess.Popen | None:
        """Give the order's rank to the attempt's spare (its line: RANK LOCAL_RANK GENERATION
        MASTER_ADDR MASTER_PORT WORLD_SIZE); None when there is none alive to take it."""
        spare = self.spares.pop((order.group, order.attempt), None)
        if spare is None:
            return None
        proc, orders = spare
        e = order.env
        line = f"{order.rank} {e.get('LOCAL_RANK', '0')} {order.generation} {e['MASTER_ADDR']} {e['MASTER_PORT']}"
        try:
            if proc.poll() is None:
                os.write(orders, f"{line} {e['WORLD_SIZE']}\n".encode())
                return proc
        except OSError:
            pass
        finally:
            os.close(orders)
        self._end_spare(proc)
        return None

    def keep_spares(self, runs: AbstractSet[tuple[str, int]]) -> None:
        """Stop the spares of attempts the server no longer runs on this node (AgentOrders.warm):
        an idle spare has nothing to lose, so it is killed at once."""
        for key in [k for k in self.spares if k not in runs]:
            proc, orders = self.spares.pop(key)
            os.close(orders)
            self._end_spare(proc)

    def _end_spare(self, proc: subprocess.Popen) -> None:
        """Kill an unused spare (it may still be importing torch, before it reads its orders) and
        reap it, so no idle process of an ended attempt is left on the node."""
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        self._tell_watchdog("-", proc.pid)

    def take_stack(self, idx: int) -> None:
        """The Python stack of the slot's rank, which the server judged hung, before it is stopped
        (StopOrder.stack), once per run: its frames go into the slot's reports, the whole dump
        into the rank's lines (the group's logs on the page and `slurmgen logs`)."""
        slot = self.slots[idx]
        if (
            slot.stack is not None
            or not slot.running
            or slot.order is None
            or slot.hb_file is None
            or slot.proc is None
        ):
            return
        frames, dump = stacks.take(slot.hb_file, slot.order.rank, slot.proc.pid)
        slot.stack = frames
        for text in dump.splitlines():
            self._line(slot.order, text)

    def _line(self, order: StartOrder, text: str) -> None:
        self.output.put(
            ReportedLine(
                worker=order.worker,
                group=order.group,
                attempt=order.attempt,
                rank=order.rank,
                time=time.time(),
                line=text[:MAX_LINE],
            )
        )

    def _follow(self, slot: Slot, proc: subprocess.Popen, order: StartOrder, log) -> None:
        """Wait for the rank; then clear its process group (what it forked goes with it, and
        the pipe closes) and report the exit once its last lines are queued."""
        reader = threading.Thread(target=self._copy, args=(proc, order, log), daemon=True)
        reader.start()
        code = exit_status(proc.wait())
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        self._tell_watchdog("-", proc.pid)
        reader.join(2)
        if slot.proc is proc:
            slot.ended(code)
            slot.exit_code = code
        self.wake.set()

    def _copy(self, proc: subprocess.Popen, order: StartOrder, log) -> None:
        assert proc.stdout is not None  # for type checkers: started with stdout=PIPE
        with log:
            for n, raw in enumerate(proc.stdout):
                if n == 0 and raw.startswith(protocol.SPARE_TAG.encode()):
                    continue  # a promoted spare's word that it took the rank: not the program's output
                log.write(raw)
                log.flush()
                self._line(order, raw.decode(errors="replace").rstrip("\n"))

    def stop(self, idx: int, grace: float) -> None:
        slot = self.slots[idx]
        if slot.running and slot.kill_at is None:
            self._signal(slot, signal.SIGTERM)
            slot.kill_at = time.monotonic() + grace

    def enforce_grace(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.running and slot.kill_at is not None and now >= slot.kill_at:
                self._signal(slot, signal.SIGKILL)

    def _signal(self, slot: Slot, sig: int) -> None:
        assert slot.proc is not None  # for type checkers: only a running slot is signalled
        with contextlib.suppress(OSError):
            os.killpg(slot.proc.pid, sig)

    def stop_all(self, grace: float) -> None:
        self.keep_spares(set())
        for slot in self.slots:
            self.stop(slot.idx, grace)
        deadline = time.monotonic() + grace + 1
        while any(s.running for s in self.slots) and time.monotonic() < deadline:
            self.enforce_grace()
            time.sleep(0.05)
        assert self.watchdog.stdin is not None  # for type checkers: opened with stdin=PIPE
        self.watchdog.stdin.close()
        self.watchdog.wait(5)
