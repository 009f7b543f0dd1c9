"""The throwaway backward of a resumed run changes DDP's gradient buckets and nothing else.

In-process, on a gloo group of one: the reducer keeps its bucket logic at any world size. The
bit-exactness it buys at three ranks is proven in tests/integration/test_train_resume_ranks.py;
here, that it leaves no trace (random streams, batch norm statistics, gradients) and that torch
still lays the buckets out anew at the next forward, which is what the trainer relies on.
"""

import pytest
import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from slurmgen.train.config import TrainConfig
from slurmgen.train.data import build_datasets
from slurmgen.train.env import LaunchFlags, detect
from slurmgen.train.trainer import Trainer


@pytest.fixture
def group_of_one():
    tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
    yield
    tdist.destroy_process_group()


def test_settling_the_buckets_leaves_no_trace(tmp_path, group_of_one):
    cfg = TrainConfig(
        out_dir=str(tmp_path), model="mlp", mlp_in=8, mlp_classes=4, synthetic_samples=64, max_steps=4, progress="none"
    ).validate()
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.5), nn.Linear(16, 4))
    trainer = Trainer(
        model, build_datasets(cfg)[0], detect({}, LaunchFlags(backend="gloo"), 0), cfg, loss_fn=F.cross_entropy
    )
    ddp = nn.parallel.DistributedDataParallel(trainer.model)
    names, layouts = {id(p): n for n, p in model.named_parameters()}, []

    def observe(state, bucket):  # the allreduce as usual, noting which gradients the bucket holds, in order
        layouts.append([names[id(p)] for p in bucket.parameters()])
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, observe)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()

    trainer._settle_buckets(ddp)

    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "parameters or batch norm statistics moved"
    assert torch.equal(torch.get_rng_state(), rng), "the dropout stream moved"
    assert all(p.grad is None for p in model.parameters())
    ddp(torch.randn(4, 8)).sum().backward()
    settling, first_step = layouts
    assert settling == [n for n, _ in model.named_parameters()], "DDP no longer starts in parameter order"
    assert sorted(first_step) == sorted(settling) and first_step[0].startswith("3."), (
        f"the first step after settling should run on buckets laid out in the order gradients became ready "
        f"(the last layer's first): {first_step}"
    )
