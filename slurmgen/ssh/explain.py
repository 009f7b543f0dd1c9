"""What paramiko and the socket layer raise, as one actionable line per host. Imports paramiko."""

from __future__ import annotations

import errno
import os
import socket

from slurmgen.ssh.hostkeys import fingerprint
from slurmgen.ssh.keys import Unlocked, Unusable
from slurmgen.ssh.lean import paramiko
from slurmgen.ssh.target import ConnectError, Target


def explain(
    target: Target, exc: BaseException, timeout: float, keys: dict[str, Unlocked] | None = None
) -> ConnectError:
    """Turn what paramiko and the socket layer raise into one actionable line."""
    where = f"{target.hostname}:{target.port}"
    if isinstance(exc, ConnectError):
        return exc
    if isinstance(exc, paramiko.BadHostKeyException):
        store = target.known_hosts[0]
        return ConnectError(
            target.alias,
            f"host key of {target.key_name} has CHANGED: the server offers {fingerprint(exc.key)}, "
            f"known_hosts has {fingerprint(exc.expected_key)}; refusing",
            hint=f"if the host was reinstalled, remove the old key (ssh-keygen -R '{target.key_name}' -f {store}) "
            "and add the new one after checking it; otherwise someone may be intercepting the connection "
            "(--accept-new-host-keys never replaces a known key)",
        )
    if isinstance(exc, paramiko.AuthenticationException) or (
        isinstance(exc, paramiko.SSHException) and "no authentication methods" in str(exc).lower()
    ):
        skipped = {p: k.why for p, k in (keys or {}).items() if isinstance(k, Unusable)}
        files = ", ".join(p + (f" ({skipped[p]})" if p in skipped else "") for p in target.identities) or "none given"
        agent = "no" if target.identities_only or not os.environ.get("SSH_AUTH_SOCK") else "yes"
        return ConnectError(
            target.alias,
            f"authentication as {target.user!r} failed at {where} (key files: {files}; ssh-agent: {agent})",
            hint="check --user and --identity, the keys in your ssh-agent, or ~/.ssh/config",
        )
    if isinstance(exc, socket.gaierror):
        return ConnectError(
            target.alias,
            f"cannot resolve host name {target.hostname!r}",
            hint="check the host name, /etc/hosts or HostName in ~/.ssh/config",
        )
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return ConnectError(
            target.alias,
            f"no answer from {where} within {timeout:g} s",
            hint="is the host up and reachable from here? (--connect-timeout to wait longer)",
        )
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        codes = {e.errno for e in exc.errors.values()}
        if codes == {errno.ECONNREFUSED}:
            return ConnectError(
                target.alias,
                f"connection refused by {where}",
                hint="is sshd running there, and is the port right (--port, Port in ~/.ssh/config)?",
            )
        return ConnectError(target.alias, f"cannot connect to {where}: no route to host")
    handshake = ("banner", "no existing session", "negotiation failed")
    if isinstance(exc, (paramiko.SSHException, EOFError)) and any(w in str(exc).lower() for w in handshake):
        return ConnectError(
            target.alias,
            f"{where} sent no SSH greeting within {timeout:g} s",
            hint="is that port an SSH server? is the host overloaded?",
        )
    if isinstance(exc, OSError) and exc.strerror:
        return ConnectError(target.alias, f"cannot connect to {where}: {exc.strerror}")
    return ConnectError(target.alias, f"SSH to {where} failed: {exc or type(exc).__name__}")
