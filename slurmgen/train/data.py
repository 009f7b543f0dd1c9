"""Data: token files, synthetic sets, and a sharded order that is a pure function of the step.

Why no DataLoader and no sampler state: the batch a rank sees at (epoch, step, micro-step) is
computed from (seed, epoch, rank, world size) alone. A checkpoint therefore only needs the step
number to resume the exact data position, every rank reads a disjoint shard without talking to
the others, and two runs with the same seed see the same batches in the same order.

A data set is anything with `__len__` and `__getitem__(i) -> (input, target)`; one that also
has `get_batch(indices) -> (inputs, targets)` is read a batch at a time (the token file does,
so a memmap is sliced instead of indexed sample by sample).
"""

from __future__ import annotations

import os
from typing import Any, Protocol

import numpy as np
import torch


class DataError(ValueError):
    """The data cannot serve this run (unreadable file, too few samples): a user error."""


class Dataset(Protocol):
    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> Any: ...


class TokenFile:
    """A nanoGPT-style token file: uint16 tokens back to back, read through a memmap.

    Sample i is the window tokens[i*T : i*T + T + 1] (input = first T, target = last T), so an
    epoch visits every token once. The file is opened read-only and never loaded whole.
    """

    def __init__(self, path: str | os.PathLike[str], block_size: int, vocab_size: int | None = None):
        self.path = os.fspath(path)
        size = os.path.getsize(self.path)
        if size % 2:
            raise DataError(f"{self.path}: size {size} is odd, not a uint16 token file")
        if size // 2 < block_size + 1:
            raise DataError(f"{self.path}: {size // 2} tokens, fewer than one block of {block_size + 1}")
        self.tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        self.block_size = block_size
        self.n = (len(self.tokens) - 1) // block_size
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.get_batch(np.array([i]))
        return x[0], y[0]

    def get_batch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.block_size
        rows = np.stack([self.tokens[i * t : i * t + t + 1] for i in indices]).astype(np.int64)
        if self.vocab_size is not None and rows.size and rows.max() >= self.vocab_size:
            raise DataError(f"{self.path}: token {int(rows.max())} is not below --vocab-size {self.vocab_size}")
        batch = torch.from_numpy(rows)
        return batch[:, :-1], batch[:, 1:]


class SyntheticTokens:
    """Sequences from a fixed random Markov chain: learnable, so the loss visibly falls.

    Each token has 4 possible successors; the chain and the samples follow from the seed, so
    every rank builds the identical set without I/O. `split` picks another sample set from
    the same chain (the validation set).
    """

    def __init__(self, n: int, block_size: int, vocab_size: int, seed: int, split: int = 0):
        successors = np.random.default_rng([seed, 7]).integers(0, vocab_size, size=(vocab_size, 4))
        rng = np.random.default_rng([seed, 8, split])  # train and val: same chain, other samples
        seq = np.empty((n, block_size + 1), dtype=np.int64)
        seq[:, 0] = rng.integers(0, vocab_size, size=n)
        choice = rng.integers(0, 4, size=(n, block_size))
        for t in range(block_size):
            seq[:, t + 1] = successors[seq[:, t], choice[:, t]]
        self.data = torch.from_numpy(seq)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[i, :-1], self.data[i, 1:]

    def get_batch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.data[torch.from_numpy(np.asarray(indices, dtype=np.int64))]
        return rows[:, :-1], rows[:, 1:]


class SyntheticClasses:
    """Gaussian inputs labelled by a fixed random linear map: the tiny MLP's task."""

    def __init__(self, n: int, n_in: int, n_classes: int, seed: int, split: int = 0):
        w = torch.randn(n_in, n_classes, generator=torch.Generator().manual_seed(seed * 7919 + 11))
        self.x = torch.randn(n, n_in, generator=torch.Generator().manual_seed(seed * 7919 + 13 + split))
        self.y = (self.x @ w).argmax(dim=1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]

    def get_batch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(np.asarray(indices, dtype=np.int64))
        return self.x[idx], self.y[idx]


