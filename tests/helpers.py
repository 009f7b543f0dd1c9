"""What several test modules share: one module, imported as `helpers` (tests/ is on
pytest's pythonpath). No test module imports another."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
from pathlib import Path

import httpx
import pytest

from slurmgen.cli import main
from slurmgen.generate.output import write_files
from slurmgen.generate.render import SLURM_SCRIPT, render
from slurmgen.generate.specfile import build_spec
from slurmgen.generate.topology import Host
from slurmgen.launch.fanout import Launcher
from slurmgen.launch.plan import build_plan
from slurmgen.ssh.connect import SSHOptions


# --- The CLI in-process -----------------------------------------------------------------------
def run(capsys, *args):
    """`slurmgen ARGS` in-process: (exit code, stdout, stderr). main() must end in SystemExit."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


# --- Values awkward to quote ------------------------------------------------------------------
ODD_ARGUMENTS = [
    "~/data",
    "~",
    "~user/x",
    "~/a b",
    "trailing\\",
    "back\\slash",
    "\\\\",
    "it's\\",
    "\\'",
    "'\\''",
    "a=b",
    "--lr=3e-4",
    "=",
    "==",
    "=x",
    "x,y",
    ",",
    "{a,b}",
    "a*b",
    "[0]=1",
    "!x",
    "a!",
    "#x",
    "a#b",
    "%s",
    "-",
    "--",
    "@x",
    "^x",
    "x|y",
    "(x)",
    "<x",
    ";",
    "\t",
    " ",
    "é",
    "\\n",
    "$",
    "${x}",
    "?",
]


# --- A progress bar as a rank's log holds it ---------------------------------------------------
def tqdm_bar() -> str:
    """What a program's stderr gets from a 4-step tqdm bar (Lightning's and transformers' bars are
    tqdm's), a warning issued at step 2: each update is redrawn after a "\r", the line ends only when
    the bar closes, and the warning lands on the bar's line after its last update, as on a terminal."""
    import warnings

    from tqdm import tqdm

    out = io.StringIO()
    bar = tqdm(total=4, file=out, mininterval=0, ncols=60, desc="Epoch 0")
    bar.update(2)
    out.write(warnings.formatwarning("lr is large", UserWarning, "prog.py", 12, "warnings.warn('lr is large')"))
    bar.update(2)
    bar.close()
    return out.getvalue()


def srun_label(task: int, text: str) -> str:
    """`srun --label`: the task's number before each of its lines (lines end at a newline only)."""
    return "".join(f"{task}: {line}\n" for line in text.split("\n")[:-1])


