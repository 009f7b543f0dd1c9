"""Issue 3: scripts from `slurmgen create` run on the real test cluster (Slurm + namespaces).

Each test renders with `slurmgen create ... -- python -m slurmgen.train.probe`, lints what it
rendered with shellcheck (issue 3, test 5), submits with sbatch and polls the job state itself.
The probe prints one `SLURMGEN_PROBE {json}` line per rank with its identity, after a gloo
all_reduce of RANK+1 across all ranks.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import render_and_lint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PROBE = ["python", "-m", "slurmgen.train.probe", "--timeout", "30"]
PREFIX = "SLURMGEN_PROBE "
# Generous for 2 cores: a 2 x 2 gloo job takes 7-12 s; a hang is caught long before the
# rendezvous (60 s) or torchrun exit-barrier (300 s) defaults would end it.
JOB_TIMEOUT = 90


def create(out: Path, *args: str, command: list[str] = PROBE) -> Path:
    return render_and_lint(out, *args, command=command)


@dataclass
class Run:
    job_id: str
    state: str
    exit_code: int
    seconds: float  # from submission to the end of the job
    hosts: list[str]  # the allocation, in Slurm's node order
    log: str

    def records(self) -> list[dict]:
        # Decode the JSON object after every PREFIX rather than per line: under torchrun the
        # workers of a node share one stdout, and with PYTHONUNBUFFERED print() writes the
        # text and its newline separately, so two records can end up on one line.
        decoder = json.JSONDecoder()
        recs = []
        for chunk in self.log.split(PREFIX)[1:]:
            rec, _ = decoder.raw_decode(chunk)
            recs.append(rec)
        return sorted(recs, key=lambda r: r["rank"])


def submit_and_wait(cluster, out: Path, timeout: float = JOB_TIMEOUT) -> Run:
    t0 = time.monotonic()
    job = cluster.submit(out / "run_slurm.sh", cwd=out)
    state, code = cluster.wait(job, timeout=timeout)
    seconds = time.monotonic() - t0
    info = cluster.job_info(job)
    hosts = cluster.run(["scontrol", "show", "hostnames", info["NodeList"]]).stdout.split()
    logs = sorted((out / "logs").glob(f"*-{job}.out"))
    assert logs, f"no log for job {job} in {out / 'logs'}: {list((out / 'logs').iterdir())}"
    return Run(job, state, code, seconds, hosts, "\n".join(p.read_text() for p in logs))


def check_ranks(run: Run, nodes: int, per_node: int, launcher: str) -> list[dict]:
    """Assert the rank table every mode promises, plus what ``launcher`` adds."""
    assert (run.state, run.exit_code) == ("COMPLETED", 0), run.log
    recs = run.records()
    world = nodes * per_node
    assert [r["rank"] for r in recs] == list(range(world)), run.log
    assert {r["world_size"] for r in recs} == {world}
    assert {r["local_world_size"] for r in recs} == {per_node}
    assert all(r["problems"] == [] for r in recs), [r["problems"] for r in recs]
    assert {r["sum"] for r in recs} == {world * (world + 1) // 2}
    assert {r["backend"] for r in recs} == {"gloo"}
    # One rendezvous point for everybody.
    assert len({r["master_addr"] for r in recs}) == 1
    assert len({r["master_port"] for r in recs}) == 1
    # Every node of the allocation runs exactly per_node processes, LOCAL_RANK 0..per_node-1,
    # all with one NODE_RANK; global ranks are contiguous per node.
    assert sorted({r["host"] for r in recs}) == sorted(run.hosts)
    for host in run.hosts:
        mine = [r for r in recs if r["host"] == host]
        assert sorted(r["local_rank"] for r in mine) == list(range(per_node)), (host, mine)
        assert len({r["node_rank"] for r in mine}) == 1, (host, mine)
        for r in mine:
            assert r["rank"] == r["node_rank"] * per_node + r["local_rank"], r
    assert sorted({r["node_rank"] for r in recs}) == list(range(nodes))
    if launcher == "srun":
        # srun (block distribution) promises NODE_RANK = the node's position in the allocation,
        # so RANK 0 is on the first node, which is also MASTER_ADDR.
        for r in recs:
            assert r["host"] == run.hosts[r["node_rank"]], r
    return recs


# --- issue 3, test 1: 2 nodes x 2 processes, both launchers ---------------------------------
@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_two_by_two(cluster, tmp_path, launcher):
    out = create(
        tmp_path / "out",
        *("--nodes", "2", "--gpus", "2", "--backend", "gloo", "--launcher", launcher),
        *("--time", "5"),
    )
    run = submit_and_wait(cluster, out)
    recs = check_ranks(run, nodes=2, per_node=2, launcher=launcher)
    if launcher == "srun":
        # The script picks the first node of the allocation and a port from the job id.
        assert recs[0]["master_addr"] == run.hosts[0]
    else:
        # c10d hands out group ranks in order of arrival: rank 0 may be on either node, and
        # torchrun points the workers at whichever agent hosts the store; it is a node of ours.
        assert recs[0]["master_addr"] in run.hosts + [cluster.node(h).ip for h in run.hosts], recs[0]


# --- issue 3, test 2: shapes and overrides ---------------------------------------------------
def test_two_nodes_one_process_each(cluster, tmp_path):
    # Also asks Slurm for GPUs the way real clusters need it: the test cluster declares fake
    # GPUs as GRES, so --gpus-per-node must be accepted and scheduled.
    out = create(
        tmp_path / "out",
        *("--nodes", "2", "--gpus", "1", "--backend", "gloo", "--time", "5"),
        *("--gpu-request", "gpus-per-node"),
    )
    assert "#SBATCH --gpus-per-node=1" in (out / "run_slurm.sh").read_text()
    check_ranks(submit_and_wait(cluster, out), nodes=2, per_node=1, launcher="srun")


def test_one_node_two_processes(cluster, tmp_path):
    out = create(
        tmp_path / "out",
        *("--nodes", "1", "--gpus", "2", "--backend", "gloo", "--time", "5"),
        *("--gpu-request", "gres"),
    )
    assert "#SBATCH --gres=gpu:2" in (out / "run_slurm.sh").read_text()
    run = submit_and_wait(cluster, out)
    recs = check_ranks(run, nodes=1, per_node=2, launcher="srun")
    assert {r["master_addr"] for r in recs} == {run.hosts[0]}


def test_master_addr_and_port_overrides(cluster, tmp_path):
    first = cluster.nodes[0]
    names = ",".join(cluster.node_names[:2])
    out = create(
        tmp_path / "out",
        *("--nodes", "2", "--gpus", "1", "--backend", "gloo", "--time", "5"),
        *("--master-addr", first.ip, "--master-port", "29517"),
        # Pin the allocation so the overridden address is where rank 0 runs.
        *("--nodelist", names),
    )
    run = submit_and_wait(cluster, out)
    recs = check_ranks(run, nodes=2, per_node=1, launcher="srun")
    assert run.hosts[0] == first.name
    assert {(r["master_addr"], r["master_port"]) for r in recs} == {(first.ip, 29517)}


# --- issue 3, test 3: one rank fails -> the job fails fast and leaves nothing behind -----------
@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_failing_rank_ends_job_fast_and_cleanly(cluster, tmp_path, launcher):
    fail_rank = 3  # on the second node, not the master: the others must be stopped
    out = create(
        tmp_path / "out",
        *("--nodes", "2", "--gpus", "2", "--backend", "gloo", "--launcher", launcher),
        "--time",
        "5",
        # --sleep keeps the healthy ranks busy in a collective-free wait, so they must be
        # killed rather than ending on their own.
        command=[*PROBE, "--fail-rank", str(fail_rank), "--fail-code", "3", "--sleep", "120"],
    )
    run = submit_and_wait(cluster, out, timeout=60)
    assert run.state == "FAILED", run.log
    # The failing rank's own code, not srun's 143 for the ranks it stopped (nor torchrun's 1),
    # and the log's last line names that rank and its node.
    assert run.exit_code == 3, run.log
    fail_host = run.hosts[1] if launcher == "srun" else None  # torchrun: c10d places ranks
    last = run.log.strip().splitlines()[-1]
    assert last.startswith(f"slurmgen: rank {fail_rank} on "), run.log
    assert "exited with code 3 first" in last and last.split()[4] in run.hosts, last
    if fail_host:
        assert last.split()[4] == fail_host, last
    # "Within seconds": far below the time limit (5 min), the 60 s rendezvous timeout and
    # torchrun's 300 s exit barrier. Start-up of 4 torch processes on 2 cores is most of it.
    assert run.seconds < 45, f"job took {run.seconds:.1f}s to fail\n{run.log}"
    left = cluster.wait_no_tasks(run.job_id, timeout=15)
    assert left == [], f"tasks survived the failed job: {left}"
    message = f"probe: rank {fail_rank} fails on purpose"
    assert message in run.log, run.log
    if launcher == "srun":
        # srun --label prefixes each line with its task id, which is the rank in this mode.
        assert f"{fail_rank}: {message}" in run.log
