"""Ports every launcher agrees on without talking: the rendezvous defaults, written once.

`MASTER_PORT` defaults to torchrun's 29500 where a person starts the job (`launch_multi_node.sh`,
`slurmgen launch`, coordinator groups). A Slurm job derives its port from its id instead, so
two jobs sharing a node do not collide, a requeued job and every node agree without talking,
and the port stays below the ephemeral range (where it could collide with some process's
outgoing connection). The generated script computes the same rule in bash; the template is
handed these numbers, never its own literals.
"""

from __future__ import annotations

import re

DEFAULT_MASTER_PORT = 29500
JOB_PORT_BASE, JOB_PORT_SPAN = 20000, 10000
JOB_PORT_RULE = f"{JOB_PORT_BASE} + job id % {JOB_PORT_SPAN}"
# An in-job restart (the spec's `restarts`) rendezvouses on a port of its own, so that nothing of
# the failed step (a rank still dying, a socket in TIME_WAIT) answers the new one: restart K of a
# job takes its port K x STRIDE further round the span (a stride, not +K, so that restart 1 of job
# N is not job N+1's first port), or master_port + K when the spec gives one.
RESTART_PORT_STRIDE = 1009
# `slurmgen serve` and the clients that find it without being told.
COORDINATOR_PORT = 8470
MAX_PORT = 65535


def job_port(job_id: str | int) -> int:
    """Default MASTER_PORT of a Slurm job (`12345_7` counts as its digits, as bash's $((...)) would not)."""
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return JOB_PORT_BASE + int(digits) % JOB_PORT_SPAN


def link_port(master_port: int) -> int:
    """The port beside MASTER_PORT that a job's own helpers listen on: the node link of
    launch_multi_node.sh (unless SLURMGEN_LINK_PORT says otherwise) and the bandwidth probe of
    `slurmgen doctor --fabric`. The one above, or the one below when MASTER_PORT is the last
    port. The launcher computes the same rule in bash, handed MAX_PORT."""
    return master_port + 1 if master_port < MAX_PORT else master_port - 1
