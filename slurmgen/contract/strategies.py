"""How the bundled trainer distributes the model (`--strategy`), written once.

`ddp`: every rank holds the whole model, rank 0 writes one checkpoint file; `fsdp`: FSDP2
shards parameters, gradients and optimizer state, every rank writes its shard (train/fsdp.py,
train/checkpoint/sharded.py). Every launcher passes the choice on as SLURMGEN_STRATEGY; the spec, the
trainer's flags and the coordinator's group config take their choices and default from here.
"""

from typing import Final

STRATEGIES = ("ddp", "fsdp")
DEFAULT_STRATEGY: Final = "ddp"
