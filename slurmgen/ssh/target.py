"""SSH targets: who to contact how, from flags and ~/.ssh/config. Pure (no paramiko here).

`slurmgen.ssh.connect` looks a host up in the ssh config and hands the result to `target_from`;
command-line flags win over the file, as with ssh(1).
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Mapping
from dataclasses import dataclass

from slurmgen.errors import SlurmgenError

DEFAULT_CONFIG = "~/.ssh/config"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts",)


@dataclass(frozen=True)
class SSHOptions:
    """What the command line says about SSH (None: ask ~/.ssh/config, then the default)."""

    user: str | None = None
    port: int | None = None
    identities: tuple[str, ...] = ()
    known_hosts: str | None = None
    ssh_config: str | None = None
    connect_timeout: float = 10.0
    accept_new_host_keys: bool = False


@dataclass(frozen=True)
class Target:
    """One host as it will be contacted."""

    alias: str
    hostname: str
    port: int
    user: str
    identities: tuple[str, ...]
    identities_only: bool
    known_hosts: tuple[str, ...]  # user files; new keys go to the first
    global_known_hosts: tuple[str, ...]  # read only
    proxy_jump: str | None
    proxy_command: str | None = None  # tokens (%h %p %r) already expanded; ProxyJump wins

    @property
    def key_name(self) -> str:
        """The name the host's key is filed under in known_hosts."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def describe(self) -> str:
        via = (
            f" via {self.proxy_jump}"
            if self.proxy_jump
            else f" via ProxyCommand {self.proxy_command!r}"
            if self.proxy_command
            else ""
        )
        return f"{self.user}@{self.hostname}:{self.port}{via}"


class ConnectError(Exception):
    """A host that could not be reached, authenticated or trusted."""

    def __init__(self, host: str, message: str, hint: str | None = None):
        super().__init__(f"{host}: {message}")
        self.host, self.message, self.hint = host, message, hint

    def line(self) -> str:
        return f"{self.host}: {self.message}" + (f" (hint: {self.hint})" if self.hint else "")


def _files(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    words = value if isinstance(value, list) else str(value).split()
    return tuple(os.path.expanduser(w) for w in words if w.lower() != "none")


def target_from(alias: str, opts: SSHOptions, found: Mapping[str, object]) -> Target:
    """Flags over what ~/.ssh/config says for `alias` (`found`, its lookup) over defaults."""
    port_text = opts.port if opts.port is not None else found.get("port", 22)
    try:
        port = int(str(port_text))
    except ValueError:
        raise SlurmgenError(f"ssh_config: Port of host {alias} must be a number (got {port_text!r})") from None
    jump = found.get("proxyjump")
    command = found.get("proxycommand")
    known = (
        (os.path.expanduser(opts.known_hosts),)
        if opts.known_hosts
        else (_files(found.get("userknownhostsfile")) or (os.path.expanduser(DEFAULT_KNOWN_HOSTS),))
    )
    return Target(
        alias=alias,
        hostname=str(found.get("hostname", alias)),
        port=port,
        user=opts.user or str(found.get("user") or "") or getpass.getuser(),
        identities=tuple(os.path.expanduser(p) for p in opts.identities) + _files(found.get("identityfile")),
        identities_only=str(found.get("identitiesonly", "no")).lower() == "yes",
        known_hosts=known,
        global_known_hosts=()
        if opts.known_hosts
        else (_files(found.get("globalknownhostsfile")) or GLOBAL_KNOWN_HOSTS),
        proxy_jump=None if jump is None or str(jump).lower() == "none" else str(jump),
        proxy_command=None if command is None or str(command).lower() == "none" else str(command),
    )


def parse_jump(spec: str) -> tuple[str, str | None, int | None]:
    """One ProxyJump hop, `[user@]host[:port]` -> (host, user, port)."""
    user, _, hostport = spec.strip().rpartition("@")
    host, sep, port = hostport.rpartition(":") if hostport.count(":") == 1 else (hostport, "", "")
    if not sep:
        host, port = hostport, ""
    return host, user or None, int(port) if port.isdigit() else None
