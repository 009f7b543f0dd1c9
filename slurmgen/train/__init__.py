"""The bundled trainer and the rank probe: the only part of slurmgen that imports torch.

Nothing here imports torch at module import time, so `python -m slurmgen.train.probe`
and `python -m slurmgen.train` pay for torch only once they run.
"""
