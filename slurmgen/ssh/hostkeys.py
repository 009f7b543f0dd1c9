"""Host keys for slurmgen's SSH connections: checked against known_hosts, never trusted on
first use unless asked (`accept_new`, like StrictHostKeyChecking=accept-new). Imports paramiko."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from slurmgen.ssh.lean import paramiko
from slurmgen.ssh.target import ConnectError, Target

_KNOWN_HOSTS_LOCK = threading.Lock()


def fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys with a fix-it message, or (opt-in) append them to known_hosts."""

    def __init__(self, target: Target, accept_new: bool, notify: Callable[[str], None]):
        self.target, self.accept_new, self.notify = target, accept_new, notify

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        t = self.target
        store = t.known_hosts[0]
        if not self.accept_new:
            port = f"-p {t.port} " if t.port != 22 else ""
            raise ConnectError(
                t.alias,
                f"host key {fingerprint(key)} of {hostname} is not in {', '.join(t.known_hosts)}; refusing",
                hint=f"check the fingerprint with the host's owner, then add it (ssh-keyscan {port}{t.hostname} "
                f">> {store}), or pass --accept-new-host-keys to trust hosts seen for the first time",
            )
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with _KNOWN_HOSTS_LOCK:
            path = Path(store)
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as f:
                f.write(line)
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.notify(f"{t.alias}: added new host key {fingerprint(key)} for {hostname} to {store}")
