"""Real network faults for the integration tests: nftables rules inside one node's namespace.

`cut_off(node)` drops every packet in and out of the node except on loopback, as a failed
switch port or a partition does: connections stay open on both sides, nothing closes them
(no FIN, no RST), and whatever waits for the other side waits. The table is deleted on the
way out whatever happened, which heals the node.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator

TABLE = "slurmgen_test_cut"
RULES = f"""
table inet {TABLE} {{
  chain in {{ type filter hook input priority 0; policy drop; iif "lo" accept; }}
  chain out {{ type filter hook output priority 0; policy drop; oif "lo" accept; }}
}}
"""


def _nft(netns: str, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ip", "netns", "exec", netns, "nft", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=10,
        check=check,
    )


@contextlib.contextmanager
def cut_off(netns: str) -> Iterator[None]:
    """Inside the block, the node in namespace `netns` hears nothing and nobody hears it."""
    _nft(netns, "-f", "-", stdin=RULES)
    try:
        yield
    finally:
        _nft(netns, "delete", "table", "inet", TABLE, check=False)
        left = _nft(netns, "list", "tables", check=False).stdout
        assert TABLE not in left, f"the fault table is still in {netns}: {left}"
