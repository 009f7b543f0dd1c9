"""The trainer's run record (slurmgen.tracking), opened after resume and closed with the exit code.

Why here and not in the loop: the loop calls four hooks (log, checkpoint, finish, state) and
stays readable; everything about names, modes and artifacts lives in this one place.

- Opened after the checkpoint is loaded, because only then is the resume step known (records
  after it are dropped: the resumed job logs them again) and the group of the checkpoint's run
  (kept in the checkpoint, so a resubmitted job with a new Slurm id continues the same run).
- Hyperparameters: the resolved TrainConfig. Hosts: gathered to rank 0 once (one collective on
  every rank, before the first step). Inputs: the token files, hashed by the main run on its
  first attempt only. Outputs: every checkpoint, and the last one again as the final model.
- `--track off` imports nothing from slurmgen.tracking at all.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

from slurmgen.contract import envvars

from . import dist
from .config import ConfigError, TrainConfig
from .env import DistEnv

log = logging.getLogger("slurmgen.train")


class Tracking:
    """A run record, or nothing (`--track off`, or a rank without a run in rank-0 mode)."""

    def __init__(self, run: Any = None, group: str | None = None, main: bool = False):
        self.run, self.group, self.main = run, group, main

    @staticmethod
    def meet(cfg: TrainConfig, env: DistEnv) -> None:
        """The collective of `open`, for ranks that keep their run record through a warm restart
        while the process started in place of the failed rank opens its own."""
        if cfg.track != "off" and env.distributed:
            dist.gather_to_main(socket.gethostname(), env.rank)

    @classmethod
    def open(cls, cfg: TrainConfig, env: DistEnv, resumed: dict | None, step: int) -> Tracking:
        """All ranks call this (it gathers host names); the run is per `cfg.track`."""
        if cfg.track == "off":
            return cls()
        host = socket.gethostname()
        hosts = dist.gather_to_main(host, env.rank) if env.distributed else [host]
        from slurmgen import tracking

        place = {
            k: getattr(env, k)
            for k in (
                "rank",
                "local_rank",
                "node_rank",
                "world_size",
                "local_world_size",
                "master_addr",
                "master_port",
                "backend",
            )
        }
        try:
            run = tracking.init(
                cfg.track_dir or Path(cfg.out_dir) / "tracking",
                mode=cfg.track,
                config=cfg.to_dict(),
                place=place,
                group=(resumed or {}).get("group"),
                name=os.environ.get(envvars.RUN_NAME) or Path(cfg.out_dir).name,
                resume_step=step,
                trackers=cfg.tracker or None,
                hosts=hosts if env.is_main else [host],
            )
        except tracking.TrackingError as exc:  # e.g. a bad SLURMGEN_JOB_TYPE: one line, exit 2
            raise ConfigError([f"run record: {exc}"]) from None
        self = cls(run if run.recording else None, run.group, env.is_main)
        if self.run is not None:
            if env.is_main:
                log.info("run record: %s (%s)", run.dir, f"attempt {self.run.restart_count + 1}")
            if env.is_main and self.run.restart_count == 0:
                for flag, path in (("train-data", cfg.train_data), ("val-data", cfg.val_data)):
                    if path:
                        run.mark_input(run.create_artifact(flag, "dataset").add_file(path))
        return self

    def note(self, key: str, value: Any) -> None:
        """Keep `value` on this attempt's entry of the run record (of every rank that keeps one)."""
        if self.run is not None:
            self.run.note(key, value)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps, so that resuming it continues this run."""
        return {"group": self.group} if self.group else {}

    def log(self, kind: str, step: int, epoch: int, **metrics: float) -> None:
        if self.run is not None:
            self.run.log(type=kind, metrics=metrics, step=step, epoch=epoch)

    def checkpoint(self, path: str | None, step: int, kind: str = "checkpoint") -> None:
        self.mark(self.artifact(path, step, kind))

    def artifact(self, path: str | None, step: int, kind: str = "checkpoint") -> Any:
        """The record of a checkpoint file (it hashes the file, so the checkpoint writer's
        thread calls this, never the training loop); None when this process keeps no record."""
        if self.run is None or not self.main or not path:
            return None
        name = f"ckpt-{step:09d}" if kind == "checkpoint" else "model"
        artifact = self.run.create_artifact(name, kind, metadata={"step": step})
        p = Path(path)  # a sharded checkpoint is a directory: every file of it
        for f in sorted(x for x in p.iterdir() if x.is_file()) if p.is_dir() else [p]:
            artifact.add_file(f)
        return artifact

    def mark(self, artifact: Any) -> None:
        if self.run is not None and artifact is not None:
            self.run.mark_output(artifact)

    def finish(self, code: int) -> str | None:
        """Close the record with the run's exit code (0 finished, 75 preempted, else failed) and
        return its directory. Never raises: a record that cannot be closed must not turn a
        result into a crash."""
        if self.run is None:
            return None
        from slurmgen.tracking import status_for_exit_code

        run, self.run = self.run, None
        try:
            run.finish(status_for_exit_code(code), code)
        except Exception as exc:
            log.warning("run record %s not closed: %s", run.dir, exc)
        return str(run.dir)
