"""JSON Lines as slurmgen reads them: one object per line; a line that is not one (cut short by
a kill, or junk) is skipped, never fatal. Stdlib only, since `create` (through the attempts
record's names) and every job command import it; used for run records, attempts records and
what a login node sends back."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any


def objects(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The JSON objects among `lines`, in order."""
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record
