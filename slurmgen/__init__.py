"""slurmgen: multi-node PyTorch launching made boring and correct.

Deliberately import-free: every rank of every job imports this package, and
`slurmgen --help` must stay fast and must not pull in torch or paramiko.
"""

__version__ = "0.1.0"
