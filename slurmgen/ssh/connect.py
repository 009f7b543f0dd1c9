"""SSH connections for slurmgen: with keys.py, hostkeys.py and explain.py, the only modules
that import paramiko.

- Targets: a host alias resolved through ~/.ssh/config (Host, HostName, User, Port,
  IdentityFile, IdentitiesOnly, UserKnownHostsFile, GlobalKnownHostsFile, ProxyJump,
  ProxyCommand);
  command-line flags win over the file, as with ssh(1).
- Host keys are checked against known_hosts and never trusted on first use: an unknown key
  refuses the host with the key's fingerprint and how to add it; a changed key is always
  refused. `accept_new_host_keys` adds keys of hosts not in the file yet (appending to the
  first known_hosts file), like StrictHostKeyChecking=accept-new.
- Authentication: key files (--identity, IdentityFile, ~/.ssh/id_*) and ssh-agent; an
  encrypted key file is unlocked once before connecting (keys.py).
- Hosts behind the same jump host share one connection to it (jumps.py).
- Errors are `ConnectError`s with one line per host saying what failed and what to try
  (explain.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from slurmgen.errors import EXIT_RUN_FAILED, SlurmgenError
from slurmgen.ssh.explain import explain
from slurmgen.ssh.hostkeys import HostKeyPolicy
from slurmgen.ssh.jumps import JumpPool
from slurmgen.ssh.keys import FromAgent, Unlocked, Unusable, terminal_prompt, unlock_all
from slurmgen.ssh.lean import paramiko
from slurmgen.ssh.sshconfig import describe_targets, load_config, master_address, resolve
from slurmgen.ssh.target import ConnectError, SSHOptions, Target, parse_jump

__all__ = [
    "ConnectError",
    "Connection",
    "RemoteProcess",
    "SSHOptions",
    "Target",
    "connect",
    "connect_all",
    "describe_targets",
    "load_config",
    "master_address",
    "resolve",
]

# paramiko logs a transport's failure from its own thread; Python's last-resort handler would
# print it as a stray line ("Exception (client): ...") next to our one clear line per host.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


# ---- configuration -------------------------------------------------------------------------------
class _ProxyCommand(paramiko.ProxyCommand):
    """paramiko's ProxyCommand, except that the command's end is the connection's end:
    paramiko's recv() keeps polling the closed pipe, so a proxy that fails at once costs the
    whole connect timeout, and one that dies later is noticed only by the keepalive."""

    def recv(self, size: int) -> bytes:
        ready, _, _ = select.select([self.process.stdout], [], [], self.timeout)
        if not ready:
            raise TimeoutError()
        try:
            return os.read(self.process.stdout.fileno(), size)  # b"": paramiko raises EOFError
        except OSError as exc:
            raise paramiko.ProxyCommandFailure(" ".join(self.cmd), exc.strerror) from None

    def close(self) -> None:
        """Stop the command and reap it (paramiko's close fails on one that has ended)."""
        self.process.terminate()
        try:
            self.process.wait(2)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def last_words(self) -> str:
        """The last line the command wrote to stderr, once it has ended ('' while it runs)."""
        if self.process.poll() is None:
            return ""
        lines = self.process.stderr.read(4096).decode(errors="replace").strip().splitlines()
        return lines[-1].strip() if lines else ""


# ---- sessions ------------------------------------------------------------------------------------
class RemoteProcess:
    """One command running on a host: its output and error streams, its stdin, its exit status."""

    def __init__(self, channel: paramiko.Channel):
        self.channel = channel

    def read(self) -> bytes:
        """The next chunk of standard output; b'' once the command's output has ended."""
        return self.channel.recv(65536)

    def read_stderr(self) -> bytes:
        """The next chunk of standard error, kept apart from the output (slurmgen launch
        carries node events on it); b'' once it has ended."""
        return self.channel.recv_stderr(65536)

    def close_stdin(self) -> None:
        """Send EOF: the remote bootstrap takes it as 'stop everything'."""
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self.channel.shutdown_write()

    def send(self, data: bytes) -> None:
        """Write to stdin, as far as the window allows at once (a keepalive line never fills
        it); nothing once stdin is closed (paramiko sends no data after EOF) or the connection is."""
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self.channel.send(data)

    def exit_status(self) -> int | None:
        """Wait for the exit status; None when the connection ended without one (lost)."""
        code = self.channel.recv_exit_status()
        return None if code == -1 else code

    def close(self) -> None:
        self.channel.close()


class Connection:
    """An authenticated SSH connection to one host (and its jump host, if any)."""

    def __init__(self, target: Target, client: paramiko.SSHClient, jump: Connection | None = None):
        self.target, self.client, self.jump = target, client, jump
        # A jump host's connection is held by every target behind it (JumpPool) and closed
        # when the last of them lets go.
        self._holders = 1
        self._holders_lock = threading.Lock()
        self._last_reply = time.monotonic()
        self._pinger: threading.Thread | None = None

    @property
    def alias(self) -> str:
        return self.target.alias

    def start(self, command: str, stdin: bytes, timeout: float = 10.0, separate_stderr: bool = False) -> RemoteProcess:
        """Run `command` and write `stdin` to it, leaving stdin open. Its stderr is folded
        into the output unless `separate_stderr` (then read it with read_stderr(), or the
        session's window fills and the command stalls)."""
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectError(self.alias, "the SSH connection is closed")
        try:
            channel = transport.open_session(timeout=timeout)
            channel.set_combine_stderr(not separate_stderr)
            channel.exec_command(command)
            channel.sendall(stdin)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise ConnectError(self.alias, f"cannot start the node's command: {exc or type(exc).__name__}") from None
        return RemoteProcess(channel)

    def is_active(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active()

    def start_keepalive(self, interval: float) -> None:
        """Ask the server for a reply every `interval` seconds (like ServerAliveInterval);
        `silent_for()` then tells how long an answer has been outstanding."""

        def ping() -> None:
            time.sleep(interval)  # not during start-up: the first answer is due after one interval
            while self.is_active():
                transport = self.client.get_transport()
                try:
                    if transport is None:
                        return
                    transport.global_request("keepalive@openssh.com", wait=True)
                except (OSError, EOFError, paramiko.SSHException):
                    return
                self._last_reply = time.monotonic()
                time.sleep(interval)
            self._last_reply = time.monotonic()  # closed: no longer silent, just gone

        self._last_reply = time.monotonic()
        self._pinger = threading.Thread(target=ping, name=f"ssh-keepalive-{self.alias}", daemon=True)
        self._pinger.start()

    def silent_for(self, interval: float) -> float:
        """Seconds past the expected keepalive answer (0 while all is well)."""
        return max(0.0, time.monotonic() - self._last_reply - interval)

    def share(self) -> Connection:
        """One more holder of this connection (see JumpPool); each one calls close() once."""
        with self._holders_lock:
            self._holders += 1
        return self

    def close(self) -> None:
        """Let go of one hold: the connection closes when no holder is left (a target has one
        holder, so its close is final); closing a closed connection does nothing."""
        with self._holders_lock:
            if self._holders == 0:
                return
            self._holders -= 1
            if self._holders:
                return
        self.client.close()
        if self.jump is not None:
            self.jump.close()


def _authenticate(
    client: paramiko.SSHClient,
    target: Target,
    keys: dict[str, Unlocked],
    timeout: float,
    sock: paramiko.Channel | _ProxyCommand | None,
) -> None:
    """client.connect with the target's key files: plain ones by path, unlocked ones (see
    keys.py) as keys; paramiko takes one such key, so any further one is offered after."""
    existing = [p for p in target.identities if os.path.isfile(p)]
    only = target.identities_only and bool(existing)
    files = [p for p in existing if not isinstance(keys.get(p), Unusable)]
    plain = [p for p in files if p not in keys]
    agent = None
    if any(isinstance(keys.get(p), FromAgent) for p in files):
        with contextlib.suppress(OSError, paramiko.SSHException):
            agent = paramiko.Agent()  # this connection's own: see keys.py
    unlocked: list[paramiko.PKey] = []
    for p in files:
        key = keys.get(p)
        if isinstance(key, FromAgent):
            key = key.pick(agent) if agent is not None else None
        if key is not None:
            unlocked.append(key)
    try:
        client.connect(
            target.hostname,
            port=target.port,
            username=target.user,
            pkey=unlocked[0] if unlocked else None,
            key_filename=plain or None,
            allow_agent=not only,
            look_for_keys=not only,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            channel_timeout=timeout,
            sock=sock,
        )
    except paramiko.AuthenticationException:
        transport = client.get_transport()
        for key in unlocked[1:]:
            try:
                if transport is not None and not transport.auth_publickey(target.user, key):
                    return  # accepted, nothing more asked
            except paramiko.AuthenticationException:
                continue
        raise
    finally:
        if agent is not None:
            agent.close()  # only signing during authentication used it


def connect(
    target: Target,
    opts: SSHOptions,
    config: paramiko.SSHConfig,
    notify: Callable[[str], None] = lambda msg: None,
    depth: int = 0,
    keys: dict[str, Unlocked] | None = None,
    jumps: JumpPool[Connection] | None = None,
) -> Connection:
    """Connect and authenticate, or raise ConnectError. Jump hosts come from `jumps` when
    given, so targets connected with the same pool share them."""
    jumps = jumps if jumps is not None else JumpPool()
    timeout = opts.connect_timeout
    jump: Connection | None = None
    sock: paramiko.Channel | paramiko.ProxyCommand | None = None
    client = paramiko.SSHClient()
    try:
        for path in (*target.global_known_hosts, *target.known_hosts):
            if os.path.isfile(path):
                client.load_host_keys(path)
        client.set_missing_host_key_policy(HostKeyPolicy(target, opts.accept_new_host_keys, notify))
        if target.proxy_jump:
            jump = _jump_host(target, opts, config, notify, depth, keys, jumps)
            sock = jump.client.get_transport().open_channel(
                "direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0), timeout=timeout
            )
        elif target.proxy_command:
            # Through a shell, as ssh runs it (pipes, redirections and `exec` work).
            sock = _ProxyCommand(f"/bin/sh -c {shlex.quote(target.proxy_command)}")
        _authenticate(client, target, keys or {}, timeout, sock)
        return Connection(target, client, jump)
    except BaseException as exc:
        client.close()
        if jump is not None:
            jump.close()
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            if isinstance(sock, _ProxyCommand):
                sock.close()
            raise
        err = _connect_error(target, exc, timeout, keys, jump, sock)
        if isinstance(sock, _ProxyCommand):
            sock.close()  # stops the command; the client does so only once connected
        raise err from None


def _jump_host(
    target: Target,
    opts: SSHOptions,
    config: paramiko.SSHConfig,
    notify: Callable[[str], None],
    depth: int,
    keys: dict[str, Unlocked] | None,
    jumps: JumpPool[Connection],
) -> Connection:
    """The connection to the last hop of `ProxyJump a,b`: b reached through a, as ssh -J does."""
    if depth > 4:
        raise ConnectError(target.alias, "ProxyJump chain is longer than 4 hops (a loop?)")
    hops = [h.strip() for h in (target.proxy_jump or "").split(",") if h.strip()]
    host, user, port = parse_jump(hops[-1])
    jump_opts = SSHOptions(
        user=user,
        port=port,
        known_hosts=opts.known_hosts,
        connect_timeout=opts.connect_timeout,
        accept_new_host_keys=opts.accept_new_host_keys,
        identities=opts.identities,
    )
    jump_target = replace(resolve(host, jump_opts, config), proxy_jump=",".join(hops[:-1]) or None)
    try:
        return jumps.get(
            (jump_target, jump_opts),
            lambda: connect(jump_target, jump_opts, config, notify, depth + 1, keys, jumps),
        )
    except ConnectError as exc:
        raise ConnectError(target.alias, f"via jump host {exc.line()}") from None


def _connect_error(
    target: Target,
    exc: BaseException,
    timeout: float,
    keys: dict[str, Unlocked] | None,
    jump: Connection | None,
    sock: paramiko.Channel | paramiko.ProxyCommand | None,
) -> ConnectError:
    """What a failed connection says: a jump host or a ProxyCommand that could not reach the
    target is named as such; everything else as `explain` reads it."""
    err = explain(target, exc, timeout, keys)
    if jump is not None and not isinstance(exc, ConnectError) and isinstance(exc, paramiko.ChannelException):
        return ConnectError(target.alias, f"jump host {target.proxy_jump} cannot reach {target.hostname}:{target.port}")
    if isinstance(sock, _ProxyCommand) and (
        isinstance(exc, (paramiko.ProxyCommandFailure, EOFError)) or "greeting" in err.message
    ):
        said = sock.last_words()
        return ConnectError(
            target.alias,
            f"ProxyCommand {target.proxy_command!r} ended without an SSH connection "
            f"to {target.hostname}:{target.port}" + (f"; it said: {said}" if said else ""),
            hint="check ProxyCommand in your ssh config; run it by hand to see what it does",
        )
    return err


def connect_all(
    aliases: Sequence[str],
    opts: SSHOptions,
    notify: Callable[[str], None] = lambda msg: None,
    config: paramiko.SSHConfig | None = None,
) -> dict[str, Connection]:
    """Connect to every host at once; all of them, or a SlurmgenError naming each failure."""
    config = config if config is not None else load_config(opts.ssh_config)
    targets = [resolve(a, opts, config) for a in aliases]
    # Jump hosts take --identity too (see connect); their IdentityFile lines are not asked for.
    keys = unlock_all(
        [p for t in targets for p in t.identities] + [os.path.expanduser(p) for p in opts.identities], terminal_prompt()
    )
    results: dict[str, Connection] = {}
    errors: list[ConnectError] = []
    with ThreadPoolExecutor(max_workers=min(64, len(targets)) or 1, thread_name_prefix="ssh-connect") as pool:
        jumps: JumpPool[Connection] = JumpPool()
        futures = {t.alias: pool.submit(connect, t, opts, config, notify, 0, keys, jumps) for t in targets}
        for alias, future in futures.items():
            try:
                results[alias] = future.result()
            except ConnectError as exc:
                errors.append(exc)
    if errors:
        for conn in results.values():
            conn.close()
        raise SlurmgenError(*[e.line() for e in errors], exit_code=EXIT_RUN_FAILED)
    return results
