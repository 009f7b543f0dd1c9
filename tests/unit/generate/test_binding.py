"""The CPUs `slurmgen ranks --bind` shows are the ones the node gives (issue 36, item 4):
generate/binding.py's plan is held equal to templates/bind_cores.sh.j2's `bind_plan`, run by real
bash on the same `lscpu -p` output and Cpus_allowed_list, for both modes and their refusals."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import run

from slurmgen.generate.binding import cpu_list, plan, read_lscpu, srun_plan

TEMPLATE = Path(__file__).resolve().parents[3] / "templates" / "bind_cores.sh.j2"


def lscpu(sockets: int, cores: int, threads: int, numa_per_socket: int = 1) -> str:
    """`lscpu -p=CPU,CORE,SOCKET,NODE` of a machine numbering its first threads first, as Linux does."""
    lines = ["# CPU,Core,Socket,Node"]
    total = sockets * cores
    for t in range(threads):
        for c in range(total):
            socket = c // cores
            node = socket * numa_per_socket + (c % cores) * numa_per_socket // cores
            lines.append(f"{t * total + c},{c},{socket},{node}")
    return "\n".join(lines) + "\n"


CASES = [
    (lscpu(2, 4, 2), "0-15", 4, "cores"),
    (lscpu(2, 4, 2), "0-15", 3, "cores"),
    (lscpu(2, 4, 2), "0-15", 3, "numa"),
    (lscpu(2, 4, 2), "0-5,8-13", 2, "numa"),  # a Slurm step narrowed to 6 cores
    (lscpu(2, 8, 1, numa_per_socket=2), "0-15", 4, "numa"),
    (lscpu(2, 8, 1, numa_per_socket=2), "0-15", 6, "numa"),
    (lscpu(1, 2, 1), "0-1", 3, "cores"),  # refused: 2 cores for 3 ranks
    (lscpu(2, 2, 1), "0-3", 3, "numa"),  # 3 ranks on 2 NUMA nodes of 2 cores: 2 share node 0
    (lscpu(2, 1, 2), "0-3", 3, "numa"),  # refused: a NUMA node of 1 core for 2 ranks
]


def bash_plan(tmp_path: Path, topology: str, allowed: str, ranks: int, mode: str) -> list[str] | str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "lscpu.txt").write_text(topology)
    (tmp_path / "status").write_text(f"Name:\tbash\nCpus_allowed_list:\t{allowed}\n")
    for name, body in (("lscpu", f'cat "{tmp_path}/lscpu.txt"'), ("taskset", "exit 0")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    text = TEMPLATE.read_text()
    functions = (
        text.split("{% raw %}")[1].split("{% endraw %}")[0].replace("/proc/self/status", str(tmp_path / "status"))
    )
    script = functions + (
        f'bind_cpus=() bind_cores=() bind_why=""\nif bind_plan {ranks} {mode}; then\n'
        '  for r in "${!bind_cpus[@]}"; do echo "${bind_cpus[r]}"; done\nelse echo "why: $bind_why"; fi\n'
    )
    out = subprocess.run(
        ["bash", "-c", script], env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    return lines[0].removeprefix("why: ") if lines and lines[0].startswith("why: ") else lines


@pytest.mark.skipif(shutil.which("nvidia-smi", path="/usr/bin:/bin") is not None, reason="a real nvidia-smi here")
@pytest.mark.parametrize(("topology", "allowed", "ranks", "mode"), CASES)
def test_the_plan_shown_is_the_plan_the_node_makes(tmp_path, topology, allowed, ranks, mode):
    parts = [p.split("-") for p in allowed.split(",")]
    ok = {cpu for p in parts for cpu in range(int(p[0]), int(p[-1]) + 1)}
    planned = plan(read_lscpu(topology, ok), ranks, mode)
    by_bash = bash_plan(tmp_path, topology, allowed, ranks, mode)
    if isinstance(planned, str):
        assert by_bash == planned
    else:
        assert [set(map(int, line.split(","))) for line in by_bash] == [set(cpus) for cpus in planned]
        cpus = [cpu for each in planned for cpu in each]
        assert all(planned) and len(cpus) == len(set(cpus))  # whole cores, never shared


def test_ranks_shows_each_ranks_cpus_and_refuses_a_binding_the_node_cannot_give(tmp_path, capsys):
    (tmp_path / "lscpu.txt").write_text(lscpu(2, 4, 2))
    code, out, err = run(
        capsys,
        "ranks",
        "--hosts",
        "a,b",
        "--gpus",
        "2",
        "--bind",
        "numa",
        "--lscpu",
        str(tmp_path / "lscpu.txt"),
        "--json",
    )
    assert code == 0, err
    assert [(r["host"], r["local_rank"], r["cpus"]) for r in json.loads(out)] == [
        ("a", 0, "0-3,8-11"),
        ("a", 1, "4-7,12-15"),
        ("b", 0, "0-3,8-11"),
        ("b", 1, "4-7,12-15"),
    ]
    (tmp_path / "small.txt").write_text(lscpu(1, 2, 1))
    code, out, err = run(
        capsys, "ranks", "--nodes", "1", "--gpus", "3", "--bind", "cores", "--lscpu", str(tmp_path / "small.txt")
    )
    assert (code, out, err) == (2, "", "slurmgen: error: bind: cores cannot be given on node0: 2 core(s) for 3 ranks\n")
    code, out, err = run(
        capsys,
        "ranks",
        "--nodes",
        "1",
        "--gpus",
        "3",
        "--bind",
        "auto",
        "--lscpu",
        str(tmp_path / "small.txt"),
        "--json",
    )
    assert code == 0 and {r["cpus"] for r in json.loads(out)} == {"unbound"}, out
    code, _, err = run(capsys, "ranks", "--nodes", "1", "--bind", "sockets")
    assert code == 2 and err == "slurmgen: error: bind: expected one of none, auto, cores, numa (got 'sockets')\n"
    assert cpu_list([3, 0, 1, 2, 8, 10]) == "0-3,8,10"


def test_launch_dry_run_shows_each_ranks_cpus_on_a_host_like_this_one(tmp_path, capsys, monkeypatch):
    from slurmgen.generate import binding

    monkeypatch.setattr(binding, "here", lambda: lscpu(2, 4, 2))
    (tmp_path / "job.yaml").write_text("bind: numa\n")
    argv = ["launch", "--hosts", "h1,h2", "--gpus", "2", "--config", str(tmp_path / "job.yaml"), "--dry-run"]
    code, out, err = run(capsys, *argv, "--", "python", "x.py")
    assert code == 0, err
    said = [line for line in out.splitlines() if line.startswith("# bind numa:")]
    assert (
        said
        == [
            "# bind numa: the host plans each rank's CPUs from its own lscpu -p when it starts; on a host like this "
            "machine: local rank 0 CPUs 0-3,8-11, local rank 1 CPUs 4-7,12-15"
        ]
        * 2
    )


def test_srun_mode_plans_slurms_block_binding_of_the_jobs_cores():
    # 2 sockets x 4 cores x 2 threads; Linux numbers the first threads first (CPU c and c+8 share core c).
    cores = read_lscpu(lscpu(2, 4, 2))
    assert srun_plan(cores, 2, "cores", 1) == [(0, 8), (1, 9)]  # one whole core each, the job's first two
    assert srun_plan(cores, 2, "cores", 4) == [(0, 8, 1, 9), (2, 10, 3, 11)]  # 4 CPUs = 2 cores of 2 threads
    assert srun_plan(cores, 4, "auto", 4) == [(0, 8, 1, 9), (2, 10, 3, 11), (4, 12, 5, 13), (6, 14, 7, 15)]
    numa = srun_plan(cores, 4, "numa", 4)  # ldoms: each task on the whole NUMA node of its cores
    assert [cpu_list(cpus) for cpus in numa] == ["0-3,8-11", "0-3,8-11", "4-7,12-15", "4-7,12-15"]
    assert srun_plan(cores, 3, "cores", 6) == "8 core(s) for 3 tasks of 3 core(s)"
    # Sockets numbered alternately (CPU 0 on socket 0, CPU 1 on socket 1): Slurm fills socket 0 first.
    alternate = read_lscpu("0,0,0,0\n1,1,1,1\n2,2,0,0\n3,3,1,1\n")
    assert srun_plan(alternate, 2, "cores", 1) == [(0,), (2,)]


@pytest.mark.parametrize(
    ("launcher", "said"),
    [
        (
            "srun",
            "bind cores: Slurm binds each task (srun --cpu-bind=cores) within the job's CPUs on its node; on a node "
            "like this machine, the job holding its first cores: local rank 0 CPUs 0-1,8-9, local rank 1 CPUs "
            "2-3,10-11",
        ),
        (
            "torchrun",
            "bind cores: run_slurm.sh's task on each node binds each worker from the node's lscpu -p when it starts, "
            "within the task's CPUs (launch_multi_node.sh: within the CPUs it may use); on a node like this machine, "
            "the task holding its first cores: local rank 0 CPUs 0-1,8-9, local rank 1 CPUs 2-3,10-11",
        ),
    ],
)
def test_create_and_submit_dry_run_show_each_ranks_cpus(tmp_path, capsys, monkeypatch, launcher, said):
    from slurmgen.generate import binding

    monkeypatch.setattr(binding, "here", lambda: lscpu(2, 4, 2))
    flags = ["--launcher", launcher, "-N", "2", "--gpus", "2", "-c", "4", "--bind", "cores"]
    code, out, err = run(capsys, "create", *flags, "-o", str(tmp_path / "out"), "--", "python", "x.py")
    assert code == 0, err
    assert said in out.splitlines()
    code, out, err = run(capsys, "submit", *flags, "-o", str(tmp_path / "dry"), "--dry-run", "--", "python", "x.py")
    assert code == 0, err
    assert out.splitlines()[0] == "# " + said
    code, out, err = run(capsys, "create", "--launcher", launcher, "-o", str(tmp_path / "unbound"), "--", "x")
    assert code == 0 and "bind" not in out, out
