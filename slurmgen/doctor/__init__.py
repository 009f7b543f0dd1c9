"""`slurmgen doctor`: find a broken cluster before a job burns its allocation.

Every node runs the same probe (`probe.py`, `python -m slurmgen.doctor.probe`): Python, torch,
CUDA and NCCL versions and the GPU count (torch is imported there and only there), a hash of
the working tree or given files, whether MASTER_ADDR resolves and MASTER_PORT can be reached
(the node that owns the address listens on the port while every node connects), whether the
preemption signal (the spec's preempt_signal: `--config` or `--signal`, default USR2) sent to
the job step reaches the Python process, and the free disk in the output
directory; with `--fabric` also the network (`fabric.py`: the address the hostname resolves
to, the route to the master, NCCL_*/GLOO_*, InfiniBand/EFA, a gloo all-reduce beside raw TCP
between the same nodes; judged by `fabric_verdict.py`). A probe's result is one JSON dict.
`compare.py` (pure) turns the rows into marks and one line per problem, `table.py` draws the
table, `nodes.py` gets the rows: this machine alone, one srun task per node inside a Slurm
allocation, or over SSH (the launch package's connections). `cli.py` is the command.
"""
