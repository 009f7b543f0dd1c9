"""The throwaway test cluster (Slurm + sshd in network namespaces) as a pytest fixture.

``cluster`` (session scope) runs ``scripts/cluster/up.sh N`` once, yields a :class:`Cluster`,
and always runs ``scripts/cluster/down.sh`` at the end. N is ``$SLURMGEN_TEST_NODES`` (default
3: most tests use two nodes, a hot spare's test a third; at most 8). Not root, commands missing
or namespaces refused: the tests skip, naming what is missing (under CI=true that skip is a
failure, see tests/conftest.py).

Jobs are submitted with the environment of this process plus ``SLURM_CONF``, a ``PATH`` that
starts with the directory of ``sys.executable`` and a ``TMPDIR`` in pytest's temp tree: sbatch
exports it, the generated scripts use ``srun --export=ALL``, so ``python`` inside a job is this
venv's python.

Fixture API (see :class:`Cluster`): ``nodes`` (name, ip, netns), ``slurm_conf``, ``ssh_key``,
``known_hosts``, ``ssh_config``, ``ssh_user``, ``gpus_per_node``, ``accounting`` (sacct
answers); ``run(argv)`` (a Slurm command), ``submit(script, cwd) -> job id``,
``wait(job, timeout) -> (state, exit code)``,
``wait_state``, ``job_info``, ``cancel``, ``signal``; ``run_on(node, argv)`` inside a node;
``pids_on(node)``, ``job_pids(job)``, ``wait_no_tasks(job) -> survivors``; ``ssh_client(node)``.

Other environment knobs:
  SLURMGEN_CLUSTER_REUSE=1  use a cluster already brought up by hand (up.sh); do not tear down
  SLURMGEN_CLUSTER_WAIT     seconds to wait while another live test session owns the cluster
                            (default 300)
  SLURMGEN_CLUSTER_LOGS     directory to keep the daemons' logs in after tear-down
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "cluster"
UP_TIMEOUT = 120
DOWN_TIMEOUT = 60
POLL = 0.25
# Job states after which a job will not change again (unless requeued, which shows PENDING).
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
    }
)
# Commands the cluster needs, with the Debian package that ships each (for the skip reason).
REQUIRED_COMMANDS = {
    "ip": "iproute2",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "mknod": "coreutils",
    "munged": "munge",
    "mungekey": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    "srun": "slurm-client",
    "sinfo": "slurm-client",
    "scontrol": "slurm-client",
    "scancel": "slurm-client",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "/usr/sbin/sshd": "openssh-server",
}
# Accounting (slurmdbd on MariaDB, so that sacct answers); SLURMGEN_CLUSTER_ACCOUNTING=0 goes without.
ACCOUNTING_COMMANDS = {"mariadbd": "mariadb-server", "slurmdbd": "slurmdbd", "sacctmgr": "slurm-client"}


@dataclass(frozen=True)
class Node:
    name: str
    ip: str
    netns: str
    slurmd_pid: int
    sshd_pid: int


@dataclass(frozen=True)
class Proc:
    """A process found inside a node's network namespace."""

    node: str
    pid: int
    cmdline: str
    job_id: str | None  # SLURM_JOB_ID from its environment, or from "slurmstepd: [ID.step]"


