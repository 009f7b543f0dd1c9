"""Data order is a pure function of (seed, epoch, rank, world, step): disjoint, complete, repeatable."""

import numpy as np
import pytest
import torch

from slurmgen.train.data import (
    DataError,
    ShardedBatches,
    SyntheticClasses,
    SyntheticTokens,
    TokenFile,
    epoch_shard,
    eval_indices,
    fetch,
)


@pytest.mark.parametrize("n,world", [(100, 1), (100, 3), (64, 4), (7, 2)])
def test_epoch_shards_are_disjoint_equal_and_nearly_complete(n, world):
    shards = [epoch_shard(n, world, r, seed=5, epoch=2) for r in range(world)]
    assert {len(s) for s in shards} == {n // world}
    together = np.concatenate(shards)
    assert len(set(together.tolist())) == len(together) == (n // world) * world
    assert set(together.tolist()) <= set(range(n))


def test_epoch_order_depends_on_seed_and_epoch_only():
    a = epoch_shard(50, 2, 0, seed=1, epoch=0)
    assert np.array_equal(a, epoch_shard(50, 2, 0, seed=1, epoch=0))
    assert not np.array_equal(a, epoch_shard(50, 2, 0, seed=1, epoch=1))
    assert not np.array_equal(a, epoch_shard(50, 2, 0, seed=2, epoch=0))


def test_sharded_batches_walk_the_shard_then_the_next_epoch():
    ds = SyntheticClasses(40, 4, 3, seed=0)
    b = ShardedBatches(ds, world=2, rank=1, batch_size=4, grad_accum=2, seed=9)
    assert b.steps_per_epoch == 2  # 20 per rank // (4 * 2)
    shard = epoch_shard(40, 2, 1, 9, 0)
    seen = np.concatenate([b.indices(s, m) for s in range(2) for m in range(2)])
    assert np.array_equal(seen, shard[:16])
    assert b.position(5) == (2, 1)
    assert np.array_equal(b.indices(2, 0), epoch_shard(40, 2, 1, 9, 1)[:4])
    x, y = b.batch(0, 0)
    assert x.shape == (4, 4) and y.shape == (4,)


def test_too_little_data_is_a_clear_error():
    with pytest.raises(DataError, match="too few for 4 process"):
        ShardedBatches(SyntheticClasses(10, 2, 2, 0), world=4, rank=0, batch_size=3, grad_accum=1, seed=0)


def test_token_file_windows(tmp_path):
    path = tmp_path / "train.bin"
    np.arange(21, dtype=np.uint16).tofile(path)
    tf = TokenFile(path, block_size=4)
    assert len(tf) == 5
    x, y = tf.get_batch(np.array([0, 2]))
    assert x.tolist() == [[0, 1, 2, 3], [8, 9, 10, 11]] and y.tolist() == [[1, 2, 3, 4], [9, 10, 11, 12]]
    assert x.dtype == torch.int64
    assert tf[4][1].tolist() == [17, 18, 19, 20]


def test_token_file_errors(tmp_path):
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"abc")
    with pytest.raises(DataError, match="odd"):
        TokenFile(odd, 4)
    small = tmp_path / "small.bin"
    np.arange(3, dtype=np.uint16).tofile(small)
    with pytest.raises(DataError, match="fewer than one block"):
        TokenFile(small, 4)
    big = tmp_path / "big.bin"
    np.full(20, 300, dtype=np.uint16).tofile(big)
    with pytest.raises(DataError, match="not below --vocab-size 256"):
        TokenFile(big, 4, vocab_size=256).get_batch(np.array([0]))


def test_synthetic_sets_are_deterministic_and_share_the_task():
    a, b = SyntheticTokens(8, 16, 50, seed=3), SyntheticTokens(8, 16, 50, seed=3)
    assert torch.equal(a.data, b.data)
    val = SyntheticTokens(8, 16, 50, seed=3, split=1)
    assert not torch.equal(a.data, val.data)
    # same Markov chain: every transition seen in val is a transition of the train chain's table
    succ = np.random.default_rng([3, 7]).integers(0, 50, size=(50, 4))
    rows = val.data.numpy()
    assert all(rows[i, t + 1] in succ[rows[i, t]] for i in range(8) for t in range(16))
    c = SyntheticClasses(16, 4, 3, seed=1)
    assert torch.equal(c.x, SyntheticClasses(16, 4, 3, seed=1).x)


def test_fetch_collates_plain_datasets():
    data = [(torch.tensor([float(i)]), torch.tensor(i)) for i in range(6)]
    x, y = fetch(data, np.array([1, 4]))
    assert x.tolist() == [[1.0], [4.0]] and y.tolist() == [1, 4]


def test_eval_indices_fixed_and_disjoint():
    r0 = [eval_indices(10, 2, 0, 3, i).tolist() for i in range(2)]
    r1 = [eval_indices(10, 2, 1, 3, i).tolist() for i in range(2)]
    assert r0 == [[0, 2, 4], [6, 8, 0]] and r1 == [[1, 3, 5], [7, 9, 1]]