# --- Rendering with the real CLI --------------------------------------------------------------
def render_and_lint(out: Path, *args: str, command: list[str]) -> Path:
    """`slurmgen create ARGS -o OUT -- COMMAND`; every rendered script must pass shellcheck (issue 3, test 5)."""
    proc = subprocess.run(
        [sys.executable, "-m", "slurmgen", "create", *args, "-o", str(out), "--", *command],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, f"slurmgen create failed:\n{proc.stdout}\n{proc.stderr}"
    scripts = sorted(out.glob("*.sh"))
    assert [s.name for s in scripts] == ["launch_multi_node.sh", "run_slurm.sh"]
    lint = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, f"shellcheck on rendered scripts:\n{lint.stdout}{lint.stderr}"
    return out


# --- Processes, ports and environments --------------------------------------------------------
# Set by a launcher (or by a test's fault hook); a child must get only what the test gives it.
LAUNCH_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "SLURMGEN_BACKEND",
    "SLURMGEN_REQUEUE",
    "SLURMGEN_TRAIN_SPAWNED",
    "SLURMGEN_TRAIN_FAULT",
)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without launcher and SLURM_* variables, unbuffered, plus EXTRA."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith("SLURM_")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def communicate_in_session(p: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """(stdout, stderr) of a process started with start_new_session=True; afterwards, and on
    a timeout, its whole session is killed so nothing it spawned outlives the test."""
    try:
        return p.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


# --- slurmgen launch with every host on this machine ------------------------------------------
PY = sys.executable


class LocalProcess:
    def __init__(self, command: str, stdin: bytes, env: dict[str, str] | None = None):
        self.popen = subprocess.Popen(
            ["bash", "-c", command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        assert self.popen.stdin is not None
        self.popen.stdin.write(stdin)
        self.popen.stdin.flush()

    def read(self) -> bytes:
        assert self.popen.stdout is not None
        return os.read(self.popen.stdout.fileno(), 65536)

    def read_stderr(self) -> bytes:
        assert self.popen.stderr is not None
        return os.read(self.popen.stderr.fileno(), 65536)

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError):
            self.popen.stdin.close()  # type: ignore[union-attr]

    def send(self, data: bytes) -> None:
        try:
            self.popen.stdin.write(data)  # type: ignore[union-attr]
            self.popen.stdin.flush()  # type: ignore[union-attr]
        except (OSError, ValueError):  # closed: nothing more to say
            pass

    def exit_status(self) -> int | None:
        return self.popen.wait()

    def close(self) -> None:
        self.kill()

    def kill(self) -> None:
        """Stop the node as the launcher would (end of stdin), so the bootstrap removes its
        temporary directory; SIGKILL whatever is left after 3 s."""
        self.close_stdin()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=3)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)


class LocalConnection:
    """Quacks like slurmgen.ssh.connect.Connection; every host is this machine."""

    def __init__(self, alias: str, env: dict[str, str] | None = None):
        self.alias, self.env = alias, env
        self.procs: list[LocalProcess] = []
        self.active = True

    def start(self, command: str, stdin: bytes, timeout: float = 10.0, separate_stderr: bool = True) -> LocalProcess:
        proc = LocalProcess(command, stdin, self.env)
        self.procs.append(proc)
        return proc

    def is_active(self) -> bool:
        return self.active

    def start_keepalive(self, interval: float) -> None:
        pass

    def silent_for(self, interval: float) -> float:
        return 0.0

    def close(self) -> None:
        self.active = False


def local_connector(made: dict[str, LocalConnection] | None = None, env: dict[str, str] | None = None):
    made = made if made is not None else {}

    def connector(hosts, opts, notify=None):
        conns = {h: LocalConnection(h, env) for h in hosts}
        made.update(conns)
        return conns

    return connector


def local_plan(tmp_path: Path, command: list[str], slots=(2,), **kwargs):
    """A plan whose 'hosts' h0, h1, ... all run here, with the logs in tmp_path/out/logs.

    Its MASTER_PORT is a free one unless the spec gives one: tests run side by side (pytest-xdist,
    scripts/test.sh) and two rendezvous on the default 29500 would take each other's store."""
    spec = build_spec(
        {
            "command": command,
            "backend": "gloo",
            "log_dir": str(tmp_path / "out" / "logs"),
            "master_port": free_port(),
            **kwargs.pop("spec", {}),
        }
    )
    hosts = [Host.with_count(f"h{i}", n) for i, n in enumerate(slots)]
    return build_plan(spec, hosts, master_addr="127.0.0.1", workdir=str(tmp_path), **kwargs)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def still_running(pids, grace: float = 2.0) -> list[int]:
    """The processes of `pids` still alive `grace` seconds from now (sooner when none is). A rank
    SIGKILLed with its group outlives its subshell, the group's leader the node script waits for,
    while the kernel frees its memory (tens of ms for a process that imported torch, more under
    load): checked at once, such a dying process would be taken for one left running."""
    pids = list(pids)
    deadline = time.monotonic() + grace
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


# --- Generated scripts run for real (srun and scontrol stand-ins) -----------------------------
HOSTILE = [
    "it's",
    'say "hi"',
    "$(touch /tmp/slurmgen-pwned)",
    "`touch /tmp/slurmgen-pwned`",
    "a b  c",
    "line1\nline2",
    "# not a comment",
    "$HOME",
    "back\\slash",
    "semi;colon && true",
    "*",
    "",
    *ODD_ARGUMENTS,
]


