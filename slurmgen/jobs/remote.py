"""Slurm on a login node over SSH: one connection per command, the snapshot shipped once.

Uses the SSH code of `slurmgen launch` (keys, agent, ~/.ssh/config, ProxyJump, known_hosts);
paramiko is imported only when a command is given --remote.
"""

from __future__ import annotations

import secrets
import shlex
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from slurmgen.contract.exitcodes import FAILED
from slurmgen.errors import SlurmgenError
from slurmgen.jobs.slurm_runner import Result, Unanswered, read_from, shell_line
from slurmgen.jobs.snapshot import CodeSnapshot

if TYPE_CHECKING:  # paramiko is imported with the connection, not with this module
    from paramiko import SFTPClient

DEFAULT_REMOTE_DIR = ".slurmgen"  # relative to the login node's home directory


class _Timeout(SlurmgenError):
    """run_shell's silence past its time-out; `run` names the argv in an `Unanswered`."""

    def __init__(self, text: str) -> None:
        super().__init__(text, exit_code=FAILED)


class RemoteRunner:
    """Runs argv on the login node; reads files there over SFTP (on the same connection)."""

    def __init__(self, alias: str, ssh_config: str | None = None, setup: Sequence[str] = ()):
        from slurmgen.ssh.connect import SSHOptions, connect_all

        self.where, self.setup = alias, list(setup)
        self.conn = connect_all([alias], SSHOptions(ssh_config=ssh_config))[alias]
        self._sftp: SFTPClient | None = None

    def run(self, argv: Sequence[str], *, cwd: str | None = None, stdin: bytes = b"", timeout: float = 60) -> Result:
        try:
            return self.run_shell(shell_line(argv, cwd, self.setup), stdin=stdin, timeout=timeout)
        except _Timeout:
            raise Unanswered(argv, timeout, f" on {self.where}") from None

    def run_shell(self, command: str, *, stdin: bytes = b"", timeout: float = 60) -> Result:
        """A command line whose every user value the caller has quoted already."""
        client = self.conn.client
        try:
            chan_in, out, err = client.exec_command(command, timeout=timeout)
            if stdin:
                chan_in.write(stdin)
            chan_in.channel.shutdown_write()
            text, errors = out.read(), err.read()
            code = out.channel.recv_exit_status()
        except OSError as exc:  # socket.timeout (TimeoutError): silent for `timeout` seconds
            text = f"remote: {self.where}: {command.split(' && ')[-1][:80]!r} failed: {exc}"
            raise (_Timeout(text) if isinstance(exc, TimeoutError) else SlurmgenError(text, exit_code=FAILED)) from None
        return Result(code, text.decode(errors="replace"), errors.decode(errors="replace"))

    def read(self, path: str, offset: int = 0) -> bytes | None:
        if self._sftp is None:
            self._sftp = self.conn.client.open_sftp()
        return read_from(self._sftp.open, path, offset, f" on {self.where}")

    def close(self) -> None:
        if self._sftp is not None:
            self._sftp.close()
        self.conn.close()


def _q(path: str) -> str:
    """A remote path, quoted; a relative one is taken from the login node's home directory."""
    return shlex.quote(path)


def ship(runner: RemoteRunner, snap: CodeSnapshot, remote_dir: str, job_files: bytes) -> tuple[str, bool]:
    """Put the snapshot (unless already there) and a job dir made from it.

    Returns the job dir's absolute path and whether the snapshot had to be uploaded.

    The job dir holds hard links to the snapshot's files (`cp -al`: no copy, and the snapshot
    itself is never written into), plus the rendered files and the snapshot's record.
    """
    snap_dir = f"{remote_dir.rstrip('/')}/snapshots/{snap.digest}"
    uploaded = False
    if runner.run(["test", "-d", snap_dir]).code != 0:
        tmp = f"{snap_dir}.part-{secrets.token_hex(4)}"
        res = runner.run_shell(
            f"mkdir -p {_q(tmp)} && tar -xf - -C {_q(tmp)} && "
            f"{{ mv -T {_q(tmp)} {_q(snap_dir)} 2>/dev/null || rm -rf {_q(tmp)}; }}",
            stdin=snap.tar,
            timeout=600,
        )
        if res.code != 0:
            raise SlurmgenError(
                f"remote: cannot unpack the code snapshot into {snap_dir} on {runner.where}: {res.err.strip()}",
                exit_code=FAILED,
            )
        uploaded = True
    job_dir = f"{remote_dir.rstrip('/')}/jobs/{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    res = runner.run_shell(
        f"mkdir -p {_q(job_dir)} && cp -al {_q(snap_dir)}/. {_q(job_dir)}/ && "
        f"tar -xf - -C {_q(job_dir)} && cd {_q(job_dir)} && pwd -P",
        stdin=job_files,
        timeout=120,
    )
    if res.code != 0 or not res.out.strip():
        raise SlurmgenError(
            f"remote: cannot make the job directory {job_dir} on {runner.where}: {res.err.strip()}", exit_code=FAILED
        )
    return res.out.strip().splitlines()[-1], uploaded
