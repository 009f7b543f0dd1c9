"""TensorBoard: scalar event files in RUN_DIR/tensorboard, written with tensorboard's own writer.

`torch.utils.tensorboard` would import torch, and tensorboardX is another dependency; the
`tensorboard` package alone has the event-file writer and the protobufs, which is all a scalar
needs. Tags are `<type>/<metric>` (`train/loss`, `val/loss`), so TensorBoard puts train and val
of a metric side by side. The hyperparameters go in once as a markdown table (text plugin).
A resumed run appends a new event file to the same directory: TensorBoard joins them, and since
the resumed job logs only steps after the checkpoint, no step appears twice.
"""

from __future__ import annotations

import time
from typing import Any

from . import Adapter


class TensorBoardAdapter(Adapter):
    name, extra = "tensorboard", "tensorboard"

    def start(self, info: dict[str, Any], hparams: dict[str, Any], state: dict[str, Any] | None):
        self.need("tensorboard")
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        self._writer = EventFileWriter(str(self.run_dir / "tensorboard"), flush_secs=10)
        rows = "\n".join(f"| {k} | {v} |" for k, v in hparams.items())
        text = (
            f"**{info['name']}** ({info['group']} / {info['job_type']})\n\n"
            f"| hyperparameter | value |\n|---|---|\n{rows}"
        )
        self._text("run/hparams", text, step=0)
        return {"logdir": str(self.run_dir / "tensorboard")}

    def _text(self, tag: str, text: str, step: int) -> None:
        from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2

        meta = self._summary.Value().metadata
        meta.plugin_data.plugin_name = "text"
        tensor = tensor_pb2.TensorProto(
            dtype=7,
            string_val=[text.encode()],  # 7: DT_STRING
            tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[]),
        )
        value = self._summary.Value(tag=tag, metadata=meta, tensor=tensor)
        self._writer.add_event(self._event(wall_time=time.time(), step=step, summary=self._summary(value=[value])))

    def log(self, type: str, step: int, epoch, metrics: dict[str, float | int]) -> None:
        values = [self._summary.Value(tag=f"{type}/{k}", simple_value=float(v)) for k, v in metrics.items()]
        if epoch is not None and type == "train":
            values.append(self._summary.Value(tag="train/epoch", simple_value=float(epoch)))
        self._writer.add_event(self._event(wall_time=time.time(), step=step, summary=self._summary(value=values)))

    def finish(self, status: str) -> None:
        self._writer.flush()
        self._writer.close()
