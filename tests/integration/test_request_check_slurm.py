"""Check before submit on the real test cluster (issue 36, item 3): requests its nodes (8 CPUs,
16000 MB, 4 GPUs each) can never meet are refused before anything is submitted, with what the
cluster has and a request that fits; a partition with MaxTime 10 (added here with `scontrol create`
and removed after) refuses a longer time, which `sbatch --test-only` alone accepts; a feature given
to node2 here is found; `--no-check` submits anyway; `doctor --slurm` says the same."""

from __future__ import annotations

import sys

import pytest
from helpers import remote_flags, sg

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PROGRAM = ["--", "python", "-c", "print('ran')"]


@pytest.fixture
def short_partition(cluster):
    cluster.run(["scontrol", "create", "PartitionName=short", "Nodes=ALL", "MaxTime=10", "State=UP"])
    cluster.run(["scontrol", "update", "NodeName=node2", "AvailableFeatures=fast", "ActiveFeatures=fast"])
    try:
        yield
    finally:
        cluster.run(["scontrol", "delete", "PartitionName=short"], check=False)
        cluster.run(["scontrol", "update", "NodeName=node2", "AvailableFeatures=", "ActiveFeatures="], check=False)


def doctor_slurm(cluster, cwd, *remote: str):
    return cluster.run(
        [sys.executable, "-m", "slurmgen", "doctor", "--slurm", "--config", "job.yaml", *remote], cwd=cwd, check=False
    )


API_SUBMIT = """
from slurmgen import Job
from slurmgen.errors import SlurmgenError
try:
    Job(partition="short", time="30", output_dir="api", command=["true"]).submit(registry="api.sqlite")
except SlurmgenError as exc:
    print(exc)
"""


def submitted(cluster) -> str:
    return cluster.run(["squeue", "-h", "-o", "%i %j"]).stdout


@pytest.mark.usefixtures("short_partition")
def test_a_request_the_cluster_can_never_meet_is_refused_with_what_fits(cluster, tmp_path):
    before = submitted(cluster)
    for flags, said in [
        (
            ["--gpus", "8", "--gpu-request", "gres"],
            "gpus: the nodes of partition debug have at most 4 GPUs (asked 8 per node); "
            "fits: --nodes 2 --gpus 4 (the same 8 processes)",
        ),
        (["--mem", "64G"], "mem: the nodes of partition debug have at most 16000M of memory (asked 65536M per node)"),
        (
            ["--constraint", "ib"],
            "constraint: none of the nodes of partition debug has feature 'ib' (their features: fast)",
        ),
        (["--nodes", "2", "--constraint", "fast"], "nodes: partition debug has 1 node(s) that fit one node's request"),
        (["--partition", "short", "--time", "30"], "time: partition short allows at most 00:10:00 (asked 30)"),
        (["--partition", "gpu"], "partition: the cluster has no partition 'gpu' (it has: debug, short)"),
    ]:
        proc = sg(cluster, tmp_path, "submit", "-o", "no", "--job-name", "never", *flags, *PROGRAM, check=False)
        assert proc.returncode == 2 and proc.stdout == "", (flags, proc.stderr)
        assert said in proc.stderr and proc.stderr.count("\n") == 1, (flags, proc.stderr)
    assert "never" not in submitted(cluster) and submitted(cluster) == before

    # `sbatch --test-only` alone would start the long one: the partition's limit is the check's.
    sg(cluster, tmp_path, "create", "-o", "long", "--partition", "short", "--time", "30", *PROGRAM)
    said = cluster.run(["sbatch", "--test-only", "long/run_slurm.sh"], cwd=tmp_path, check=False).stderr
    assert "to start at" in said, said

    (tmp_path / "job.yaml").write_text("partition: short\ntime: '30'\n")
    proc = doctor_slurm(cluster, tmp_path)
    assert proc.returncode == 1 and "doctor: time: partition short allows at most 00:10:00" in proc.stderr, proc.stderr
    proc = doctor_slurm(cluster, tmp_path, *remote_flags(cluster))  # the same check of node1's Slurm over SSH
    assert proc.returncode == 1 and "doctor: time: partition short allows at most 00:10:00" in proc.stderr, proc.stderr
    said = cluster.run([sys.executable, "-c", API_SUBMIT], cwd=tmp_path).stdout  # the Python API's submit
    assert said.startswith("time: partition short allows at most 00:10:00 (asked 30)") and "check=False" in said, said
    assert submitted(cluster) == before and not (tmp_path / "api").exists()


@pytest.mark.usefixtures("short_partition")
def test_a_request_that_fits_is_submitted_and_no_check_skips_the_check(cluster, tmp_path):
    job = sg(
        cluster, tmp_path, "submit", "-o", "fits", "--partition", "short", "--time", "5",
        "--constraint", "fast", *PROGRAM,
    ).stdout.strip()  # fmt: skip
    assert cluster.wait(job, timeout=60) == ("COMPLETED", 0)
    assert cluster.job_info(job)["NodeList"] == "node2"
    # Refused by the check, submitted without it: Slurm keeps it pending for ever (PartitionTimeLimit).
    forced = sg(
        cluster, tmp_path, "submit", "-o", "forced", "--partition", "short", "--time", "30", "--no-check", *PROGRAM
    ).stdout.strip()
    try:
        info = cluster.job_info(forced)
        assert info["JobState"] == "PENDING", info
    finally:
        cluster.cancel(forced)
    (tmp_path / "job.yaml").write_text("partition: short\ntime: '5'\n")
    proc = doctor_slurm(cluster, tmp_path)
    assert proc.stdout.startswith("slurm: the request fits (1 node(s) x 1, partition short)"), proc.stdout
