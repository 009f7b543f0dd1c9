"""The warm restart protocol: how a launcher gives the ranks that survived a peer's failure a new
world without a new interpreter. Pure (standard library only), so any launcher can speak it.

A launcher that asks for a warm restart sets `SLURMGEN_WARM_DIR` (envvars.WARM_DIR) for every
rank: a directory of the node's own, shared by the ranks of that node. Then:

1. A rank of a program that takes part (the bundled trainer, or any program through
   `slurmgen.train.warm`) does not exit when a collective fails because a peer died: it aborts
   and destroys its process group and waits for a `WORLD_NAME` file in that directory whose
   generation is above the one it left.
2. The launcher decides the new world and writes it there on every node, atomically (written
   beside, then renamed): one line `GENERATION MASTER_ADDR MASTER_PORT WORLD_SIZE`. Generation 0
   is the world the job started in; each warm restart is the next one. The port follows the
   generation (`port_for`), so a new rendezvous never meets the old one's store or its sockets.
   Ranks keep their numbers: the failed rank's number goes to its replacement.
3. For each failed rank the launcher starts a fresh process with the same RANK, told the
   generation it joins (envvars.WARM_GENERATION) and that world's MASTER_ADDR and MASTER_PORT;
   in `launch_multi_node.sh` it does so by writing `START_PREFIX` + RANK (the order to start that
   rank anew, holding the generation) beside the world file, which the node's process loop obeys;
   `run_slurm.sh` (restart_mode: warm) starts it as the one task of a job step of its own.
4. Every rank of the new world (the healthy ones and the fresh one) joins the rendezvous at the
   world's address and port and reloads the latest checkpoint; the trainer steps on from there.

A program that does not take part exits on the failure like any other; the launcher sees a
second rank fail soon after it ordered a warm world (`SETTLE` seconds) and restarts the whole
job as before.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from slurmgen.contract import envvars
from slurmgen.contract.ports import MAX_PORT

WORLD_NAME = "world"
START_PREFIX = "start-"  # START_PREFIX + RANK: the order to start that rank anew (its text: the generation)
# Restart modes of `slurmgen launch --restart-mode`: cold starts every process again, warm keeps
# the healthy ranks' processes (this protocol).
COLD, WARM = "cold", "warm"
RESTART_MODES = (COLD, WARM)
# A failure this soon after a warm world was ordered means the program does not take part (its
# healthy ranks died of the peer's failure) or the new world could not form: restart whole.
SETTLE = 10.0
# How often a waiting rank looks for the launcher's word (a stat of one file).
POLL = 0.02
# What a rank says (on stderr) when a peer failed and it waits for the new world: run_slurm.sh
# reads it as the word that a failure happened, and with no rank's exit noted soon after (a lost
# node's ranks note nothing) probes the step's nodes.
WAITING = "waiting for the launcher's new world"
# A program's first word naming a Python interpreter (python, python3.11, /opt/venv/bin/python, by
# its last part): a warm spare (slurmgen/train/spare.py) can stand in for its ranks, and torchrun
# mode runs that interpreter's torch.distributed.run (generate/render.py's `runs_python`).
PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
# A warm spare's first line of output once promoted (train/spare.py on stdout; under Slurm the rank
# wrapper on stderr too): SPARE_TAG RANK, the rank it became, which labels the rest of its output.
SPARE_TAG = "slurmgen-spare"
# MET_PREFIX + RANK, a file a rank leaves in the warm dir once its process group formed: it has
# met its peers. Before every rank has, a failure leaves the others in the first rendezvous, which
# no new world reaches (they wait there until --init-timeout), so a launcher restarts whole.
MET_PREFIX = "met-"


@dataclass(frozen=True)
class World:
    """One generation of the job: where its rendezvous is and how many ranks meet there."""

    generation: int
    master_addr: str
    master_port: int
    world_size: int

    def line(self) -> str:
        return f"{self.generation} {self.master_addr} {self.master_port} {self.world_size}\n"


def generation_of(environ: Mapping[str, str]) -> int:
    """The world a process was started in: 0 for the job's first, the launcher's number for a
    process started after a warm restart (envvars.WARM_GENERATION). The trainer follows it and
    the timeline marks each line with it (contract/phases.py)."""
    text = environ.get(envvars.WARM_GENERATION, "0")
    return int(text) if text.isdigit() else 0


def port_for(base: int, generation: int) -> int:
    """The rendezvous port of a generation: the job's port plus the generation (below it past
    the last port)."""
    return base + generation if base + generation <= MAX_PORT else base - generation


def first_port(port: int, generation: int) -> int:
    """The job's own port, from a generation's (`port_for` undone): what names the job on a node
    whatever the generation (where its ranks' heartbeats go)."""
    below = port - generation
    return below if below >= 1 and port_for(below, generation) == port else port + generation


def parse(text: str) -> World | None:
    """A world file's line, None when it is not one (half written files are never seen: renamed)."""
    parts = text.split()
    if len(parts) != 4 or not (parts[0].isdigit() and parts[2].isdigit() and parts[3].isdigit()):
        return None
    return World(int(parts[0]), parts[1], int(parts[2]), int(parts[3]))


def read(directory: str) -> World | None:
    """The world the launcher last wrote in `directory`, None before its first word."""
    try:
        with open(os.path.join(directory, WORLD_NAME), encoding="utf-8") as f:
            return parse(f.read())
    except OSError:
        return None


def write(directory: str, world: World) -> None:
    """Write the world atomically (how a launcher in Python says it; the bootstrap does the same in bash)."""
    path = os.path.join(directory, WORLD_NAME)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(world.line())
    os.replace(path + ".tmp", path)


def note_met(directory: str, rank: int) -> None:
    """Say in `directory` (the warm dir) that `rank` has met its peers (MET_PREFIX); a warm dir
    that cannot be written costs only the warm restart (the launcher restarts whole)."""
    try:
        with open(os.path.join(directory, f"{MET_PREFIX}{rank}"), "w", encoding="utf-8"):
            pass
    except OSError:
        pass


def has_met(directory: str, rank: int) -> bool:
    """Whether `rank` said in `directory` that it met its peers (`note_met`)."""
    return os.path.exists(os.path.join(directory, f"{MET_PREFIX}{rank}"))
