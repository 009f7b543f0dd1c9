"""Local stand-ins for SSH connections: run the exact remote command and payload with bash here.

Shared by the launch unit tests: what sshd would do (run the command with the login shell,
pipe stdin, keep stderr, the event channel, apart from stdout) minus the network.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from slurmgen.generate.specfile import build_spec
from slurmgen.launch.plan import build_plan
from slurmgen.generate.topology import Host

PY = sys.executable


class LocalProcess:
    def __init__(self, command: str, stdin: bytes, env: dict[str, str] | None = None):
        self.popen = subprocess.Popen(["bash", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, start_new_session=True,
                                      env={**os.environ, **(env or {})})
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
        try:
            self.popen.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass

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
        try:
            self.popen.wait(timeout=3)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class LocalConnection:
    """Quacks like slurmgen.launch.ssh.connect.Connection; every host is this machine."""

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
    """A plan whose 'hosts' h0, h1, ... all run here, with the logs in tmp_path/out/logs."""
    spec = build_spec({"command": command, "backend": "gloo", "log_dir": str(tmp_path / "out" / "logs"),
                       **kwargs.pop("spec", {})})
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