# Prints its argv and selected environment as one JSON line.
# One write per line: parallel tasks share a stdout, and print() under PYTHONUNBUFFERED writes
# the text and its newline separately, so two reports could land on one line.
REPORTER = [
    "python3",
    "-c",
    "import json,os,sys; sys.stdout.write('REPORT ' + json.dumps({'argv': sys.argv[1:], "
    "'env': {k: os.environ.get(k) for k in ['HOSTILE', 'RANK', 'LOCAL_RANK', 'NODE_RANK', 'WORLD_SIZE', "
    "'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'SLURMGEN_BACKEND']}}) + '\\n')",
]


def reports(text):
    return [json.loads(line.split("REPORT ", 1)[1]) for line in text.splitlines() if "REPORT " in line]


def write(tmp_path, **values):
    spec = build_spec({"output_dir": str(tmp_path / "out"), **values})
    write_files(Path(spec.output_dir), render(spec).files, force=True, extra_dirs=[Path(spec.logs)])
    return Path(spec.output_dir)


FAKE_SRUN = textwrap.dedent("""\
    #!/usr/bin/env bash
    # Stand-in for srun inside a batch job: runs every task locally with its SLURM_* identity.
    set -u
    per_node=1 count=$SLURM_JOB_NUM_NODES names=()
    while [[ $1 == -* ]]; do
      case $1 in
        --ntasks-per-node=*) per_node=${1#*=} ;;
        --nodelist=*) IFS=, read -ra names <<<"${1#*=}"; count=${#names[@]} ;;  # a step on these nodes
      esac
      shift
    done
    pids=()
    for ((n = 0; n < count; n++)); do
      for ((l = 0; l < per_node; l++)); do
        SLURM_PROCID=$((n * per_node + l)) SLURM_LOCALID=$l SLURM_NODEID=$n SLURMD_NODENAME=${names[n]:-} \\
          SLURM_NTASKS=$((count * per_node)) "$@" &
        pids+=($!)
      done
    done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    exit $rc
""")


@pytest.fixture
def fake_slurm(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "scontrol").write_text("#!/usr/bin/env bash\nprintf '%s\\n' ${FAKE_HOSTS}\n")
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IEXEC)

    def run(out, hosts="localhost other", nodes=2, job_id="4242", env=None):
        env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "FAKE_HOSTS": hosts,
            "SLURM_JOB_ID": job_id,
            "SLURM_JOB_NODELIST": "whatever",
            "SLURM_JOB_NUM_NODES": str(nodes),
            **(env or {}),
        }
        return subprocess.run(["bash", str(out / SLURM_SCRIPT)], capture_output=True, text=True, timeout=60, env=env)

    return run


# --- A login node of --remote on this machine -------------------------------------------------
class LoginNode:
    """jobs/remote.py's RemoteRunner without SSH: each command line it would send (the --remote-setup
    lines, cd, the quoted argv) run by sh in `home`, as the login node's shell runs it, and kept in
    `lines`; `opened` holds the (alias, ssh config, setup) of every connection made."""

    home: Path
    lines: list[str]
    opened: list[tuple]

    def __init__(self, alias, ssh_config=None, setup=()):
        from slurmgen.jobs.slurm_runner import shell_line

        self.where, self.setup, self._line = alias, list(setup), shell_line
        type(self).opened.append((alias, ssh_config, list(setup)))

    def run(self, argv, *, cwd=None, stdin=b"", timeout=60):
        return self.run_shell(self._line(argv, cwd, self.setup), stdin=stdin, timeout=timeout)

    def run_shell(self, command, *, stdin=b"", timeout=60):
        from slurmgen.jobs.slurm_runner import Result

        type(self).lines.append(command)
        done = subprocess.run(["sh", "-c", command], cwd=self.home, input=stdin, capture_output=True, timeout=timeout)
        return Result(done.returncode, done.stdout.decode(), done.stderr.decode())

    def read(self, path, offset=0):
        from slurmgen.jobs.slurm_runner import read_from

        return read_from(open, str(self.home / path), offset, f" on {self.where}")

    def close(self):
        pass


