"""How a run's end reads, the one rule every view applies ("Exit / first failure" on the run page and
the runs list, `slurmgen status`, `slurmgen jobs --json`): an exit code with the first failure, or,
for a run a person stopped (the page's Stop or Cancel, `slurmgen cancel`, the API), "stopped by
you". Its ranks then die of the stop (143, the TERM; 75, a checkpoint and stop), which is no
failure: the code stays available, beside the words, never as the failure. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurmgen.contract.states import STOPPED_BY_YOU, State


def stopped_by_you(state: str | None) -> bool:
    """Whether a run (or attempt) in `state` was stopped on a person's request (one still
    STOPPING has not ended: its ranks run)."""
    return state == State.STOPPED.value


def failure_of(state: str | None, failure: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The run's first failure; None for a run a person stopped, whose recorded "failure" is
    the stop (its cause "stopped by you from the page", its code the TERM's)."""
    return None if stopped_by_you(state) else failure


def stop_of(state: str | None, code: int | None, failure: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A stopped run's stop as views give it: {"what": "stopped by you from the page", "exit_code":
    143} (its raw code, not a failure's); None for any other run."""
    if not stopped_by_you(state):
        return None
    cause = str((failure or {}).get("cause") or "")
    return {"what": cause if cause.startswith(STOPPED_BY_YOU) else STOPPED_BY_YOU, "exit_code": code}


def outcome(state: str | None, code: int | None, failure: Mapping[str, Any] | None) -> str:
    """Exit code and first failure in one line: "1 — rank 3 on node2 code 1 (cause)"; a run a
    person stopped: "stopped by you from the page (exit code 143)"; "—" when nothing is known."""
    stop = stop_of(state, code, failure)
    if stop is not None:
        return stop["what"] + (f" (exit code {code})" if code is not None else "")
    text = "" if code is None else str(code)
    if not failure:
        return text or "—"
    where = " ".join(
        p
        for p in (
            f"rank {failure['rank']}" if failure.get("rank") is not None else "",
            f"on {failure['node']}" if failure.get("node") else "",
            f"code {failure['code']}" if failure.get("code") is not None else "",
        )
        if p
    )
    cause = failure.get("cause") or ""
    said = f"{where} ({cause})" if where and cause else where or cause
    return f"{text} — {said}" if text else said
