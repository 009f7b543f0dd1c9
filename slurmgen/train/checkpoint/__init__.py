"""A training run's checkpoints: the files (`files`: atomic writes, the `latest` pointer, the last
K kept, RNG states), the one object the training loop calls (`checkpoints.Checkpointing`), the
background writer (`writer`), which checkpoint a run resumes from and how every rank gets it
(`resume`), the sharded checkpoints of FSDP2 (`sharded`) and `slurmgen ckpt` (`command`). This
`__init__` imports nothing, so `slurmgen --help` registers `ckpt` without importing torch.
"""
