"""Where the coordinator keeps its token and database, and how the token is made and read.

The token is 32 random bytes (URL-safe text), written once on the server's first start to a
0600 file that agents and the CLI read too (`--token-file`, or `$SLURMGEN_TOKEN`). A token file
others can read is refused rather than used: anyone holding it can run commands on every node.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from slurmgen.contract import envvars
from slurmgen.errors import SlurmgenError


def _xdg(var: str, fallback: str) -> Path:
    return Path(os.environ.get(var) or Path.home() / fallback) / "slurmgen"


def default_token_file() -> Path:
    return _xdg("XDG_CONFIG_HOME", ".config") / "token"


def default_db() -> Path:
    return _xdg("XDG_STATE_HOME", ".local/state") / "coordinator.db"


def read_token(path: Path) -> str:
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as e:
        raise SlurmgenError(
            f"token file: cannot read {str(path)!r}: {e.strerror}",
            hint="start `slurmgen serve` once to create it, or pass --token-file",
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SlurmgenError(
            f"token file: {str(path)!r} is readable by others (mode {stat.S_IMODE(mode):o})", hint=f"chmod 600 {path}"
        )
    if not text:
        raise SlurmgenError(f"token file: {str(path)!r} is empty")
    return text


def load_or_create_token(path: Path) -> tuple[str, bool]:
    """The server's token, created (0600, never overwritten) if the file does not exist."""
    if path.exists():
        return read_token(path), False
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, True


def client_token(path: Path | None) -> str:
    """For agents and the CLI: --token-file, else $SLURMGEN_TOKEN, else the default file."""
    if path is None and os.environ.get(envvars.TOKEN):
        return os.environ[envvars.TOKEN].strip()
    return read_token(path or default_token_file())
