"""Bring your own model and data to slurmgen's DDP trainer.

    python examples/train_custom_model.py                          # one process
    torchrun --nproc-per-node 2 examples/train_custom_model.py     # two processes, one machine
    slurmgen create --nodes 2 --gpus 4 -- python examples/train_custom_model.py --out-dir runs/sine

Whatever started it, the trainer finds its rank, shards the data, checkpoints into --out-dir
(rank 0 only) and resumes from there when run again. The model learns sin(x) on [-3, 3].
"""

import argparse

import torch
from torch import nn

from slurmgen.train import TrainConfig, finish, train_ddp


class Sine(torch.utils.data.Dataset):
    """Map-style data set: items are (input, target) pairs; any such data set works."""

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.rand(n, 1, generator=g) * 6 - 3
        self.y = torch.sin(self.x)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out-dir", default="runs/sine")
    p.add_argument("--max-steps", type=int, default=300)
    args = p.parse_args()
    torch.manual_seed(0)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    model = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    config = TrainConfig(
        out_dir=args.out_dir,
        max_steps=args.max_steps,
        batch_size=32,
        lr=1e-2,
        warmup_steps=20,
        weight_decay=0.0,
        eval_every=100,
        log_every=50,
        progress="lines",
    )
    # The model returns predictions, so say how to turn them into a loss.
    result = train_ddp(
        model=model,
        train_dataset=Sine(4096, seed=1),
        eval_dataset=Sine(512, seed=2),
        loss_fn=nn.functional.mse_loss,
        config=config,
    )
    finish(result.exit_code)  # barrier, tear down the process group, exit with the run's code


if __name__ == "__main__":
    main()
