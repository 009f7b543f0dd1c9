"""`slurmgen.submit(fn, *args, nodes=, gpus=)`: a Python function run on every rank of a job, rank
0's return value (or the failing rank's exception) back in the caller, as submitit does.

The function and its arguments are pickled (with cloudpickle when it is installed, which also
carries functions of a notebook or a script's `__main__`; else the standard pickle, which sends a
function by its module and name) to `call.pkl` in a fresh directory of the job, before anything is
submitted: a function that cannot be pickled is refused with nothing written. Every rank runs
`python -m slurmgen.api.rank call.pkl` (api/rank.py) under the generated scripts, so each has the
rank contract's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT for
`torch.distributed.init_process_group()`, and writes `result-RANK.pkl` beside the call.
"""

from __future__ import annotations

import os
import pickle
import re
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from slurmgen.api.handle import Handle
from slurmgen.api.job import Job
from slurmgen.api.rank import result_path
from slurmgen.errors import SlurmgenError

T = TypeVar("T")
CALL_NAME = "call.pkl"
JOBS_DIR = "slurmgen-jobs"  # under the current directory, which the nodes must see (as the scripts' own)
# The spec fields the function's job decides itself: its program is the rank runner.
OWN_FIELDS = ("command", "sweep", "sweep_args", "array")
_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")


class FunctionJob(Generic[T]):
    """The job of `slurmgen.submit(fn, ...)`: its run's `Handle` (`state`, `wait`, `logs`, `cancel`,
    `attempts`, `timeline`) and `result()`."""

    def __init__(self, handle: Handle, call: Path, world_size: int) -> None:
        self.handle, self.call, self.world_size = handle, call, world_size

    def __getattr__(self, name: str) -> Any:  # the run's questions and controls are the handle's
        return getattr(self.handle, name)

    def __repr__(self) -> str:
        return f"FunctionJob({self.handle.kind} {self.handle.key}, {self.world_size} ranks, {self.call.parent})"

    def result(self, timeout: float | None = None) -> T:
        """Wait for the job; rank 0's return value. When a rank raised, its exception is raised here
        with that rank's traceback in its notes (the first rank to fail, as the launcher names it);
        when no rank left a result (the job was cancelled, or died before the function returned),
        a SlurmgenError with the run's state."""
        state = self.handle.wait(timeout)
        failed = sorted(
            (p for p in (result_path(self.call, r) for r in range(self.world_size)) if p.is_file()),
            key=lambda p: p.stat().st_mtime,
        )
        results = {p: _load(p) for p in failed}
        errors = [(p, r) for p, r in results.items() if not r[0]]
        if errors:
            path, (_, exc, trace) = errors[0]
            raise _with_trace(exc, path.stem.split("-")[-1], trace)
        zero = result_path(self.call, 0)
        if zero not in results:
            raise SlurmgenError(
                f"result: rank 0 left no result ({self.handle.kind} {self.handle.key} {state})",
                hint=f"handle.logs() shows its output; the call is {self.call}",
            )
        return results[zero][1]


def submit(
    fn: Callable[..., T],
    *args: Any,
    nodes: int = 1,
    gpus: int = 1,
    hosts: str | list[str] | None = None,
    registry: str | os.PathLike[str] | None = None,
    world_size: int | None = None,
    check: bool = True,
    **spec: Any,
) -> FunctionJob[T]:
    """Run `fn(*args)` on every rank of a job of `nodes` x `gpus` processes, under Slurm (sbatch
    here), or over SSH on `hosts` when given; `spec` is any other field of the job spec
    (`time=`, `partition=`, `backend=`, `env=`...). `world_size`, when given, must be the one the
    job gives. Errors (a bad field, a function that cannot be pickled) are raised before anything
    is written or submitted; `check=False` submits without comparing the request with what the
    cluster has (`Job.submit`)."""
    if not callable(fn):
        raise SlurmgenError(f"fn: expected a function to run on every rank (got {type(fn).__name__})")
    taken = [k for k in OWN_FIELDS if k in spec]
    if taken:
        raise SlurmgenError(f"{taken[0]}: slurmgen.submit runs the function; give {taken[0]} to slurmgen.Job instead")
    name = getattr(fn, "__name__", "")
    directory = Path(
        spec.pop("output_dir", None) or Path(JOBS_DIR) / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    )
    call = directory.absolute() / CALL_NAME
    job = Job(
        command=[sys.executable, "-m", "slurmgen.api.rank", str(call)],
        nodes=nodes,
        gpus=gpus,
        output_dir=str(directory),
        **({"job_name": name} if _NAME.match(name) and "job_name" not in spec else {}),
        **spec,
    )
    size = job.spec.nodes * job.spec.gpus if hosts is None else _hosts_size(hosts, job.spec.nodes, job.spec.gpus)
    if world_size is not None and world_size != size:
        raise SlurmgenError(
            f"world_size: the job gives {size} ranks ({'nodes' if hosts is None else 'hosts'} x gpus), not {world_size}"
        )
    data = dumps(fn, args)
    call.parent.mkdir(parents=True, exist_ok=True)
    call.write_bytes(data)
    handle = job.launch(hosts, registry=registry) if hosts is not None else job.submit(registry=registry, check=check)
    assert isinstance(handle, Handle)  # no sweep: one run
    return FunctionJob(handle, call, size)


def dumps(fn: Callable[..., Any], args: tuple[Any, ...]) -> bytes:
    """`(fn, args, {})` pickled for the ranks, or the error naming what cannot be pickled."""
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        import cloudpickle  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        if getattr(fn, "__module__", None) == "__main__" or "<locals>" in name or name == "<lambda>":
            raise SlurmgenError(
                f"fn: {name} is not importable by the ranks (defined in __main__, a function or a lambda)",
                hint="move it into a module, or install cloudpickle, which carries it by value",
            ) from None
        cloudpickle = pickle
    try:
        return cloudpickle.dumps((fn, args, {}))
    except Exception as exc:  # noqa: BLE001  (pickle raises many kinds, all meaning the same here)
        raise SlurmgenError(f"fn: {name} or its arguments cannot be pickled: {exc}") from None


def _hosts_size(hosts: str | list[str], nodes: int, gpus: int) -> int:
    """The ranks a launch on `hosts` gives; refused (before anything is written) when `nodes`
    says otherwise, as Job.launch would."""
    from slurmgen.generate.hostlist import expand

    names = expand(hosts) if isinstance(hosts, str) else hosts
    if nodes not in (1, len(names)):
        raise SlurmgenError(f"nodes: the job asks for {nodes} nodes but hosts names {len(names)} ({', '.join(names)})")
    return len(names) * gpus


def _load(path: Path) -> tuple[Any, ...]:
    with path.open("rb") as f:
        return tuple(pickle.load(f))


def _with_trace(exc: BaseException, rank: str, trace: str) -> BaseException:
    """The rank's exception with its traceback said: a note where Python has notes (3.11), else chained."""
    said = f"raised on rank {rank} of the job:\n{trace.rstrip()}"
    if hasattr(exc, "add_note"):
        exc.add_note(said)
        return exc
    exc.__cause__ = RemoteTraceback(said)
    return exc


class RemoteTraceback(Exception):
    """A rank's traceback as text, the cause of its exception raised here (Python 3.10)."""
