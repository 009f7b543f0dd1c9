"""Binding on the real test cluster (issue 36, item 4): each rank's CPU affinity, read by the
rank itself from /proc/self/status, is the planned set.

- launch_multi_node.sh inside a Slurm job (the path of `slurmgen launch` and of a node started
  by hand): `bind: cores` gives the 2 ranks disjoint whole cores within the CPUs Slurm gave the
  job, the sets the script prints; `bind: none` leaves both on all of them.
- srun mode, 2 nodes x 2 ranks: `bind: cores` writes `srun --cpu-bind=cores` and Slurm's task
  plugin (task/affinity on the test cluster, scripts/cluster/up.sh) binds; the ranks of a node
  get disjoint cores, the sets `slurmgen create` said (generate/binding.py's srun_plan, on this
  machine, which every test node is). `bind: none` leaves a node's ranks on the same CPUs.
- torchrun mode, 2 nodes x 2 workers: each node's task plans its workers' cores within its own
  CPUs (bind_cores.sh.j2's rule, the plan its log line prints and `slurmgen create` said) and each
  worker binds itself by LOCAL_RANK, OMP_NUM_THREADS its cores; `bind: none` leaves them alike.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import sg, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# Each rank writes the CPUs it may run on, OMP_NUM_THREADS, its node, its local rank and the
# binding Slurm says it applied to a file named by its rank.
PROGRAM = """
import os, socket, sys
from pathlib import Path
status = Path("/proc/self/status").read_text()
cpus = next(line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list"))
said = [os.environ.get(k, "unset") for k in ("OMP_NUM_THREADS", "LOCAL_RANK", "SLURM_CPU_BIND")]
Path(sys.argv[1], "cpus-" + os.environ["RANK"]).write_text(" ".join([cpus, *said, socket.gethostname()]))
"""


def cpu_set(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def seen(here: Path, ranks: int) -> dict[int, tuple[set[int], str]]:
    wait_for(lambda: len(list(here.glob("cpus-*"))) == ranks, 90, f"{ranks} ranks' affinity")
    out = {}
    for rank in range(ranks):
        cpus, omp, *_ = (here / f"cpus-{rank}").read_text().split()
        out[rank] = (cpu_set(cpus), omp)
    return out


def slurm(cluster, *argv: str) -> str:
    return subprocess.run(argv, env=cluster.env(None), capture_output=True, text=True, check=True, timeout=60).stdout


@pytest.mark.parametrize("bind", ["cores", "none"])
def test_launch_multi_node_in_a_job_binds_each_rank_to_its_planned_cores(cluster, tmp_path, bind):
    here = tmp_path / "shared"
    here.mkdir()
    sg(
        cluster,
        tmp_path,
        "create",
        *("--gpus", "2", "--backend", "gloo", "--bind", bind, "-o", "out"),
        "--",
        sys.executable,
        "-c",
        PROGRAM,
        str(here),
    )
    job = slurm(
        cluster,
        "sbatch",
        "--parsable",
        "--nodes=1",
        "--ntasks=1",
        "--cpus-per-task=2",
        f"--output={tmp_path}/job-%j.out",
        f"--chdir={tmp_path}",
        "--wrap",
        "out/launch_multi_node.sh localhost 1 2 0",
    ).strip()
    ranks = seen(here, 2)
    wait_for(lambda: next(iter(tmp_path.glob("job-*.out")), None), 30, "the job's log")
    log = next(iter(tmp_path.glob("job-*.out")))
    wait_for(lambda: "finished successfully" in log.read_text(), 60, "the job's end")
    text = log.read_text()
    job_cpus = ranks[0][0] | ranks[1][0]
    if bind == "none":
        assert ranks[0][0] == ranks[1][0] and "bind" not in text, text
        return
    planned = {}
    for line in text.splitlines():  # "launch_multi_node.sh: bind cores: rank R (local rank L) on CPUs 0,1 (N cores)"
        if ": bind cores: rank " in line:
            words = line.split()
            planned[int(words[4])] = cpu_set(words[10])
    assert {rank: cpus for rank, (cpus, _) in ranks.items()} == planned, text
    assert not ranks[0][0] & ranks[1][0] and job_cpus, (job, ranks)
    for cpus, omp in ranks.values():
        assert omp == str(len(cpus))  # one CPU per core on the test nodes


@pytest.mark.parametrize("bind", ["cores", "none"])
def test_srun_mode_binds_each_rank_to_the_cores_create_said(cluster, tmp_path, bind):
    here = tmp_path / "shared"
    here.mkdir()
    flags = ("--launcher", "srun", "--nodes", "2", "--gpus", "2", "--backend", "gloo", "--bind", bind, "-o", "out")
    said = sg(cluster, tmp_path, "create", *flags, "--", sys.executable, "-c", PROGRAM, str(here)).stdout
    job = cluster.submit(tmp_path / "out" / "run_slurm.sh", cwd=tmp_path)
    state, code = cluster.wait(job, timeout=120)
    log = "\n".join(p.read_text() for p in (tmp_path / "out" / "logs").glob(f"*-{job}.out"))
    assert (state, code) == ("COMPLETED", 0), log
    ranks = {}
    for rank in range(4):
        cpus, _, local, bound, host = (here / f"cpus-{rank}").read_text().split()
        ranks[rank] = (host, int(local), cpu_set(cpus), bound)
    hosts = sorted({host for host, *_ in ranks.values()})
    assert len(hosts) == 2, ranks
    on = {host: [cpus for h, _, cpus, _ in sorted(ranks.values(), key=lambda r: r[1]) if h == host] for host in hosts}
    if bind == "none":
        assert "bind" not in said and all(first == second for first, second in on.values()), ranks
        return
    # "bind cores: Slurm binds each task (srun --cpu-bind=cores) ...: local rank 0 CPUs 0, local rank 1 CPUs 1"
    line = next(line for line in said.splitlines() if line.startswith("bind cores: Slurm binds each task"))
    planned = [cpu_set(each.split(" CPUs ")[1]) for each in line.split(": ")[-1].split(", ")]
    assert "--cpu-bind=cores" in (tmp_path / "out" / "run_slurm.sh").read_text()
    assert all("mask_cpu:" in bound for *_, bound in ranks.values()), ranks  # SLURM_CPU_BIND: the masks Slurm set
    for host, (first, second) in on.items():
        assert [first, second] == planned and not first & second, (host, ranks, line)


@pytest.mark.parametrize("bind", ["cores", "none"])
def test_torchrun_mode_binds_each_worker_to_the_cores_its_node_planned(cluster, tmp_path, bind):
    here = tmp_path / "shared"
    here.mkdir()
    flags = ("--launcher", "torchrun", "--nodes", "2", "--gpus", "2", "--backend", "gloo", "--bind", bind, "-o", "out")
    said = sg(cluster, tmp_path, "create", *flags, "--", sys.executable, "-c", PROGRAM, str(here)).stdout
    job = cluster.submit(tmp_path / "out" / "run_slurm.sh", cwd=tmp_path)
    state, code = cluster.wait(job, timeout=120)
    log = "\n".join(p.read_text() for p in (tmp_path / "out" / "logs").glob(f"*-{job}.out"))
    assert (state, code) == ("COMPLETED", 0), log
    ranks = {}
    for rank in range(4):
        cpus, omp, local, _, host = (here / f"cpus-{rank}").read_text().split()
        ranks[rank] = (host, int(local), cpu_set(cpus), omp)
    hosts = sorted({host for host, *_ in ranks.values()})
    assert len(hosts) == 2, ranks
    on = {host: [cpus for h, _, cpus, _ in sorted(ranks.values(), key=lambda r: r[1]) if h == host] for host in hosts}
    if bind == "none":
        assert "bind" not in said and "bind" not in log and all(a == b for a, b in on.values()), (ranks, log)
        return
    # "0: slurmgen: bind cores: node1 local rank 0 on CPUs 0 (1 cores)", once a node and worker
    printed = {}
    for line in log.splitlines():
        if "slurmgen: bind cores: " in line:
            words = line.split("slurmgen: bind cores: ")[1].split()
            printed[words[0], int(words[3])] = cpu_set(words[6])
    assert printed == {(host, local): cpus for host, local, cpus, _ in ranks.values()}, (log, ranks)
    # "bind cores: run_slurm.sh (torchrun mode) and launch_multi_node.sh bind ...: local rank 0 CPUs 0, ..."
    line = next(line for line in said.splitlines() if line.startswith("bind cores: "))
    assert "run_slurm.sh" in line and "binds nothing" not in line, line
    planned = [cpu_set(each.split(" CPUs ")[1]) for each in line.split(": ")[-1].split(", ")]
    for host, (first, second) in on.items():
        assert [first, second] == planned and not first & second, (host, ranks, line)
    for _, _, cpus, omp in ranks.values():
        assert omp == str(len(cpus))  # one CPU per core on the test nodes
