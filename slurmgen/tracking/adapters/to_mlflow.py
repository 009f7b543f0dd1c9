"""MLflow: one MLflow run per slurmgen run, in a local file store unless MLFLOW_TRACKING_URI is set.

The default store is `file:<root>/mlruns` next to the run records, so `mlflow ui
--backend-store-uri <root>/mlruns` shows every run of a directory with no server during
training. The explicit `MlflowClient` (not the fluent `mlflow.start_run`) keeps no global
"active run", so several runs in one process and per-process runs on one node do not mix.
The MLflow run id is kept in run.json, so a requeued attempt continues the same MLflow run.
Parameters are logged once (MLflow refuses to change one); artifacts are logged as a small JSON
record (name, type, sha256, path), never as copies of the checkpoint files.
"""

from __future__ import annotations

import os
import time
from typing import Any

from . import Adapter

STATUS = {"finished": "FINISHED", "failed": "FAILED", "preempted": "KILLED"}


class MlflowAdapter(Adapter):
    name, extra = "mlflow", "mlflow"

    def start(self, info: dict[str, Any], hparams: dict[str, Any], state: dict[str, Any] | None):
        # MLflow 3 reports usage to its makers unless told not to; a record kept on the cluster
        # sends nothing anywhere (set MLFLOW_DISABLE_TELEMETRY=false to allow it). Read at import.
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        self.need("mlflow")
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.tracking import MlflowClient

        self._metric = Metric
        uri = (
            (state or {}).get("tracking_uri")
            or os.environ.get("MLFLOW_TRACKING_URI")
            or f"file:{(self.root / 'mlruns').absolute()}"
        )
        if uri.startswith("file:"):
            # MLflow 3 keeps its file store in "maintenance mode" behind this switch; it is the one
            # backend that needs no server and no database, and takes concurrent writers (ranks).
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = client = MlflowClient(tracking_uri=uri)
        experiment_name = (state or {}).get("experiment") or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "slurmgen"
        if state and state.get("run_id"):
            self.run_id = state["run_id"]
            client.update_run(self.run_id, status="RUNNING")
            client.set_tag(self.run_id, "slurmgen.restart_count", str(info["restart_count"]))
        else:
            experiment = client.get_experiment_by_name(experiment_name)
            if experiment is None:
                try:
                    experiment_id = client.create_experiment(experiment_name)
                except Exception:  # another rank created it a moment ago
                    made = client.get_experiment_by_name(experiment_name)
                    if made is None:  # no: the creation failed for another reason
                        raise
                    experiment_id = made.experiment_id
            else:
                experiment_id = experiment.experiment_id
            tags = {
                "slurmgen.id": info["id"],
                "slurmgen.group": info["group"],
                "slurmgen.job_type": info["job_type"],
                "slurmgen.dir": str(self.run_dir.absolute()),
                "slurmgen.restart_count": str(info["restart_count"]),
            }
            if info.get("description"):
                tags["mlflow.note.content"] = info["description"]
            for tag in info.get("tags") or []:
                tags[f"tag.{tag}"] = "true"
            self.run_id = client.create_run(experiment_id, run_name=info["name"], tags=tags).info.run_id
            params = [Param(k[:250], str(v)[:6000]) for k, v in hparams.items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
                client.log_batch(self.run_id, params=params[i : i + 100])
            client.log_batch(
                self.run_id, tags=[RunTag("slurmgen.git_commit", str((info.get("git") or {}).get("commit")))]
            )
        return {"run_id": self.run_id, "tracking_uri": uri, "experiment": experiment_name}

    def log(self, type: str, step: int, epoch, metrics: dict[str, float | int]) -> None:
        now = int(time.time() * 1000)
        items = [self._metric(f"{type}/{k}", float(v), now, step) for k, v in metrics.items()]
        if epoch is not None and type == "train":
            items.append(self._metric("epoch", float(epoch), now, step))
        self.client.log_batch(self.run_id, metrics=items)

    def artifact(self, record: dict[str, Any]) -> None:
        self.client.log_dict(self.run_id, record, f"slurmgen/{record['role']}s/{record['name']}.json")

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=STATUS[status])
