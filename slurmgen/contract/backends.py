"""The torch.distributed backends a job may ask for, written once.

`auto` lets the trainer choose at start-up (nccl where CUDA is, else gloo); every launcher
passes the choice on as SLURMGEN_BACKEND, and the spec, the trainer's flags and the
coordinator's group config all take their choices and their default from here.
"""

from typing import Final

BACKENDS = ("auto", "nccl", "gloo")
DEFAULT_BACKEND: Final = "auto"
