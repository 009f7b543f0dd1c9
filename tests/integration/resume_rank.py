"""One rank of a small MLP run through the public API, which writes its final parameters to a file.

    python resume_rank.py OUT_DIR PARAMS_FILE

Why not `python -m slurmgen.train`: only rank 0 writes checkpoints, and a test of how every rank
got its state must see every rank's parameters. Started with the torchrun variables.
"""

import sys

import torch

from slurmgen.train import TrainConfig, finish, train_ddp
from slurmgen.train.data import build_datasets
from slurmgen.train.models import build_model

out_dir, params_file = sys.argv[1:3]
cfg = TrainConfig(
    out_dir=out_dir,
    model="mlp",
    mlp_in=8,
    mlp_hidden=16,
    mlp_classes=4,
    synthetic_samples=256,
    dropout=0.2,
    max_steps=8,
    save_every=4,
    keep_last=2,
    log_every=4,
    eval_every=0,
    warmup_steps=2,
    progress="none",
    backend="gloo",
    threads=1,
).validate()
torch.manual_seed(cfg.seed)
model = build_model(cfg)
train, val = build_datasets(cfg)
result = train_ddp(model, train, val, config=cfg)
torch.save({"step": result.step, "model": model.state_dict()}, params_file)
finish(result.exit_code)
