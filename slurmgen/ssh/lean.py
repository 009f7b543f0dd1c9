"""paramiko, imported without `invoke`: the one way slurmgen's SSH modules import it.

paramiko imports `invoke` (which pulls in asyncio and unittest.mock: about 80 ms of CPU, a
sixth of `slurmgen launch`'s own start-up) only to run `Match exec` lines of an ssh config.
Most configs have none, so invoke is kept out while paramiko is imported and loaded only for
a config that has one (sshconfig.parse_config).
"""

from __future__ import annotations

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

__all__ = ["paramiko"]
