"""Numbers that remember how they were written, for spec fields that want the text.

YAML (yaml12.py) reads `time: 90`, `job_name: 2024` or `--lr 3e-4` in a command as numbers; the
spec (spec.py) takes them back as the text the user wrote. Apart from yaml12 so that a spec
given by flags alone validates without importing PyYAML (~15 ms of every `launch`).
"""

from __future__ import annotations


class WrittenInt(int):
    """An integer that remembers how it was written, for fields that want the text."""

    written: str


class WrittenFloat(float):
    """A float that remembers how it was written: `--lr 3e-4` stays "3e-4", not "0.0003"."""

    written: str


def as_written(value: object) -> object:
    """A number as the user wrote it (text), anything else unchanged; booleans stay booleans."""
    if isinstance(value, (WrittenInt, WrittenFloat)):
        return value.written
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value
