"""Binding (issue 36, item 4): each rank of launch_multi_node.sh on cores of its own, proved with
real bash on this machine (each rank reads its own Cpus_allowed_list from /proc/self/status),
and srun's own options in srun mode."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from slurmgen.contract.threads import default_omp_threads
from slurmgen.errors import SlurmgenError
from slurmgen.generate.render import LAUNCH_SCRIPT, SLURM_SCRIPT, render
from slurmgen.generate.specfile import build_spec

PROBE = (
    'read -r _ cpus < <(grep Cpus_allowed_list /proc/self/status); echo "probe $RANK $cpus ${OMP_NUM_THREADS-unset}"'
)


def allowed_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def cpu_list(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def run_node(tmp_path: Path, bind: str, ranks: int, **env: str) -> subprocess.CompletedProcess:
    spec = build_spec({"gpus": ranks, "bind": bind, "output_dir": str(tmp_path), "command": ["bash", "-c", PROBE]})
    script = tmp_path / LAUNCH_SCRIPT
    script.write_text(render(spec).files[LAUNCH_SCRIPT])
    script.chmod(0o755)
    environ = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | env
    return subprocess.run(
        [str(script), "localhost", "1", str(ranks), "0"], capture_output=True, text=True, env=environ, timeout=60
    )


def probes(out: str) -> dict[int, tuple[set[int], str]]:
    lines = [line.split("] ", 1)[1].split() for line in out.splitlines() if "] probe " in line]
    return {int(rank): (cpu_list(cpus), omp) for _, rank, cpus, omp in lines}


needs_tools = pytest.mark.skipif(
    not (shutil.which("lscpu") and shutil.which("taskset")) or len(allowed_cpus()) < 2,
    reason="needs lscpu, taskset and 2 CPUs",
)


@needs_tools
@pytest.mark.parametrize("bind", ["cores", "numa", "auto"])
def test_two_ranks_get_disjoint_planned_cores(tmp_path, bind):
    done = run_node(tmp_path, bind, 2)
    assert done.returncode == 0, done.stderr
    seen = probes(done.stdout)
    planned = {}
    for line in done.stdout.splitlines():  # "bind cores: rank R (local rank L) on CPUs 0,1 (N cores)"
        if f"bind {bind}: rank " in line:
            words = line.split()
            planned[int(words[4])] = cpu_list(words[10])
    assert set(seen) == set(planned) == {0, 1}
    for rank in (0, 1):
        assert seen[rank][0] == planned[rank]
    assert not planned[0] & planned[1]
    per = len(allowed_cpus()) // 2  # this machine: one CPU per core
    assert seen[0][1] == seen[1][1] == str(per)  # OMP_NUM_THREADS: the cores the rank got


@needs_tools
def test_the_users_omp_threads_wins_over_the_bound_cores(tmp_path):
    done = run_node(tmp_path, "cores", 2, OMP_NUM_THREADS="7")
    assert {omp for _, omp in probes(done.stdout).values()} == {"7"}


def test_none_leaves_the_ranks_unbound(tmp_path):
    done = run_node(tmp_path, "none", 2)
    assert done.returncode == 0, done.stderr
    seen = probes(done.stdout)
    assert {rank: cpus for rank, (cpus, _) in seen.items()} == {0: set(allowed_cpus()), 1: set(allowed_cpus())}
    assert "bind" not in done.stdout + done.stderr


@needs_tools
def test_a_binding_the_node_cannot_give(tmp_path):
    ranks = len(allowed_cpus()) + 1
    done = run_node(tmp_path, "cores", ranks)
    assert done.returncode == 2
    assert f"bind cores: this node cannot give it: {ranks - 1} core(s) for {ranks} ranks" in done.stderr
    assert "probe" not in done.stdout  # no rank started
    auto = run_node(tmp_path, "auto", ranks)
    assert auto.returncode == 0, auto.stderr
    assert auto.stderr.count("bind auto:") == 1 and "the ranks run unbound" in auto.stderr
    assert all(cpus == set(allowed_cpus()) for cpus, _ in probes(auto.stdout).values())


@pytest.mark.parametrize(
    "bind, options",
    [
        ("none", []),
        ("auto", ["--cpu-bind=cores"]),
        ("cores", ["--cpu-bind=cores"]),
        ("numa", ["--cpu-bind=ldoms", "--mem-bind=local"]),
    ],
)
def test_srun_mode_binds_through_slurms_options(bind, options):
    text = render(build_spec({"gpus": 4, "bind": bind})).files[SLURM_SCRIPT]
    srun_args = text.split("srun_args=(", 1)[1].split("\n)", 1)[0]
    assert [w for w in srun_args.split() if w.startswith(("--cpu-bind", "--mem-bind", "--gpu-bind"))] == options
    torchrun = render(build_spec({"gpus": 4, "bind": bind, "launcher": "torchrun"})).files[SLURM_SCRIPT]
    assert "--cpu-bind" not in torchrun


def test_bind_is_one_of_its_words():
    with pytest.raises(SlurmgenError) as err:
        build_spec({"bind": "socket"})
    assert err.value.problems == ["bind: expected 'none', 'auto', 'cores' or 'numa' (got 'socket')"]


def test_the_thread_rule_gives_a_bound_rank_its_cores():
    assert default_omp_threads({}, 2, 2, bound_cores=3) == "3"
    assert default_omp_threads({"OMP_NUM_THREADS": "5"}, 2, 2, bound_cores=3) is None
    assert default_omp_threads({}, 2, 2) == "1"
