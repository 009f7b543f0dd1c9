"""SwanLab: one SwanLab experiment per slurmgen run, in SwanLab's offline mode unless
SWANLAB_MODE says otherwise (`swanlab sync RUN_DIR/swanlog/run-*` uploads it later).

group and job_type map one to one (SwanLab's own distributed-training model is this one:
rank 0 only, or one experiment per process tied by group and job type). SwanLab is told not
to capture the terminal, sample hardware, run `pip freeze` or read git at start: those cost
seconds on every rank, and the slurmgen record already holds git and versions. Artifacts
(name, type, sha256 of each file) go into the experiment's config: SwanLab has no references
to files, and copying a checkpoint is not what a record is for.
"""

from __future__ import annotations

import os
import re
from typing import Any

from . import Adapter

STATE = {"finished": "success", "failed": "crashed", "preempted": "aborted"}
SETTINGS = {
    "interactive": False,
    "terminal": {"proxy_type": "none"},
    "probe": {"hardware": False, "requirements": False, "monitor": False, "git": False, "runtime": False},
}


class SwanLabAdapter(Adapter):
    name, extra = "swanlab", "swanlab"

    def start(self, info: dict[str, Any], hparams: dict[str, Any], state: dict[str, Any] | None):
        swanlab = self.need("swanlab")
        mode = os.environ.get("SWANLAB_MODE", "offline")
        run_id = (state or {}).get("id") or re.sub(r"[^A-Za-z0-9]+", "_", info["id"]).strip("_")[:64]
        self._run = swanlab.init(
            mode=mode,
            log_dir=str(self.run_dir / "swanlog"),
            project=os.environ.get("SWANLAB_PROJECT", "slurmgen"),
            name=info["name"],
            description=info.get("description") or None,
            group=info["group"],
            job_type=info["job_type"],
            tags=info.get("tags") or None,
            config={**hparams, "slurmgen/restart_count": info["restart_count"]},
            id=run_id,
            resume="allow",
            reinit=True,
            settings=SETTINGS,
        )
        return {"id": run_id, "mode": mode, "dir": str(self.run_dir / "swanlog")}

    def log(self, type: str, step: int, epoch, metrics: dict[str, float | int]) -> None:
        data: dict[str, Any] = {f"{type}/{k}": v for k, v in metrics.items()}
        if epoch is not None and type == "train":
            data["train/epoch"] = epoch
        self._run.log(data, step=step)

    def artifact(self, record: dict[str, Any]) -> None:
        files = [{k: f.get(k) for k in ("name", "path", "sha256", "size")} for f in record["files"]]
        self._run.config.update({f"{record['role']}s/{record['name']}": {"type": record["type"], "files": files}})

    def finish(self, status: str) -> None:
        self._run.finish(state=STATE[status])
