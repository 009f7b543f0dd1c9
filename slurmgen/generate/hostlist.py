"""Slurm hostlist expressions: `gpu[01-03,07],cpu5` -> gpu01 gpu02 gpu03 gpu07 cpu5.

Same rules as `scontrol show hostnames`: commas inside brackets separate ranges, not hosts;
zero padding of the lower bound is kept; several bracket groups in one name expand to their
product (`r[1-2]n[1-2]` -> r1n1 r1n2 r2n1 r2n2). Pure: used for spec validation and the rank table.

It also owns the one rule for a host name, used wherever one is taken (host lists, host
files, --master, master_addr, --include): letters, digits and `_ . -`, or an IPv6 address.
Nothing a shell would read as syntax gets through.
"""

from __future__ import annotations

import ipaddress
import itertools
import re

from slurmgen.errors import SlurmgenError, show

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_SLOTS_SUFFIX = re.compile(r"^(?P<host>[A-Za-z0-9_.-]+):(?P<slots>\d+)$")  # MPICH's host:N


def is_host_name(name: str) -> bool:
    """A host name or IP address as the rule above allows it."""
    if _HOST_NAME.match(name):
        return True
    try:
        ipaddress.IPv6Address(name)
    except ValueError:
        return False
    return True


def check_host_name(name: str, field: str) -> str:
    """`name` if it is a host name, else one error line naming `field` and the value."""
    if is_host_name(name):
        return name
    mpich = _SLOTS_SUFFIX.match(name)
    if mpich:
        raise SlurmgenError(
            f"{field}: {show(name)} is not a host name (it looks like MPICH's host:slots)",
            hint=f"give slots per host in a --hostfile ('{mpich['host']} slots={mpich['slots']}' "
            f"or '{name}' lines) or with --gpus",
        )
    raise SlurmgenError(
        f"{field}: {show(name)} is not a host name (expected letters, digits and _ . - only, or an IP address)"
    )


def split_slots_suffix(entry: str) -> tuple[str, int] | None:
    """MPICH machine-file form `host:N` -> (host, N); None for anything else (IPv6 too)."""
    m = _SLOTS_SUFFIX.match(entry)
    return (m["host"], int(m["slots"])) if m else None


def _split_top_level(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise SlurmgenError(f"hostlist: nested '[' in {show(expr)}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise SlurmgenError(f"hostlist: unmatched ']' in {show(expr)}")
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth:
        raise SlurmgenError(f"hostlist: unmatched '[' in {show(expr)}")
    parts.append(expr[start:])
    return parts


def _expand_ranges(body: str, expr: str) -> list[str]:
    """`01-03,07` -> ['01', '02', '03', '07'], keeping the width of each lower bound."""
    out: list[str] = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise SlurmgenError(
                f"hostlist: bad range {show(item)} in {show(expr)}",
                hint="ranges look like 1-4 or 01-04, separated by commas",
            )
        lo_text, hi_text = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise SlurmgenError(f"hostlist: range {show(item)} runs backwards in {show(expr)}")
        if hi - lo > 100_000:
            raise SlurmgenError(f"hostlist: range {show(item)} is too large in {show(expr)}")
        width = len(lo_text)
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return out


def _expand_one(name: str, expr: str) -> list[str]:
    """One host pattern with any number of bracket groups."""
    pieces = re.split(r"\[([^\]]*)\]", name)
    # pieces alternates literal, bracket body, literal, ...
    choices = [[p] if i % 2 == 0 else _expand_ranges(p, expr) for i, p in enumerate(pieces)]
    return ["".join(combo) for combo in itertools.product(*choices)]


def expand(expr: str, field: str = "hosts") -> list[str]:
    """Expand a hostlist expression into host names, in order (duplicates kept, as Slurm does).

    Every name must pass `check_host_name`; errors name `field`."""
    text = expr.strip()
    if not text:
        raise SlurmgenError("hostlist: empty host list")
    hosts: list[str] = []
    for part in _split_top_level(text):
        part = part.strip()
        if not part:
            raise SlurmgenError(f"hostlist: empty host name in {show(expr)}")
        if any(c.isspace() for c in part):
            raise SlurmgenError(f"hostlist: white space in host name {show(part)}")
        hosts.extend(check_host_name(name, field) for name in _expand_one(part, expr))
    return hosts