def fetch(dataset: Any, indices: np.ndarray) -> Any:
    """One batch from any data set: its own get_batch if it has one, else default collation."""
    if hasattr(dataset, "get_batch"):
        return dataset.get_batch(indices)
    from torch.utils.data import default_collate

    return default_collate([dataset[int(i)] for i in indices])


def epoch_shard(n: int, world: int, rank: int, seed: int, epoch: int) -> np.ndarray:
    """This rank's sample indices for one epoch: a seeded permutation, dealt round-robin.

    Every rank gets exactly n // world indices (the remainder is dropped, so all ranks take the
    same number of steps and no collective waits for a rank that ran out of data), and the
    shards of different ranks are disjoint.
    """
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return perm[rank::world][: n // world]


class ShardedBatches:
    """Batch (epoch, step, micro) of one rank, deterministic and resumable from the step alone."""

    def __init__(self, dataset: Any, world: int, rank: int, batch_size: int, grad_accum: int, seed: int):
        self.dataset, self.world, self.rank = dataset, world, rank
        self.batch_size, self.grad_accum, self.seed = batch_size, grad_accum, seed
        self.n = len(dataset)
        per_rank = self.n // world
        self.steps_per_epoch = per_rank // (batch_size * grad_accum)
        if self.steps_per_epoch < 1:
            raise DataError(
                f"the training set has {self.n} samples: too few for {world} process(es) x "
                f"--batch-size {batch_size} x --grad-accum {grad_accum} (need {world * batch_size * grad_accum})"
            )
        self._cached: tuple[int, np.ndarray] | None = None

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, step within the epoch) of a global optimizer step."""
        return divmod(step, self.steps_per_epoch)

    def indices(self, step: int, micro: int) -> np.ndarray:
        epoch, in_epoch = self.position(step)
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, epoch_shard(self.n, self.world, self.rank, self.seed, epoch))
        start = (in_epoch * self.grad_accum + micro) * self.batch_size
        return self._cached[1][start : start + self.batch_size]

    def batch(self, step: int, micro: int) -> Any:
        return fetch(self.dataset, self.indices(step, micro))


def eval_indices(n: int, world: int, rank: int, batch_size: int, i: int) -> np.ndarray:
    """The i-th evaluation batch of a rank: the same fixed subset every evaluation, so val losses
    from different steps compare like with like; ranks take disjoint strided slices."""
    mine = np.arange(rank, n, world)
    if len(mine) == 0:
        mine = np.arange(n)
    start = (i * batch_size) % len(mine)
    return np.take(mine, np.arange(start, start + batch_size), mode="wrap")


def build_datasets(cfg: Any) -> tuple[Any, Any]:
    """(train, val) for the bundled models, from the config: token files or synthetic data."""
    vocab = cfg.effective_vocab()
    if cfg.model == "gpt":
        train: TokenFile | SyntheticTokens
        val: TokenFile | SyntheticTokens | None
        if cfg.train_data:
            train = TokenFile(cfg.train_data, cfg.block_size, vocab)
            val = TokenFile(cfg.val_data, cfg.block_size, vocab) if cfg.val_data else None
        else:
            train = SyntheticTokens(cfg.synthetic_samples, cfg.block_size, vocab, cfg.seed)
            val = SyntheticTokens(max(64, cfg.synthetic_samples // 8), cfg.block_size, vocab, cfg.seed, split=1)
        return train, val
    if cfg.train_data:
        raise DataError("--train-data is a token file for --model gpt; --model mlp uses synthetic data")
    return (
        SyntheticClasses(cfg.synthetic_samples, cfg.mlp_in, cfg.mlp_classes, cfg.seed),
        SyntheticClasses(max(64, cfg.synthetic_samples // 8), cfg.mlp_in, cfg.mlp_classes, cfg.seed, split=1),
    )
