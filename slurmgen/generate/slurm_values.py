"""Parsers for the value syntaxes sbatch accepts, so mistakes surface before submission.

Pure functions returning canonical values; they raise ValueError with a message that the
spec layer turns into `field: message (got X)`.
"""

from __future__ import annotations

import re

TIME_FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
_UNLIMITED = {"unlimited", "infinite"}


def time_limit_seconds(text: str) -> int | None:
    """Seconds in a Slurm time limit (None for UNLIMITED).

    Accepts every sbatch form: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS. The leading
    field may exceed its usual range (sbatch reads `90` as 90 minutes); later ones may not.
    """
    value = text.strip()
    if value.lower() in _UNLIMITED:
        return None
    days = 0
    if "-" in value:
        day_text, _, value = value.partition("-")
        if not day_text.isdigit():
            raise ValueError(f"not a Slurm time limit; use {TIME_FORMS}")
        days = int(day_text)
        fields = value.split(":")
        if len(fields) > 3 or not all(f.isdigit() for f in fields):
            raise ValueError(f"not a Slurm time limit; use {TIME_FORMS}")
        h, m, s = (list(map(int, fields)) + [0, 0])[:3]
        if h > 23:
            raise ValueError("hours after the day must be 0-23")
    else:
        fields = value.split(":")
        if not 1 <= len(fields) <= 3 or not all(f.isdigit() for f in fields):
            raise ValueError(f"not a Slurm time limit; use {TIME_FORMS}")
        nums = list(map(int, fields))
        if len(nums) == 1:
            h, m, s = 0, nums[0], 0
        elif len(nums) == 2:
            h, m, s = 0, nums[0], nums[1]
        else:
            h, m, s = nums
        if len(nums) == 3 and m > 59:
            raise ValueError("minutes must be 0-59")
    if s > 59 or (days and m > 59):
        raise ValueError("minutes and seconds must be 0-59")
    total = ((days * 24 + h) * 60 + m) * 60 + s
    if total == 0:
        raise ValueError("a time limit of zero would never run")
    return total


_MEMORY = re.compile(r"^(\d+)([KMGT]?)$", re.IGNORECASE)


def memory_mb(text: str) -> int:
    """A Slurm memory size in MB (as sinfo and RealMemory count it); 0 = all of the node."""
    size, unit = _MEMORY.match(memory(text)).groups()  # type: ignore[union-attr]
    kib = int(size) * {"K": 1, "": 1024, "M": 1024, "G": 1024**2, "T": 1024**3}[unit]
    return -(-kib // 1024)


def memory(text: str) -> str:
    """A Slurm memory size: an integer with optional K/M/G/T suffix (default MB); 0 = all."""
    m = _MEMORY.match(text.strip())
    if not m:
        raise ValueError("not a Slurm memory size; use e.g. 64G, 500M or 0 for all of the node")
    return m.group(1) + m.group(2).upper()
