"""Host files in DeepSpeed's format, so existing ones work unchanged.

    # comment
    worker-1 slots=4
    worker-2 slots=2    # trailing comments too
    worker-3            # slots default to the caller's per-host count
    worker-4:8          # MPICH machine-file form, the same as `worker-4 slots=8`

Host names follow the one rule of `hostlist.check_host_name`.
"""

from __future__ import annotations

import re
from pathlib import Path

from slurmgen.errors import SlurmgenError, show
from slurmgen.generate.hostlist import check_host_name, split_slots_suffix
from slurmgen.generate.topology import Host
from slurmgen.generate.user_files import read_text

_LINE = re.compile(r"^(?P<host>\S+)(?:\s+slots\s*=\s*(?P<slots>\S+))?$")


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
        host, slots_text = m.group("host"), m.group("slots")
        mpich = split_slots_suffix(host)
        if mpich:
            if slots_text is not None:
                raise SlurmgenError(
                    f"{source}:{number}: slots given twice (got {show(line)})",
                    hint="use either 'HOST slots=N' or 'HOST:N'",
                )
            host, slots_text = mpich[0], str(mpich[1])
        check_host_name(host, f"{source}:{number}")
        if slots_text is not None and not (slots_text.isdigit() and int(slots_text) >= 1):
            raise SlurmgenError(f"{source}:{number}: slots must be a whole number >= 1 (got {show(slots_text)})")
        count = int(slots_text) if slots_text is not None else default_slots
        hosts.append(Host.with_count(host, count))
    if not hosts:
        raise SlurmgenError(f"{source}: no hosts in the file")
    return hosts


def read_hostfile(path: Path, default_slots: int) -> list[Host]:
    return parse_hostfile(read_text(path, "hostfile"), default_slots, source=str(path))
