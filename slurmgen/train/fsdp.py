"""FSDP2 for the trainer: shard a model per block and at the root, step it, clip its gradients.

Why each choice:

- Initialisation. The model is built whole, on the CPU, on every rank; rank 0's values are then
  broadcast (as DDP does when it wraps a model) and only then sharded. Building on the meta
  device and calling `reset_parameters()` on the sharded DTensors is what pytorch/examples does,
  but DTensor's random operators are incomplete on a CPU mesh in torch 2.13 and left parameters
  NaN/inf (project notes, fact 23). Broadcasting before sharding is exact on any device and
  gives the same full weights for every world size, so a 2-rank and a 4-rank run start from the
  same model, and an FSDP run from the same model as a DDP run with the same seed. The price is
  one full copy of the model per rank for the moment of sharding, which is what this trainer's
  models fit; a model that does not fit once per host needs meta-device init with a device mesh
  that has working random operators (CUDA).
- Units. Each transformer block is one FSDP unit (its parameters are gathered just before its
  forward and freed after), and the root holds the rest (embeddings, tied head, final norm).
  A custom model names its units with `units` (`train_ddp(..., shard_units=...)`): module
  classes (every submodule of one of them is a unit) or a function of the model returning the
  unit modules; by default the entries of a `blocks`/`layers`/`h` ModuleList. Units are
  sharded innermost first, whatever order they were given in, as FSDP2 requires.
- Mixed precision from `--dtype`: parameters are gathered and computed in that dtype, gradients
  reduced in float32 (sums of many ranks' low-precision gradients lose the bits that matter).
- Gradient accumulation: `no_sync(model)` turns off the reduce-scatter of all micro-steps but
  the last, as DDP's `no_sync()` does for its all-reduce.
- Clipping: `clip_grad_norm_` computes the norm of sharded gradients as one all-reduce of the
  shards' squared norms (torch's own clip returns a DTensor for them; the scale is applied to
  every shard locally).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as tdist
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

PARAM_DTYPES = {"float32": None, "float16": torch.float16, "bfloat16": torch.bfloat16}
_UNIT_LISTS = ("blocks", "layers", "h")
# What `shard(units=...)` and `train_ddp(shard_units=...)` take: see units_of.
Units = type[nn.Module] | Sequence[type[nn.Module]] | Callable[[nn.Module], Iterable[nn.Module]] | None


def broadcast_from_rank0(model: nn.Module) -> None:
    """Every parameter and buffer of `model` becomes rank 0's (before sharding: whole tensors)."""
    if not (tdist.is_available() and tdist.is_initialized()) or tdist.get_world_size() == 1:
        return
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tdist.broadcast(tensor.data, src=0)


def default_units(model: nn.Module) -> list[nn.Module]:
    """The modules sharded one by one: the entries of the model's block list, if it has one."""
    for name in _UNIT_LISTS:
        found = getattr(model, name, None)
        if isinstance(found, nn.ModuleList):
            return list(found)
    return []


def units_of(model: nn.Module, units: Units) -> list[nn.Module]:
    """The modules sharded one by one, innermost first: the default (`default_units`) for
    None, every submodule of the given class(es), or what `units(model)` returns. A returned
    module that is not inside `model` is a ValueError naming it."""
    if units is None:
        chosen = default_units(model)
    elif isinstance(units, type) or (isinstance(units, Sequence) and all(isinstance(u, type) for u in units)):
        classes = (units,) if isinstance(units, type) else tuple(units)
        chosen = [m for m in model.modules() if isinstance(m, classes) and m is not model]
    elif callable(units):
        chosen = list(units(model))
    else:
        raise ValueError(f"shard_units must be module classes or a function of the model (got {units!r})")
    # Descendants before their ancestors: the reverse of modules()' pre-order.
    order = {id(m): i for i, m in enumerate(reversed(list(model.modules())))}
    strays = [type(m).__name__ for m in chosen if id(m) not in order or m is model]
    if strays:
        raise ValueError(f"shard_units gave modules that are not submodules of the model: {', '.join(strays)}")
    return sorted({id(m): m for m in chosen}.values(), key=lambda m: order[id(m)])


def mixed_precision(dtype: str):
    """FSDP2's policy for `--dtype`: compute in it, reduce gradients in float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=PARAM_DTYPES[dtype], reduce_dtype=torch.float32)


def shard(model: nn.Module, dtype: str = "float32", units: Units = None) -> nn.Module:
    """`model`, made identical on every rank, then sharded with FSDP2 per unit (`units_of`)
    and at the root.

    Must run after `init_process_group`; the mesh is the whole world on the model's device."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    chosen = units_of(model, units)
    device = next(model.parameters()).device
    broadcast_from_rank0(model)
    mesh = init_device_mesh(device.type, (tdist.get_world_size(),))
    policy = mixed_precision(dtype)
    for unit in chosen:
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def no_sync(model: nn.Module, sync: bool) -> Iterator[None]:
    """Inside, backward of a sharded model accumulates local gradients without reduce-scatter
    unless `sync`; the flag is back on afterwards (also on error). A no-op for other models."""
    if sync or not is_sharded(model):
        yield
        return
    sharded = cast("FSDPModule", model)  # is_sharded said so
    sharded.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        sharded.set_requires_gradient_sync(True)


def clip_grad_norm_(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip the global gradient norm of plain or sharded parameters; the norm, as a plain tensor.

    torch's clip on DTensor gradients reduces the shards' norms across the mesh; its result is
    then a DTensor, turned into a full value here so callers can log it the same way."""
    norm = torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state on every rank (gathered from the shards), as plain CPU tensors."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # full_state_dict=True: plain tensors, never DTensors nor nested dicts
    return cast("dict[str, torch.Tensor]", get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)))


def load_full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict[str, Any], optim_state: dict[str, Any]
) -> None:
    """Whole (unsharded) model and optimizer states, as a DDP run's single-file checkpoint holds
    them, into a sharded model: each rank keeps its shard of every tensor.

    The optimizer's state_dict names parameters by their index in its groups; the same
    `build_optimizer` over the same model orders them alike, so index i is the i-th parameter of
    this optimizer, whose name is its path in the model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    names = {id(p): n for n, p in model.named_parameters()}
    ordered = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    by_name: dict[str, Any] = {
        "state": {ordered[i]: s for i, s in optim_state["state"].items()},
        "param_groups": [{**g, "params": [ordered[i] for i in g["params"]]} for g in optim_state["param_groups"]],
    }
    set_state_dict(
        model,
        optimizer,
        model_state_dict=model_state,
        optim_state_dict=by_name,
        options=StateDictOptions(full_state_dict=True),
    )
