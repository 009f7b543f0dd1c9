"""A user's own model through `train_ddp(..., strategy="fsdp", shard_units=...)`: 2 real gloo
ranks, FSDP2 units of the user's choosing, the same sharded checkpoints as the bundled GPT."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from helpers import run_ranks
from torch import nn

from slurmgen.train import fsdp
from slurmgen.train.checkpoint import sharded


class Stage(nn.Module):
    """A user's block, kept in a list whose name the default (`blocks`/`layers`/`h`) misses."""

    def __init__(self, width: int):
        super().__init__()
        self.inner, self.norm = nn.Linear(width, width), nn.LayerNorm(width)

    def forward(self, x):
        return x + torch.tanh(self.inner(self.norm(x)))


class Net(nn.Module):
    def __init__(self, width: int = 8, depth: int = 3):
        super().__init__()
        self.stem, self.head = nn.Linear(2, width), nn.Linear(width, 1)
        self.stages = nn.ModuleList(Stage(width) for _ in range(depth))

    def forward(self, x):
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
        return self.head(x)


def stages_of(model: Net) -> list[nn.Module]:
    return list(model.stages)


def data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(64, 2, generator=g)
    return [(x, x.prod(dim=0, keepdim=True)) for x in xs]


def train_custom(rank: int, world: int, out: str, units) -> dict:
    from slurmgen.train import train_ddp

    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="1",
        SLURMGEN_HEARTBEAT_DIR=f"{out}-heartbeats",
    )
    config = {
        "out_dir": out,
        "strategy": "fsdp",
        "batch_size": 4,
        "lr": 0.01,
        "save_every": 2,
        "eval_every": 0,
        "progress": "none",
        "threads": 1,
    }
    torch.manual_seed(rank)  # different on purpose: sharding starts every rank from rank 0's weights
    model = Net()
    first = train_ddp(
        model=model, train_dataset=data(), loss_fn=F.mse_loss, config=config, max_steps=4, shard_units=units
    )
    wrapped = [type(m).__name__ for m in model.modules() if fsdp.is_sharded(m)]
    full = fsdp.full_state_dict(model)
    again = train_ddp(
        model=Net(), train_dataset=data(), loss_fn=F.mse_loss, config=config, max_steps=6, shard_units=units
    )
    return {
        "codes": (first.exit_code, again.exit_code),
        "steps": (first.step, again.step),
        "wrapped": wrapped,
        "full": full,
        "finite": all(torch.isfinite(v).all() for v in full.values()),
    }


@pytest.mark.parametrize("units", [[Stage], stages_of], ids=["classes", "function"])
def test_a_custom_model_gets_fsdp2_units_of_its_choosing_and_sharded_checkpoints(tmp_path, units):
    out = tmp_path / "run"
    results = run_ranks(2, tmp_path / "ranks", train_custom, str(out), units)
    for r in results:
        assert r["codes"] == (0, 0) and r["steps"] == (4, 6) and r["finite"]
        assert sorted(r["wrapped"]) == ["FSDPNet", "FSDPStage", "FSDPStage", "FSDPStage"]  # three units, the root
    # The checkpoint of step 4 is a sharded one and holds exactly the model the first run ended with.
    step4 = out / "checkpoints" / sharded.checkpoint_name(4)
    assert (step4 / "__0_0.distcp").is_file() and (step4 / "__1_0.distcp").is_file()
    saved = sharded.full_model_state(step4)
    assert (
        all(torch.equal(saved[k], v) for k, v in results[0]["full"].items())
        and saved.keys() == results[0]["full"].keys()
    )
    assert sharded.newest_good(out)[1]["step"] == 6  # the second call resumed at 4 and went on


def test_units_are_sharded_innermost_first_and_strays_are_refused():
    net = Net()
    nested = nn.Sequential(net, nn.Linear(1, 1))
    assert fsdp.units_of(nested, [Net, Stage]) == [*reversed(list(net.stages)), net]
    assert fsdp.units_of(nested, lambda m: [net, net.stages[0]]) == [net.stages[0], net]
    assert fsdp.units_of(Net(), None) == []  # no blocks/layers/h list: only the root
    with pytest.raises(ValueError, match="not submodules of the model: Linear"):
        fsdp.units_of(net, lambda m: [nn.Linear(1, 1)])
    with pytest.raises(ValueError, match="shard_units must be"):
        fsdp.units_of(net, 3)
