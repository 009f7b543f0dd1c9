"""Rank probe: check that a launch gives every process a consistent identity.

    python -m slurmgen.train.probe [--fail-rank R] [--sleep S] [--backend B]

Each process reads the torchrun contract (RANK, LOCAL_RANK, NODE_RANK or torchrun's
GROUP_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), joins the process
group, all-reduces RANK+1 and all-gathers everyone's identity, and prints one JSON line
starting with `SLURMGEN_PROBE `. It exits 0 only if the sum is right and the identities
form a valid rank table; `--fail-rank` makes one rank exit 1 (or `--fail-code`) on purpose, to test that a
launcher stops the others.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from datetime import timedelta
from typing import Any, TypedDict

from slurmgen.contract import envvars
from slurmgen.contract.backends import BACKENDS

PREFIX = "SLURMGEN_PROBE "
CONTRACT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class Identity(TypedDict):
    """One process's view of the torchrun contract, as every rank sends it to rank 0."""

    rank: int
    local_rank: int
    node_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int
    host: str
    pid: int


def read_identity(env: dict[str, str]) -> Identity:
    """The contract variables as typed values; a missing one is an error naming it."""
    missing = [k for k in CONTRACT if k not in env]
    node_rank = env.get("NODE_RANK", env.get("GROUP_RANK"))
    if node_rank is None:
        missing.append("NODE_RANK")
    if missing or node_rank is None:  # (the second: for type checkers; it is in `missing`)
        raise SystemExit(f"probe: not started by a launcher: {', '.join(missing)} unset")
    return {
        "rank": int(env["RANK"]),
        "local_rank": int(env["LOCAL_RANK"]),
        "node_rank": int(node_rank),
        "world_size": int(env["WORLD_SIZE"]),
        "local_world_size": int(env["LOCAL_WORLD_SIZE"]),
        "master_addr": env["MASTER_ADDR"],
        "master_port": int(env["MASTER_PORT"]),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def table_problems(identities: list[Identity]) -> list[str]:
    """What is wrong with the gathered identities as a rank table (empty when all is well)."""
    problems = []
    world = len(identities)
    if sorted(i["rank"] for i in identities) != list(range(world)):
        problems.append("ranks are not 0..WORLD_SIZE-1")
    if {i["world_size"] for i in identities} != {world}:
        problems.append("WORLD_SIZE differs from the number of processes")
    if len({(i["master_addr"], i["master_port"]) for i in identities}) != 1:
        problems.append("processes disagree on MASTER_ADDR:MASTER_PORT")
    nodes: dict[int, list[Identity]] = {}
    for i in identities:
        nodes.setdefault(i["node_rank"], []).append(i)
    if sorted(nodes) != list(range(len(nodes))):
        problems.append("NODE_RANKs are not 0..nodes-1")
    for node, members in nodes.items():
        if sorted(m["local_rank"] for m in members) != list(range(len(members))):
            problems.append(f"node {node}: LOCAL_RANKs are not 0..{len(members) - 1}")
        if {m["local_world_size"] for m in members} != {len(members)}:
            problems.append(f"node {node}: LOCAL_WORLD_SIZE differs from its process count")
        if len({m["host"] for m in members}) != 1:
            problems.append(f"node {node}: processes on several hosts")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m slurmgen.train.probe", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", default=os.environ.get(envvars.BACKEND, "auto"), choices=BACKENDS)
    parser.add_argument("--fail-rank", type=int, default=None, help="this rank exits after joining")
    parser.add_argument("--fail-code", type=int, default=1, help="the exit code of --fail-rank (default 1)")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to wait before the collectives")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the other ranks")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    me = read_identity(dict(os.environ))
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device("cuda", me["local_rank"]) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=args.timeout))
    if args.fail_rank == me["rank"]:
        print(f"probe: rank {me['rank']} fails on purpose", file=sys.stderr, flush=True)
        os._exit(args.fail_code)
    time.sleep(args.sleep)
    total = torch.tensor([me["rank"] + 1], dtype=torch.int64, device=device)
    dist.all_reduce(total)
    gathered: list[Any] = [{} for _ in range(me["world_size"])]  # each filled with an Identity
    dist.all_gather_object(gathered, me)
    world = me["world_size"]
    problems = table_problems(gathered)
    expected = world * (world + 1) // 2
    if int(total.item()) != expected:
        problems.append(f"all_reduce gave {int(total.item())}, expected {expected}")
    record = {**me, "backend": backend, "sum": int(total.item()), "expected_sum": expected, "problems": problems}
    # One write per line: print() writes text and newline separately when unbuffered, and
    # workers sharing a stdout (torchrun) could then interleave two records on one line.
    sys.stdout.write(PREFIX + json.dumps(record) + "\n")
    sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without interpreter finalisation: gloo's worker threads can otherwise abort
    # the process at exit after all work succeeded (see the project notes).
    os._exit(1 if problems else 0)


if __name__ == "__main__":
    sys.exit(main())
