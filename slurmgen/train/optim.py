"""AdamW with decoupled weight decay on matrices only, and warm-up followed by cosine decay.

The schedule is a plain closure (not a callable object) on purpose: LambdaLR saves the state
of callable objects into its state_dict and restores it on load, which would bring back the
old run's step count if a resumed run is given a new --max-steps. With a closure the schedule
always follows the current configuration and only `last_epoch` comes from the checkpoint.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def lr_at(step: int, lr: float, min_lr: float, warmup: int, total: int) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warm-up, then cosine to min_lr."""
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    span = max(1, total - warmup)
    progress = (step - warmup) / span
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def build_optimizer(
    model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float]
) -> torch.optim.Optimizer:
    """AdamW; biases, norms and other 1-d parameters get no weight decay (as in nanoGPT)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=betas)


def build_scheduler(opt: torch.optim.Optimizer, lr: float, min_lr: float, warmup: int, total: int):
    warmup = min(warmup, max(0, total - 1))

    def factor(step: int) -> float:
        return lr_at(step, lr, min_lr, warmup, total) / lr if lr > 0 else 0.0

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)
