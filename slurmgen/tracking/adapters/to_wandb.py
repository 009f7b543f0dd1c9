"""Weights & Biases: one W&B run per slurmgen run, offline unless WANDB_MODE says otherwise.

Offline by default because a training job must not depend on (or, on many clusters, cannot
reach) a server: W&B writes RUN_DIR/wandb/offline-run-*, and `wandb sync` uploads it later from a
login node. Error reports (Sentry) are switched off in offline mode too, so nothing leaves the
machine. The W&B run id is derived from the slurmgen run id, so a requeued attempt writes to the
same W&B run (`resume="allow"`). Metrics are `<type>/<metric>` at the same global step; W&B
drops a record whose step is below one already logged (any type), so log val at the current step.
Output artifacts are references to the files (not copies, checkpoints are big), with our sha256
in the metadata; W&B's own checksum is skipped so a checkpoint is not read twice. Inputs go into
the run's config (`inputs/<name>`): W&B's use_artifact needs a server, offline it refuses.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

from slurmgen.contract import exitcodes

from . import Adapter


def wandb_id(run_id: str) -> str:
    """W&B ids allow letters, digits, '-', '_' and at most 64 characters."""
    text = re.sub(r"[^A-Za-z0-9_-]+", "--", run_id)
    return text if len(text) <= 64 else text[:55] + "-" + hashlib.sha1(run_id.encode()).hexdigest()[:8]


class WandbAdapter(Adapter):
    name, extra = "wandb", "wandb"

    def start(self, info: dict[str, Any], hparams: dict[str, Any], state: dict[str, Any] | None):
        wandb = self.need("wandb")
        self._wandb = wandb
        mode = os.environ.get("WANDB_MODE", "offline")
        if mode in ("offline", "disabled"):
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        settings = wandb.Settings(
            mode=mode, silent=True, console="off", x_disable_stats=True, x_disable_machine_info=True
        )
        run_id = (state or {}).get("id") or wandb_id(info["id"])
        self._run = wandb.init(
            dir=str(self.run_dir),
            project=os.environ.get("WANDB_PROJECT", "slurmgen"),
            id=run_id,
            resume="allow",
            name=info["name"],
            group=info["group"],
            job_type=info["job_type"],
            tags=info.get("tags") or None,
            notes=info.get("description") or None,
            config=hparams,
            reinit="create_new",
            settings=settings,
        )
        self._run.config.update({"slurmgen/restart_count": info["restart_count"]}, allow_val_change=True)
        return {"id": run_id, "mode": mode, "dir": str(self.run_dir / "wandb")}

    def log(self, type: str, step: int, epoch, metrics: dict[str, float | int]) -> None:
        data: dict[str, Any] = {f"{type}/{k}": v for k, v in metrics.items()}
        if epoch is not None:
            data["epoch"] = epoch
        self._run.log(data, step=step)

    def artifact(self, record: dict[str, Any]) -> None:
        if record["role"] == "input":  # use_artifact needs a server; the inputs go into the config instead
            files = [{k: f.get(k) for k in ("name", "path", "sha256", "size")} for f in record["files"]]
            self._run.config.update(
                {f"inputs/{record['name']}": {"type": record["type"], "files": files}}, allow_val_change=True
            )
            return
        art = self._wandb.Artifact(
            re.sub(r"[^A-Za-z0-9_.-]+", "-", record["name"]),
            type=record["type"],
            description=record.get("description"),
            metadata={**(record.get("metadata") or {}), "files": record["files"]},
        )
        for entry in record["files"]:
            art.add_reference(f"file://{entry['path']}", name=entry["name"], checksum=False)
        self._run.log_artifact(art)

    def finish(self, status: str) -> None:
        self._run.finish(exit_code={"finished": exitcodes.OK, "preempted": exitcodes.PREEMPTED}.get(status, 1))
