"""~/.ssh/config without an SSH connection: who each host is (`resolve`), for `--dry-run`, the
master's address and the connections alike.

`slurmgen launch --dry-run` and the plan's master address read the ssh config but connect to
nothing, so they must not pay for paramiko (its transport, ciphers and `cryptography`: most of
the launcher's start-up). paramiko's config parser (`paramiko/config.py`, which needs only its
`ssh_exception` module and the standard library) is the one ssh(1) semantics slurmgen trusts,
so while paramiko is not imported yet it is loaded alone, from paramiko's own files, under a
package of its own (`_PACKAGE`) that runs none of paramiko's `__init__`. Once paramiko is
imported (a real launch) its own `paramiko.config` is used. Either way `invoke` is kept out
unless a config has a `Match exec` line (see lean.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurmgen.errors import SlurmgenError
from slurmgen.ssh.target import DEFAULT_CONFIG, SSHOptions, Target, target_from

_PACKAGE = "_slurmgen_paramiko_config"  # paramiko's files, without paramiko/__init__.py
_MATCH_EXEC = re.compile(r"^\s*match\b.*\bexec\b", re.IGNORECASE | re.MULTILINE)


def _config_module() -> types.ModuleType:
    """paramiko's `config` module: paramiko's own once it is imported, else loaded alone."""
    if "paramiko" in sys.modules:
        from slurmgen.ssh.lean import paramiko

        return paramiko.config
    if _PACKAGE + ".config" in sys.modules:
        return sys.modules[_PACKAGE + ".config"]
    spec = importlib.util.find_spec("paramiko")  # finds the files; runs nothing of paramiko
    if spec is None or not spec.submodule_search_locations:
        raise SlurmgenError("ssh_config: paramiko is not installed", hint="pip install paramiko")
    package = types.ModuleType(_PACKAGE)
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules[_PACKAGE] = package
    blocked = "invoke" not in sys.modules
    if blocked:
        sys.modules["invoke"] = None  # type: ignore[assignment]  # as lean.py: config.py copes
    try:
        return importlib.import_module(_PACKAGE + ".config")
    finally:
        if blocked:
            del sys.modules["invoke"]


def parse_config(text: str) -> Any:
    """An ssh config (a paramiko.SSHConfig) from its text, with invoke loaded first if a
    `Match exec` line needs it."""
    module = _config_module()
    if _MATCH_EXEC.search(text) and module.invoke is None:
        try:
            import invoke
        except ImportError:
            pass  # paramiko then says that Match exec needs invoke
        else:
            module.invoke = invoke  # type: ignore[attr-defined]
    return module.SSHConfig.from_text(text)


def load_config(path: str | None) -> Any:
    """The ssh config file given, or ~/.ssh/config if it exists, or an empty one."""
    if path is None:
        default = Path(DEFAULT_CONFIG).expanduser()
        return parse_config(default.read_text()) if default.is_file() else _config_module().SSHConfig()
    try:
        return parse_config(Path(os.path.expanduser(path)).read_text())
    except OSError as exc:
        raise SlurmgenError(f"ssh_config: cannot read {path!r}: {exc.strerror}") from None
    except Exception as exc:  # paramiko's ConfigParseError and friends
        raise SlurmgenError(f"ssh_config: {path}: {exc}") from None


def resolve(alias: str, opts: SSHOptions, config: Any) -> Target:
    """Flags over ~/.ssh/config over defaults, for one host."""
    return target_from(alias, opts, config.lookup(alias))


def describe_targets(aliases: Sequence[str], opts: SSHOptions) -> dict[str, str]:
    """alias -> user@host:port (via jump), without connecting: for --dry-run."""
    config = load_config(opts.ssh_config)
    return {a: resolve(a, opts, config).describe() for a in aliases}


def master_address(alias: str, opts: SSHOptions) -> str:
    """The address other nodes use for the master: HostName from ~/.ssh/config, else the alias."""
    return resolve(alias, opts, load_config(opts.ssh_config)).hostname
