"""A Lightning program (DDP on CPU, gloo) as a user brings it, with the one callback that gives it
slurmgen's heartbeats, timeline, metrics and curves (marked `slurmgen:`). The launcher's
environment (RANK, LOCAL_RANK, NODE_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT) is
all it reads: Lightning starts no process of its own when LOCAL_RANK is set.

    python examples/lightning_ddp.py [max_steps]
"""

import os
import sys

import torch
from pytorch_lightning import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from slurmgen.integrations.lightning import SlurmgenCallback  # slurmgen: line 1 of 2


class Regression(LightningModule):
    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def main(max_steps: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    trainer = Trainer(
        accelerator="cpu",
        devices=per_node,
        num_nodes=int(os.environ.get("WORLD_SIZE", "1")) // per_node,
        strategy="ddp",
        max_steps=max_steps,
        limit_val_batches=2,
        val_check_interval=max_steps // 2,
        check_val_every_n_epoch=None,  # val_check_interval counts steps across epochs
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        default_root_dir=os.environ.get("OUT_DIR", "lightning_out"),
        callbacks=[SlurmgenCallback()],  # slurmgen: line 2 of 2
    )
    trainer.fit(Regression(), DataLoader(data, batch_size=16), DataLoader(data, batch_size=16))
    print(f"rank {trainer.global_rank} of {trainer.world_size} node {trainer.node_rank}: done", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
