"""Host files in DeepSpeed's format, so existing ones work unchanged.

    # comment
    worker-1 slots=4
    worker-2 slots=2    # trailing comments too
    worker-3            # slots default to the caller's per-host count
"""

from __future__ import annotations

import re
from pathlib import Path

from slurmgen.errors import SlurmgenError, show
from slurmgen.topology import Host

_LINE = re.compile(r"^(?P<host>[A-Za-z0-9_.:-]+)(?:\s+slots\s*=\s*(?P<slots>\S+))?$")


def parse_hostfile(text: str, default_slots: int, source: str = "hostfile") -> list[Host]:
    """Hosts in file order; `default_slots` for lines without `slots=`."""
    hosts: list[Host] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line)
        if not m:
            raise SlurmgenError(f"{source}:{number}: expected 'HOST slots=N' (got {show(line)})")
        slots_text = m.group("slots")
        if slots_text is not None and not (slots_text.isdigit() and int(slots_text) >= 1):
            raise SlurmgenError(f"{source}:{number}: slots must be a whole number >= 1 (got {show(slots_text)})")
        count = int(slots_text) if slots_text is not None else default_slots
        hosts.append(Host.with_count(m.group("host"), count))
    if not hosts:
        raise SlurmgenError(f"{source}: no hosts in the file")
    return hosts


def read_hostfile(path: Path, default_slots: int) -> list[Host]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise SlurmgenError(f"hostfile: cannot read {show(str(path))}: {exc.strerror}") from None
    return parse_hostfile(text, default_slots, source=str(path))