@dataclass
class Cluster:
    state_dir: Path
    slurm_conf: Path
    nodes: list[Node]
    ssh_key: Path
    known_hosts: Path
    ssh_config: Path
    ssh_user: str
    gpus_per_node: int
    cpus_per_node: int
    controller_ip: str
    accounting: bool  # slurmdbd records jobs and steps: sacct answers
    # Extra variables for every command and job (SLURM_CONF, PATH with this venv first).
    base_env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, state_dir: Path, job_tmp: Path | None = None) -> Cluster:
        facts = json.loads((state_dir / "cluster.json").read_text())
        venv_bin = os.path.dirname(sys.executable)  # not resolved: keep the venv's own bin
        path = os.environ.get("PATH", "/usr/bin:/bin")
        return cls(
            state_dir=state_dir,
            slurm_conf=Path(facts["slurm_conf"]),
            nodes=[
                # An SSH-only node (beyond the 8th) has no slurmd: its sshd holds the namespaces.
                Node(n["name"], n["ip"], n["netns"], int(n["slurmd_pid"] or n["sshd_pid"]), int(n["sshd_pid"]))
                for n in facts["nodes"]
            ],
            ssh_key=Path(facts["ssh"]["key"]),
            known_hosts=Path(facts["ssh"]["known_hosts"]),
            ssh_config=Path(facts["ssh"]["config"]),
            ssh_user=facts["ssh"]["user"],
            gpus_per_node=int(facts["gpus_per_node"]),
            cpus_per_node=int(facts["cpus_per_node"]),
            controller_ip=facts["controller"]["ip"],
            accounting=bool(facts.get("accounting")),
            base_env={
                "SLURM_CONF": facts["slurm_conf"],
                "PATH": venv_bin + os.pathsep + path,
                "SLURMGEN_SSH_KEY": facts["ssh"]["key"],
                "SLURMGEN_KNOWN_HOSTS": facts["ssh"]["known_hosts"],
                "SLURMGEN_SSH_USER": facts["ssh"]["user"],
                "SLURMGEN_CLUSTER_NODES": ",".join(n["name"] for n in facts["nodes"]),
                # Jobs inherit it: torchrun's torchelastic_* directories and the like land
                # in pytest's temp tree (pruned by pytest) instead of piling up in /tmp.
                **({"TMPDIR": str(job_tmp)} if job_tmp else {}),
            },
        )

    # --- names -----------------------------------------------------------------------------
    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def node(self, name: str | Node) -> Node:
        if isinstance(name, Node):
            return name
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r} in the test cluster (have {self.node_names})")

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment plus SLURM_CONF, the venv's PATH and ``extra``."""
        env = dict(os.environ)
        env.update(self.base_env)
        env.update(extra or {})
        return env

    # --- Slurm ------------------------------------------------------------------------------
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 30,
        check: bool = True,
        cwd: str | Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command (e.g. srun, sinfo) in the root namespace with the cluster's env."""
        proc = subprocess.run(
            list(argv),
            cwd=cwd,
            env=self.env(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def submit(
        self,
        script_path: str | Path,
        cwd: str | Path,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> str:
        """sbatch --parsable the script from ``cwd``; return the job id."""
        proc = self.run(["sbatch", "--parsable", *args, str(script_path)], cwd=cwd, env=env, timeout=30)
        job_id = proc.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise AssertionError(f"sbatch printed no job id: {proc.stdout!r} {proc.stderr!r}")
        return job_id

    def job_info(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o ID`` as a dict (values may contain spaces)."""
        proc = self.run(["scontrol", "show", "job", "-o", str(job_id)], timeout=15, check=False)
        if proc.returncode != 0:
            raise AssertionError(f"scontrol show job {job_id}: {proc.stderr.strip()}")
        line = proc.stdout.strip()
        # Split before every " Key=" so values with spaces (Reason, Command) stay whole.
        parts = re.split(r" (?=[A-Za-z][A-Za-z0-9:/_]*=)", line)
        info: dict[str, str] = {}
        for part in parts:
            key, _, value = part.partition("=")
            info.setdefault(key, value)
        return info

    def wait(self, job_id: str, timeout: float = 60) -> tuple[str, int]:
        """Poll every 0.25 s until the job ends; return (state, exit code).

        Not ``sbatch --wait``: it polls at 2, 8, then 32 s. On timeout the job is cancelled
        and the error shows its last state and the tail of its output.
        """
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while True:
            info = self.job_info(job_id)
            state = info.get("JobState", "")
            if state in TERMINAL_STATES:
                code = info.get("ExitCode", "0:0").split(":")[0]
                return state, int(code) if code.isdigit() else -1
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL)
        self.cancel(job_id)
        raise TimeoutError(
            f"job {job_id} still {info.get('JobState')} ({info.get('Reason')}) after {timeout}s; "
            f"cancelled it.\n{self.output_tail(info)}"
        )

    def output_tail(self, info: Mapping[str, str], lines: int = 40) -> str:
        out = info.get("StdOut")
        if not out or not os.path.exists(out):
            return f"(no output file: {out})"
        text = Path(out).read_text(errors="replace").splitlines()[-lines:]
        return f"--- tail of {out} ---\n" + "\n".join(text)

    def cancel(self, job_id: str) -> None:
        self.run(["scancel", str(job_id)], timeout=15, check=False)

    def signal(self, job_id: str, sig: str = "USR1", *, batch_only: bool = False) -> None:
        """Send a signal to the job's steps (or, with batch_only, to its batch shell only)."""
        args = ["scancel", f"--signal={sig}", *(["--batch"] if batch_only else []), str(job_id)]
        self.run(args, timeout=15)

    def wait_state(self, job_id: str, states: set[str] | frozenset[str], timeout: float = 30) -> str:
        """Poll until the job's state is one of ``states`` (e.g. {"RUNNING"}); return it."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job_info(job_id)
            state = info.get("JobState", "")
            if state in states:
                return state
            if state in TERMINAL_STATES or time.monotonic() >= deadline:
                raise AssertionError(f"job {job_id} is {state}, waited for {sorted(states)}\n{self.output_tail(info)}")
            time.sleep(POLL)

    # --- inside the nodes -------------------------------------------------------------------
    def run_on(
        self,
        node: str | Node,
        argv: Sequence[str],
        *,
        timeout: float = 30,
        check: bool = False,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run argv inside a node: its network namespace and its hostname (UTS namespace)."""
        n = self.node(node)
        cmd = [
            "nsenter",
            f"--net=/run/netns/{n.netns}",
            f"--uts=/proc/{n.slurmd_pid}/ns/uts",
            "--",
            *argv,
        ]
        proc = subprocess.run(
            cmd,
            cwd=cwd,
            env=self.env(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"on {n.name}: {' '.join(argv)} exited {proc.returncode}\n{proc.stderr}")
        return proc

    def pids_on(self, node: str | Node) -> list[Proc]:
        """Every process in the node's namespace except its slurmd and sshd listener.

        That is: slurmstepd, job tasks, ssh sessions and whatever they started.
        """
        n = self.node(node)
        out = subprocess.run(["ip", "netns", "pids", n.netns], capture_output=True, text=True, timeout=10).stdout
        procs = []
        for word in out.split():
            pid = int(word)
            if pid in (n.slurmd_pid, n.sshd_pid):
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:  # exited meanwhile
                continue
            text = cmdline.decode(errors="replace").strip()
            job_id = None
            for var in environ:
                if var.startswith(b"SLURM_JOB_ID="):
                    job_id = var.split(b"=", 1)[1].decode()
            m = re.match(r"slurmstepd: \[(\d+)\.", text)
            if m:
                job_id = m.group(1)
            procs.append(Proc(n.name, pid, text, job_id))
        return procs

    def job_pids(self, job_id: str | None = None) -> list[Proc]:
        """Processes of a job (or, with None, every non-daemon process) on all nodes."""
        found = []
        for n in self.nodes:
            found += [p for p in self.pids_on(n) if job_id is None or p.job_id == str(job_id)]
        return found

    def wait_no_tasks(self, job_id: str | None = None, timeout: float = 15) -> list[Proc]:
        """Poll until no process of the job survives on any node; return the survivors."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.job_pids(job_id)
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(POLL)

    # --- ssh ------------------------------------------------------------------------------------
    def ssh_client(self, node: str | Node, known_hosts: str | Path | None = None, timeout: float = 10):
        """A connected paramiko client: our key, our known_hosts, RejectPolicy (no TOFU)."""
        import paramiko  # only the tests that use ssh pay for the import

        n = self.node(node)
        client = paramiko.SSHClient()
        client.load_host_keys(str(known_hosts or self.known_hosts))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                n.name,
                username=self.ssh_user,
                key_filename=str(self.ssh_key),
                look_for_keys=False,
                allow_agent=False,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
            )
        except BaseException:
            client.close()
            raise
        return client


# --- fixture -------------------------------------------------------------------------------------
def _state_dir() -> Path:
    return Path(os.environ.get("SLURMGEN_CLUSTER_DIR", "/tmp/slurmgen-cluster"))


def unavailable_reason() -> str | None:
    """Why this machine cannot host the test cluster, or None if it looks able to."""
    if sys.platform != "linux":
        return f"the test cluster needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "the test cluster needs root (network namespaces, slurmd, sshd); run as uid 0"
    needed = {
        **REQUIRED_COMMANDS,
        **(ACCOUNTING_COMMANDS if os.environ.get("SLURMGEN_CLUSTER_ACCOUNTING") != "0" else {}),
    }
    missing = [f"{cmd} ({pkg})" for cmd, pkg in needed.items() if not shutil.which(cmd)]
    if missing:
        return (
            "the test cluster needs these commands (Debian package): "
            + ", ".join(missing)
            + "; `bash scripts/setup.sh --test` installs them"
        )
    return None


def _run_script(name: str, *args: str, env: Mapping[str, str], timeout: float):
    return subprocess.run(
        ["bash", str(SCRIPTS / name), *args],
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _down(env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return _run_script("down.sh", env=env, timeout=DOWN_TIMEOUT)


def _up(nodes: int, env: Mapping[str, str]) -> None:
    """Run up.sh; skip on exit 3 (machine cannot host it), wait on exit 4 (busy)."""
    deadline = time.monotonic() + float(os.environ.get("SLURMGEN_CLUSTER_WAIT", "300"))
    while True:
        try:
            proc = _run_script("up.sh", str(nodes), env=env, timeout=UP_TIMEOUT)
        except subprocess.TimeoutExpired as exc:
            _down(env)  # up.sh was killed before its own clean-up could run
            pytest.fail(f"scripts/cluster/up.sh {nodes} took over {UP_TIMEOUT}s\n{exc.stderr}")
        if proc.returncode == 0:
            return
        if proc.returncode == 3:
            lines = [ln for ln in proc.stderr.splitlines() if "unavailable:" in ln]
            pytest.skip(lines[-1] if lines else proc.stderr.strip()[-500:])
        if proc.returncode == 4 and time.monotonic() < deadline:
            time.sleep(2)
            continue
        pytest.fail(
            f"scripts/cluster/up.sh {nodes} exited {proc.returncode}\n{proc.stderr[-6000:]}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    state_dir = _state_dir()
    if os.environ.get("SLURMGEN_CLUSTER_REUSE") == "1":
        if not (state_dir / "cluster.json").exists():
            pytest.fail(f"SLURMGEN_CLUSTER_REUSE=1 but no cluster in {state_dir}: run up.sh first")
        yield Cluster.load(state_dir, tmp_path_factory.mktemp("job-tmp"))
        return
    nodes = int(os.environ.get("SLURMGEN_TEST_NODES", "3"))
    logs = os.environ.get("SLURMGEN_CLUSTER_LOGS") or str(tmp_path_factory.mktemp("cluster-logs"))
    env = {
        "SLURMGEN_CLUSTER_DIR": str(state_dir),
        # Marks the cluster as ours: a second test session waits instead of tearing it down.
        "SLURMGEN_CLUSTER_OWNER": str(os.getpid()),
        "SLURMGEN_CLUSTER_SAVE_LOGS": logs,
    }
    _up(nodes, env)
    try:
        yield Cluster.load(state_dir, tmp_path_factory.mktemp("job-tmp"))
    finally:
        proc = _down(env)
        if proc.returncode != 0:
            pytest.fail(f"scripts/cluster/down.sh failed:\n{proc.stderr}", pytrace=False)
