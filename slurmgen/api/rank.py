"""The rank side of `slurmgen.submit(fn)`: `python -m slurmgen.api.rank CALL.pkl`, run by every rank.

It unpickles the function and its arguments, calls it and writes what came of it to
`result-RANK.pkl` beside the call, as submitit does: `(True, value)`, or `(False, exception,
traceback text)` when the function raised. The file is replaced atomically (slurmgen/atomic.py),
so the submitter reads a whole result or none. A rank that raised exits with code 1 after its
result is written: the launcher then stops the other ranks and names this one as the first
failure, as for any program.

The rank contract of the generated scripts (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT) is already in the environment: the function calls `torch.distributed` itself.
Standard library only (and slurmgen.atomic): every rank imports it.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from pathlib import Path
from typing import Any

from slurmgen.atomic import replace

RESULT_NAME = "result-{rank}.pkl"


def result_path(call: Path, rank: int) -> Path:
    """Where rank `rank` of the job that runs `call` writes its result."""
    return call.parent / RESULT_NAME.format(rank=rank)


def outcome(call: Path) -> tuple[Any, ...]:
    """The function of `call` called with its arguments: (True, value) or (False, exception, traceback)."""
    with call.open("rb") as f:
        fn, args, kwargs = pickle.load(f)
    try:
        return (True, fn(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001  (a SystemExit or KeyboardInterrupt is the function's too)
        return (False, exc, traceback.format_exc())


def write(path: Path, result: tuple[Any, ...]) -> None:
    """`result` pickled to `path` atomically; an exception or value that cannot be pickled is
    replaced by what can be said of it, so the submitter always learns what happened."""
    try:
        data = pickle.dumps(result)
    except Exception as exc:  # noqa: BLE001
        said = f"the result of rank {path.stem.split('-')[-1]} cannot be pickled: {exc!r}"
        data = pickle.dumps((False, RuntimeError(said), result[2] if len(result) > 2 else said))

    def write_data(tmp: Path) -> None:
        tmp.write_bytes(data)

    replace(path, write_data, fsync=False)


def main(argv: list[str]) -> int:
    """Run the call of argv[0] as rank $RANK (0 without a launcher); 0 if the function returned, 1 if it raised."""
    if len(argv) != 1:
        print("usage: python -m slurmgen.api.rank CALL.pkl", file=sys.stderr)
        return 2
    call = Path(argv[0])
    result = outcome(call)
    write(result_path(call, int(os.environ.get("RANK", "0"))), result)
    if not result[0]:
        print(result[2], file=sys.stderr, end="")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
