"""Passphrase-protected key files for `slurmgen launch`: unlocked once, before any connection.

paramiko can try only one passphrase for all key files, and asking from the connection
threads would interleave prompts. So, in the main thread and before connecting, every key
file a target names (--identity, IdentityFile) is read once:

- a plain key is left to paramiko, which reads it while authenticating;
- an encrypted key that ssh-agent holds is used through the agent (as ssh does, even with
  IdentitiesOnly: the agent key is the named key). Each connection asks the agent itself:
  paramiko's agent connection is one socket, and two threads signing through it at once
  garble each other's requests;
- any other encrypted key needs its passphrase: asked on the terminal (/dev/tty, no echo,
  three tries, as ssh does). Without a terminal it is skipped, as ssh in batch mode skips
  it, and other keys or the agent may still get in; if none does, the authentication error
  names it and says to `ssh-add` it. The passphrase is never kept; the unlocked key lives
  in this process only.
- a file that holds no key paramiko can read (a .pub, a DSA key) is skipped the same way.

Default keys (~/.ssh/id_*) are not unlocked here: like ssh in batch mode, an encrypted one
is skipped unless the agent holds it or it is named with --identity.
"""

from __future__ import annotations

import base64
import getpass
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from slurmgen.errors import SlurmgenError
from slurmgen.ssh.lean import paramiko

KEY_TYPES = (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey)
TRIES = 3
OPENSSH_MAGIC = b"openssh-key-v1\0"

Prompt = Callable[[str], str]


@dataclass(frozen=True)
class FromAgent:
    """An encrypted key file whose key ssh-agent holds: take the agent key with this public half."""

    blob: str

    def pick(self, agent: paramiko.Agent) -> paramiko.PKey | None:
        return next((k for k in agent.get_keys() if k.get_base64() == self.blob), None)


@dataclass(frozen=True)
class Unusable:
    """A key file that cannot be offered, and why (told if authentication then fails)."""

    why: str


Unlocked: TypeAlias = "paramiko.PKey | FromAgent | Unusable"  # paramiko is untyped: spelt as a string

# Keys unlocked in this process: a reconnect after a lost host asks nobody again.
_UNLOCKED: dict[str, Unlocked] = {}


class _Encrypted(Exception):
    """The key file needs a passphrase."""


class _Unreadable(Exception):
    """The file holds no private key paramiko can read."""


def _read(path: str, passphrase: str | None) -> paramiko.PKey:
    """The key in `path`; _Encrypted if it needs a passphrase (or this one is wrong)."""
    encrypted = False
    for cls in KEY_TYPES:
        try:
            return cls.from_private_key_file(path, password=passphrase)
        except paramiko.PasswordRequiredException:
            encrypted = True
        except (paramiko.SSHException, ValueError, OSError):
            pass
    if encrypted or passphrase is not None:
        raise _Encrypted()
    raise _Unreadable()


def public_blob(path: str) -> str | None:
    """The key's public half (base64), without its passphrase: from PATH.pub, else from the
    unencrypted header of an OpenSSH-format private key. None if neither says."""
    try:
        return Path(path + ".pub").read_text().split()[1]
    except (OSError, IndexError):
        pass
    try:
        text = Path(path).read_text()
        body = "".join(line for line in text.splitlines() if line and not line.startswith("-----"))
        data = base64.b64decode(body)
        if not data.startswith(OPENSSH_MAGIC):
            return None
        msg = paramiko.Message(data[len(OPENSSH_MAGIC) :])
        msg.get_string(), msg.get_string(), msg.get_string()  # cipher, kdf, kdf options
        if msg.get_int() < 1:
            return None
        return base64.b64encode(msg.get_binary()).decode()
    except (OSError, ValueError, UnicodeDecodeError, paramiko.SSHException):
        return None


def terminal_prompt() -> Prompt | None:
    """getpass on /dev/tty, or None when this process has no terminal to ask on."""
    try:
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
    except OSError:
        return None
    return getpass.getpass


def agent_keys() -> list[paramiko.PKey]:
    """The keys ssh-agent offers ($SSH_AUTH_SOCK), or none."""
    if not os.environ.get("SSH_AUTH_SOCK"):
        return []
    try:
        agent = paramiko.Agent()
    except (OSError, paramiko.SSHException):
        return []
    try:
        return list(agent.get_keys())
    finally:
        agent.close()


def unlock(path: str, prompt: Prompt | None, agent: Sequence[paramiko.PKey]) -> Unlocked | None:
    """None for a plain key (paramiko reads it); FromAgent, the decrypted key or Unusable."""
    try:
        _read(path, None)
        return None
    except _Unreadable:
        return Unusable("not a private key slurmgen can read: give the private key, not its .pub")
    except _Encrypted:
        pass
    blob = public_blob(path)
    if blob is not None and any(key.get_base64() == blob for key in agent):
        return FromAgent(blob)
    if prompt is None:
        return Unusable(
            f"encrypted and not in ssh-agent: ssh-add {path}, or run from a terminal to be asked for its passphrase"
        )
    for _ in range(TRIES):
        passphrase = prompt(f"Enter passphrase for key '{path}': ")
        try:
            return _read(path, passphrase)
        except _Encrypted:
            continue
    raise SlurmgenError(f"identity: wrong passphrase for key file {path} ({TRIES} tries)")


def unlock_all(
    paths: Iterable[str], prompt: Prompt | None = None, agent: Sequence[paramiko.PKey] | None = None
) -> dict[str, Unlocked]:
    """path -> what to do with it, for each key file among `paths` that paramiko cannot
    simply read (each asked for once)."""
    paths = [p for p in dict.fromkeys(paths) if os.path.isfile(p) and p not in _UNLOCKED]
    if paths:
        found_agent = agent_keys() if agent is None else agent
        for path in paths:
            key = unlock(path, prompt, found_agent)
            if key is not None:
                _UNLOCKED[path] = key
    return dict(_UNLOCKED)