@pytest.fixture
def login_node(tmp_path, monkeypatch):
    """`--remote ALIAS` reaches LoginNode (its home tmp_path/login) instead of an SSH server."""
    import slurmgen.jobs.remote

    home = tmp_path / "login"
    home.mkdir()
    node = type("Login", (LoginNode,), {"home": home, "lines": [], "opened": []})
    monkeypatch.setattr(slurmgen.jobs.remote, "RemoteRunner", node)
    return node


# --- The job commands against the test cluster ------------------------------------------------
# Each rank says who it is and what it got; rank 1 exits with $FAIL_CODE when it is set (the
# job's code is the first failing rank's even when srun kills the others: run_slurm.sh).
SAY = (
    'echo "rank $RANK of $WORLD_SIZE on $(hostname) port $MASTER_PORT args $*"; sleep "${NAP:-0}"; '
    'if [[ $RANK == 1 && -n ${FAIL_CODE:-} ]]; then exit "$FAIL_CODE"; fi'
)
COMMAND = ["--", "bash", "-c", SAY, "say"]


def sg(cluster, cwd: Path, *args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    # runs and plot read run records, create writes files: none of them has a registry
    registry = [] if args[0] in ("runs", "plot", "create") else ["--registry", str(cwd / "jobs.sqlite")]
    argv = [sys.executable, "-m", "slurmgen", args[0], *registry, *args[1:]]
    proc = subprocess.run(argv, cwd=cwd, env=cluster.env(env), capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"slurmgen {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}{_job_logs(cwd)}"
        )
    return proc


def _job_logs(cwd: Path, lines: int = 60) -> str:
    """The ends of the Slurm job logs under `cwd`: a failed job is then diagnosable from the test
    report alone (a CI run's temp dirs are gone when its report is read)."""
    tails = []
    for log in sorted(cwd.rglob("slurmgen-*.out"))[-3:]:
        text = log.read_text(errors="replace").splitlines()[-lines:]
        tails.append(f"\n--- {log.relative_to(cwd)} (last {len(text)} lines) ---\n" + "\n".join(text))
    return "".join(tails)


def remote_flags(cluster, *exports: str) -> list[str]:
    """The flags that make node1 the login node of `--remote` on the test cluster: its SSH session
    gets this session's Slurm, venv and TMPDIR (which an SSH session does not carry: torch's caches
    of the jobs it submits went to the node's /tmp and stayed there after the suite)."""
    setup = [
        f"SLURM_CONF={cluster.slurm_conf}",
        f"PATH={Path(sys.executable).parent}:$PATH",
        f"TMPDIR={tempfile.gettempdir()}",
        *exports,
    ]
    return ["--remote", "node1", "--ssh-config", str(cluster.ssh_config), "--remote-setup", "export " + " ".join(setup)]


def status(cluster, cwd: Path, job: str, *extra: str) -> dict:
    return json.loads(sg(cluster, cwd, "status", job, "--json", *extra).stdout)


def wait_status(cluster, cwd: Path, job: str, states: set[str], *extra: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        view = status(cluster, cwd, job, *extra)
        if view["state"] in states or time.monotonic() > deadline:
            assert view["state"] in states, view
            return view
        time.sleep(0.25)


# --- The launcher run on local hosts ----------------------------------------------------------
SLEEPER = textwrap.dedent("""
    import os, sys, time
    print("PID", os.getpid(), flush=True)
    fail = os.environ.get("FAIL_RANK")
    attempts = os.environ.get("FAIL_ATTEMPTS", "1").split(",")
    if fail is not None and os.environ["RANK"] == fail and os.environ.get("SLURMGEN_ATTEMPT") in attempts:
        time.sleep(float(os.environ.get("FAIL_AFTER", "0.5")))
        print("failing on purpose", flush=True)
        sys.exit(int(os.environ.get("FAIL_CODE", "7")))
    time.sleep(float(os.environ.get("RUN_FOR", "60")))
    print("done", flush=True)
""")


SURVIVORS: list[int] = []


def run_launcher(plan, env=None, connector=None, made=None, record=None):
    """Run the launcher on local 'hosts' (`record`: its run registry entry); rank processes still
    alive 2 s after it returned (before the clean-up kill) are left in SURVIVORS."""
    out, err = io.StringIO(), io.StringIO()
    made = made if made is not None else {}
    launcher = Launcher(
        plan,
        SSHOptions(),
        out=out,
        err=err,
        colour=False,
        connector=connector or local_connector(made, env),
        record=record,
    )
    SURVIVORS.clear()
    try:
        code = launcher.run()
        SURVIVORS.extend(still_running(pids(out.getvalue())))
    finally:
        kill_local_nodes(made)
        for p in SURVIVORS:
            os.kill(p, signal.SIGKILL)
    return code, out.getvalue(), err.getvalue()


def kill_local_nodes(made: dict[str, LocalConnection]) -> None:
    """Kill what every local "node" (local_connector) still runs: a failed test leaves no rank."""
    for conn in made.values():
        for proc in conn.procs:
            proc.kill()


def run_to_end(launcher, made: dict[str, LocalConnection]) -> int:
    """`launcher.run()` of a Launcher built by the test over local nodes, which are killed
    afterwards whatever happened."""
    try:
        return launcher.run()
    finally:
        kill_local_nodes(made)


@contextlib.contextmanager
def tmpfs(under: Path, size: str):
    """A tmpfs of `size` (mount's spelling: "30m") at under/disk, unmounted afterwards (every
    process the test started must be gone by then). Mounting needs root: the test skips without it
    (under CI a skip fails, see conftest)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (the full disk) needs root")
    mnt = under / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def recorded_launch(registry: Path, plan, program: str, **start):
    """`slurmgen launch` of `plan` (its env names the launch id) over local nodes, recorded into
    `registry` as the CLI records it (`start`: more arguments of LaunchRecord.start): (exit code,
    the Launcher)."""
    from slurmgen.launch.fanout import Launcher
    from slurmgen.launch.registry_entry import LaunchRecord
    from slurmgen.runs.model import Recorder
    from slurmgen.ssh.connect import SSHOptions

    record = LaunchRecord.start(Recorder(registry), plan, "exp", [PY, "-c", program], **start)
    made: dict = {}
    launcher = Launcher(
        plan,
        SSHOptions(),
        out=io.StringIO(),
        err=io.StringIO(),
        colour=False,
        record=record,
        connector=local_connector(made),
    )
    code = run_to_end(launcher, made)
    record.ended(code, False)
    return code, launcher


def pids(text):
    return [int(line.split("PID ")[1]) for line in text.splitlines() if "PID " in line]


# --- slurmgen launch over SSH on the test cluster ---------------------------------------------
def port() -> int:
    return random.randint(21000, 28999)


def base_args(cluster, workdir: Path) -> list[str]:
    # TMPDIR is not forwarded to remote ranks; without it torch's caches would land in /tmp.
    return [
        "--ssh-config",
        str(cluster.ssh_config),
        "--workdir",
        str(workdir),
        "--master-port",
        str(port()),
        "--backend",
        "gloo",
        "--connect-timeout",
        "5",
        "--env",
        f"TMPDIR={workdir}",
    ]


class Run:
    """A `slurmgen launch` subprocess whose output is read live, line by line, with times."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None):
        self.lines: list[tuple[float, str, str]] = []  # (time, stream, text)
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [PY, "-m", "slurmgen", "launch", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )  # no terminal: nothing may prompt
        self.readers = [
            threading.Thread(target=self._read, args=(s, n), daemon=True)
            for s, n in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))
        ]
        for r in self.readers:
            r.start()

    def _read(self, stream, name):
        for line in stream:
            self.lines.append((time.monotonic(), name, line.rstrip("\n")))

    def wait_for(self, pattern: str, timeout: float = 60) -> float:
        """Time at which a line matching `pattern` appeared (fails after `timeout`)."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, _, text in list(self.lines):
                if rx.search(text):
                    return t
            if self.proc.poll() is not None and all(not r.is_alive() for r in self.readers):
                break
            time.sleep(0.02)
        raise AssertionError(f"no line matching {pattern!r}:\n{self.text()}")

    def finish(self, timeout: float = 120) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"slurmgen launch still running after {timeout}s:\n{self.text()}") from None
        for r in self.readers:
            r.join(timeout=10)
        return code

    @property
    def out(self) -> str:
        return "\n".join(t for _, s, t in self.lines if s == "out")

    @property
    def err(self) -> str:
        return "\n".join(t for _, s, t in self.lines if s == "err")

    def text(self) -> str:
        return f"--- stdout ---\n{self.out[-6000:]}\n--- stderr ---\n{self.err[-4000:]}"


def assert_nodes_clean(cluster, timeout: float = 5):
    """Nothing but slurmd and the sshd listener left on any node (sessions included)."""
    left = cluster.wait_no_tasks(None, timeout=timeout)
    assert not left, [(p.node, p.pid, p.cmdline) for p in left]


# --- The coordinator on the test cluster ------------------------------------------------------
AGENT_TIMEOUT = 5.0


class Coord:
    """The server, the agents and an authenticated client, all torn down at the end."""

    def __init__(self, cluster, tmp_path):
        self.cluster, self.tmp = cluster, tmp_path
        self.port = free_port()
        self.url = f"http://{cluster.controller_ip}:{self.port}"
        self.server = self.start_server()
        self.token = (tmp_path / "token").read_text().strip()
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=10)
        # Two nodes whatever the cluster's size (SLURMGEN_TEST_NODES): the group of 4 is 2 x 2.
        self.agents = {n.name: self.start_agent(n) for n in cluster.nodes[:2]}

    def start_server(self) -> subprocess.Popen:
        proc = subprocess.Popen(
            [
                PY,
                "-m",
                "slurmgen",
                "serve",
                "--host",
                self.cluster.controller_ip,
                "--port",
                str(self.port),
                "--db",
                str(self.tmp / "c.db"),
                "--token-file",
                str(self.tmp / "token"),
                "--agent-timeout",
                str(AGENT_TIMEOUT),
            ],
            stdout=open(self.tmp / "serve.log", "a"),  # noqa: SIM115  (the server's output, held past this line)
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/api/health", timeout=1).status_code == 200:
                    return proc
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError("server did not come up:\n" + (self.tmp / "serve.log").read_text())

    def start_agent(self, node) -> subprocess.Popen:
        # nsenter execs the agent (no fork), so the Popen pid is the agent itself.
        argv = [
            "nsenter",
            f"--net=/run/netns/{node.netns}",
            f"--uts=/proc/{node.slurmd_pid}/ns/uts",
            "--",
            PY,
            "-m",
            "slurmgen",
            "agent",
            "--server",
            self.url,
            "--token-file",
            str(self.tmp / "token"),
            "--workers",
            "2",
            "--state-dir",
            str(self.tmp / "agents"),
            "--grace",
            "3",
        ]
        return subprocess.Popen(
            argv,
            env=self.cluster.env(),
            stdout=open(self.tmp / f"agent-{node.name}.log", "a"),
            stderr=subprocess.STDOUT,
        )

    def call(self, method, path, **kw):
        r = self.http.request(method, path, **kw)
        assert r.status_code < 400, f"{method} {path}: {r.status_code} {r.text}"
        return r.json() if r.content else None

    def group(self):
        return self.call("GET", "/api/groups/exp1")

    def wait(self, states, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            g = self.group()["group"]
            if g["state"] in states:
                return g
            time.sleep(0.2)
        raise AssertionError(f"group never reached {states}: {self.group()}\n{self.logs()}")

    def logs(self):
        return "\n".join(f"[{ln['rank']}] {ln['line']}" for ln in self.call("GET", "/api/groups/exp1/logs"))

    def rank_procs(self, marker):
        return [p for n in self.cluster.nodes for p in self.cluster.pids_on(n) if marker in p.cmdline]

    def form_group(self) -> list[str]:
        """Group exp1 of node1-0, node1-1, node2-0, node2-1, once all four workers are there."""
        names = [f"{n}-{i}" for n in ("node1", "node2") for i in (0, 1)]
        wait_for(lambda: sorted(w["name"] for w in self.call("GET", "/api/workers")) == names, 30, "4 workers")
        self.call("POST", "/api/groups", json={"name": "exp1"})
        self.call("POST", "/api/workers/move", json={"workers": names, "group": "exp1"})
        return names

    def run(self, *argv):
        self.call(
            "PUT",
            "/api/groups/exp1/config",
            json={"master": "node1", "backend": "gloo", "argv": list(argv), "stop_grace": 3},
        )
        return self.call("POST", "/api/groups/exp1/start")

    def close(self):
        for proc in [*self.agents.values(), self.server]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [*self.agents.values(), self.server]:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.http.close()


def wait_for(check, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


# --- Coordinator groups over real agents (tests/integration/web) -------------------------------
def wait_value(what, timeout: float, about: str):
    """What `what()` returns once it is truthy (polled every 0.1 s), or fail naming `about`."""
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, f"{about}: not within {timeout} s"
        time.sleep(0.1)
    return found


def train_steps(out: Path) -> list[int]:
    """The train steps the bundled trainer logged in its --out-dir so far."""
    try:
        text = (out / "metrics.jsonl").read_text()
    except OSError:
        return []
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [r["step"] for r in rows if r.get("split") == "train"]


def group_of_every_worker(coord, name: str) -> None:
    """A group `name` on the coordinator `coord` (the `serve` fixture's), with every agent's worker."""
    workers = [w["name"] for w in coord.api("GET", "/api/workers")[1]]
    assert coord.api("POST", "/api/groups", {"name": name})[0] == 201
    assert coord.api("POST", "/api/workers/move", {"workers": workers, "group": name})[0] == 200


def small_trainer(out: Path, steps: int) -> list[str]:
    """The bundled trainer, small and quick (an MLP, a step logged each step, a checkpoint every 20),
    for `steps` steps into --out-dir `out`: a group's argv."""
    train = [sys.executable, "-m", "slurmgen.train", "--model", "mlp", "--mlp-hidden", "16"]
    train += ["--synthetic-samples", "256", "--batch-size", "8", "--threads", "1", "--progress", "lines"]
    train += ["--log-every", "1", "--eval-iters", "1", "--save-every", "20", "--max-steps", str(steps)]
    return [*train, "--init-timeout", "60", "--out-dir", str(out)]


def processes_naming(marker: str) -> list[str]:
    """Every process (but this one) whose command line names `marker`: what a run left behind."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and int(pid) != os.getpid():
            found.append(f"{pid}: {cmdline}")
    return found


# --- The coordinator's API in-process ---------------------------------------------------------
TOKEN = "t0ken-for-tests"


AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def beat(api, host, *slots):
    workers = [s if isinstance(s, dict) else {"id": s, "state": "idle"} for s in slots]
    r = api.post("/api/agents/heartbeat", headers=AUTH, json={"host": host, "instance": host, "workers": workers})
    assert r.status_code == 200, r.text
    return r.json()


def setup_group(api, argv=("python", "train.py"), **config):
    beat(api, "gn6", 0, 1)
    beat(api, "gn7", 0, 1)
    assert api.post("/api/groups", headers=AUTH, json={"name": "exp1"}).status_code == 201
    moved = api.post(
        "/api/workers/move", headers=AUTH, json={"workers": ["gn6-0", "gn6-1", "gn7-0", "gn7-1"], "group": "exp1"}
    )
    assert moved.status_code == 200, moved.text
    r = api.put(
        "/api/groups/exp1/config", headers=AUTH, json={"master": "gn7", "backend": "gloo", "argv": list(argv), **config}
    )
    assert r.status_code == 200, r.text


def running(group, attempt, *ids):
    return [{"id": i, "state": "running", "group": group, "attempt": attempt, "pid": 100 + i} for i in ids]


# --- Real gloo ranks in fresh processes (torch imported only here) -----------------------------
# Workers must be module-level functions (they are pickled into the rank processes); each gets
# (rank, world_size, *args) after joining a process group through a file store in `tmp`.
GPT_SIZE = dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
# Ranks are forked from multiprocessing's fork server, which imports these once per session (and
# ends with it): every run_ranks still gets new processes that have run nothing, without each one
# importing torch, FSDP, DTensor and DCP again (3-4 s of CPU per rank, most of an FSDP test on 2 cores).
RANK_PRELOAD = [
    "torch",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "torch.distributed.checkpoint",
    "torch._dynamo",
    "fsspec",
    "slurmgen.train.fsdp",
    "slurmgen.train.checkpoint.sharded",
    "slurmgen.train.models",
    "slurmgen.cli",
    "httpx",
    "pytest",
]


def _entry(rank: int, world: int, tmp: str, environ: dict[str, str], fn, args) -> None:
    import torch
    import torch.distributed as tdist

    os.environ.clear()  # the caller's environment, as a spawned process would have it, not the fork server's
    os.environ.update(environ)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    out = Path(tmp) / f"result-{rank}.pt"
    tdist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world)
    try:
        torch.save({"ok": fn(rank, world, *args)}, out)
        tdist.barrier()
    except BaseException:
        torch.save({"error": traceback.format_exc()}, out)
        raise
    finally:
        tdist.destroy_process_group()


def run_ranks(world: int, tmp: str | os.PathLike, fn, *args) -> list:
    """fn's return value of every rank, in rank order; a rank's traceback fails the test."""
    import torch
    import torch.multiprocessing as mp

    tmp = Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    for stale in [tmp / "store", *tmp.glob("result-*.pt")]:
        stale.unlink(missing_ok=True)
    try:
        mp.set_forkserver_preload(RANK_PRELOAD)
        mp.start_processes(
            _entry,
            args=(world, str(tmp), dict(os.environ), fn, args),
            nprocs=world,
            join=True,
            start_method="forkserver",
        )
    except Exception:
        errors = [torch.load(p, weights_only=False).get("error") for p in sorted(tmp.glob("result-*.pt"))]
        raise AssertionError("\n".join(e for e in errors if e) or "a rank died") from None
    return [torch.load(tmp / f"result-{r}.pt", weights_only=False)["ok"] for r in range(world)]


# --- The fault matrix (docs/guides/faults.md) --------------------------------------------------
FAULTS_DOC = Path(__file__).resolve().parents[1] / "docs" / "guides" / "faults.md"
_NODE_ID = re.compile(r"`(tests/[\w/]+\.py::\w+)`")


def fault_matrix(doc: Path = FAULTS_DOC) -> list[tuple[str, list[str]]]:
    """Each row of the fault matrix: ("FAULT | LAUNCHER", the test node ids its last cell names)."""
    rows = []
    for line in doc.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] not in ("Fault", "---"):
            rows.append((f"{cells[0]} | {cells[1]}", _NODE_ID.findall(cells[5])))
    return rows
