"""`slurmgen.beat`: heartbeats, the timeline and metrics for any program, in two lines.

    import slurmgen
    ...
    for step in range(max_steps):
        ...train...
        slurmgen.beat(step=step, loss=loss.item())

Optional phases mark what only the program knows: `slurmgen.beat(phase="imports")` after its
imports, `phase="rendezvous"` once init_process_group returned, `phase="checkpoint"` before a
save (the next step beat ends its stall). The first call records when the OS started the
process; the first step beat is the first step; the end is written at exit (failed after an
uncaught exception). Without a launcher (no $SLURMGEN_HEARTBEAT_DIR and no
$SLURMGEN_TIMELINE_FILE) every call returns at once: the same program runs anywhere.

The writer is `observe.heartbeat.Heartbeat`, the one the bundled trainer uses. Metrics (`loss`
and any keyword) go from rank 0 to the job's metrics file beside the timeline file
(slurmgen-ID.metrics.jsonl), one JSON line per
call, the trainer's format: {"step", "split": "train", "loss", ..., "time"}.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurmgen.contract import envvars, hangs, phases
from slurmgen.contract.states import HEARTBEAT_WORD, State
from slurmgen.observe.heartbeat import Heartbeat

# Seconds between heartbeat files (and step samples): the trainer's --heartbeat-every default.
EVERY = 1.0
# A phase a program names that is a heartbeat status: the watcher judges it by what this rank
# learned of its earlier ones, not by the step limit.
_STATUS = {"checkpoint": hangs.CHECKPOINTING, "eval": hangs.EVALUATING, "evaluate": hangs.EVALUATING}


def _int(environ: Mapping[str, str], *names: str) -> int:
    for name in names:
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


class Beat:
    """The state behind `slurmgen.beat` in one process: None until a launcher asked for it."""

    def __init__(self, environ: Mapping[str, str] = os.environ):
        self.hb: Heartbeat | None = None
        self.metrics: Path | None = None
        if environ.get(envvars.HEARTBEAT_DIR) or environ.get(envvars.TIMELINE_FILE):
            rank = _int(environ, "RANK", "SLURM_PROCID")
            self.hb = Heartbeat(None, rank, EVERY, environ=environ)
            timeline = environ.get(envvars.TIMELINE_FILE)
            if timeline and rank == 0:
                self.metrics = metrics_path(timeline)
            if self.hb.timeline is not None:
                self.hb.timeline.started()
        self.step, self.last, self.failed, self.ended = -1, 0.0, False, False
        self.said: set[str] = set()  # the phases the program named itself

    def __call__(
        self, step: int | None = None, loss: float | None = None, phase: str | None = None, **metrics: Any
    ) -> None:
        hb = self.hb
        if hb is None:
            return
        now = time.time()
        if phase is not None:
            self.phase(phase, now)
        if step is not None:
            if hb.start_step is None:  # the program reports steps done: the first one is the first step
                self.infer(now)
                hb.start_step, self.last = step - 1, now
            hb.beat(step, work=now - self.last if self.last else None)
            self.step, self.last = step, now
        if self.metrics is not None and (loss is not None or metrics):
            record = {
                "step": self.step,
                "split": "train",
                **({"loss": loss} if loss is not None else {}),
                **metrics,
                "time": now,
            }
            with open(self.metrics, "a") as f:
                f.write(json.dumps(record, default=float) + "\n")

    def infer(self, now: float) -> None:
        """The first step of a program that did not name its imports or rendezvous: imports when
        it imported slurmgen, the rendezvous now at the latest (if torch.distributed is up)."""
        tl = self.hb.timeline if self.hb is not None else None
        if tl is None:
            return
        if phases.IMPORTS not in self.said:
            tl.write(phases.IMPORTS, min(phases.IMPORTED_AT, now), inferred=True)
        dist = sys.modules.get("torch.distributed")
        if phases.RENDEZVOUS not in self.said and dist is not None and dist.is_available() and dist.is_initialized():
            tl.write(phases.RENDEZVOUS, now, inferred=True)

    def phase(self, name: str, now: float) -> None:
        hb = self.hb
        assert hb is not None
        self.said.add(name)
        if name in _STATUS:
            hb.beat(max(self.step, 0), status=_STATUS[name], force=True)
            self.last = 0.0  # the stall is not work of the next step
        elif name == phases.END:
            self.end()
        elif hb.timeline is not None:
            hb.timeline.write(name, now, **({"step": self.step} if self.step >= 0 else {}))

    def end(self) -> None:
        """At exit: the rank's last word (done, or failed after an uncaught exception)."""
        if self.hb is not None and not self.ended:
            self.ended = True
            self.hb.beat(
                max(self.step, 0), status=HEARTBEAT_WORD[State.FAILED if self.failed else State.SUCCEEDED], force=True
            )


def metrics_path(timeline: str) -> Path:
    """slurmgen-123.timeline.jsonl -> slurmgen-123.metrics.jsonl: the job's own file."""
    path = Path(timeline)
    return path.with_name(
        path.name.replace("timeline", "metrics") if "timeline" in path.name else path.name + ".metrics"
    )


_state: Beat | None = None


def beat(step: int | None = None, loss: float | None = None, phase: str | None = None, **metrics: Any) -> None:
    """Report a step done (`step`), a phase (`phase`: imports, rendezvous, checkpoint, eval, end),
    and metrics (`loss`, keywords; rank 0 keeps them). Cheap: throttled to one file write per
    second; a no-op when no launcher set $SLURMGEN_HEARTBEAT_DIR or $SLURMGEN_TIMELINE_FILE."""
    global _state
    if _state is None:
        _state = Beat()
        if _state.hb is not None:
            _install_exit_hooks(_state)
    _state(step, loss, phase, **metrics)


def _install_exit_hooks(state: Beat) -> None:
    previous = sys.excepthook

    def hook(*exc: Any) -> None:
        state.failed = True
        previous(*exc)

    sys.excepthook = hook
    atexit.register(state.end)
