"""paramiko, imported without `invoke`: the one way slurmgen's SSH modules import it.

paramiko imports `invoke` (which pulls in asyncio and unittest.mock: about 80 ms of CPU, a
sixth of `slurmgen launch`'s own start-up) only to run `Match exec` lines of an ssh config.
Most configs have none, so invoke is kept out while paramiko is imported and loaded only for
a config that has one (`parse_config`).
"""

from __future__ import annotations

import re
import sys

_BLOCKED = "invoke" not in sys.modules
if _BLOCKED:
    sys.modules["invoke"] = None  # type: ignore[assignment]  # import fails; paramiko copes
try:
    import paramiko
    import paramiko.config
finally:
    if _BLOCKED:
        del sys.modules["invoke"]

_MATCH_EXEC = re.compile(r"^\s*match\b.*\bexec\b", re.IGNORECASE | re.MULTILINE)

__all__ = ["paramiko", "parse_config"]


def parse_config(text: str) -> paramiko.SSHConfig:
    """An ssh config from its text, with invoke loaded first if a `Match exec` needs it."""
    if _MATCH_EXEC.search(text) and paramiko.config.invoke is None:
        try:
            import invoke
        except ImportError:
            pass  # paramiko then says that Match exec needs invoke
        else:
            paramiko.config.invoke = invoke
    return paramiko.SSHConfig.from_text(text)
