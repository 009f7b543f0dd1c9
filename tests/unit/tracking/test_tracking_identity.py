"""Which group, job type and run directory a process picks, from the environment alone."""

import pytest

from slurmgen.tracking import TrackingError
from slurmgen.tracking.identity import Place, default_group, job_type_for, place_from_env, run_key, slug

TWO_BY_TWO = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "NODE_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"SLURMGEN_GROUP": " sweep-7 ", "SLURM_JOB_ID": "12"}, "sweep-7"),
        ({"SLURM_JOB_ID": "12", "SLURM_ARRAY_JOB_ID": "10", "SLURM_ARRAY_TASK_ID": "2"}, "slurm-10_2"),
        ({"SLURM_JOB_ID": "12"}, "slurm-12"),
        ({"SLURMGEN_LAUNCH_ID": "20260101-abcd"}, "launch-20260101-abcd"),
        ({"TORCHELASTIC_RUN_ID": "exp1", **TWO_BY_TWO}, "torchrun-exp1"),
        ({"TORCHELASTIC_RUN_ID": "none", **TWO_BY_TWO}, "rdzv-10.0.0.1-29500"),
        (TWO_BY_TWO, "rdzv-10.0.0.1-29500"),
    ],
)
def test_group_is_the_same_on_every_rank(env, expected):
    for rank in range(4):
        environ = {**env, "RANK": str(rank)} if "RANK" in env else env
        assert default_group(environ, place_from_env(environ), host=f"node{rank // 2}", pid=100 + rank) == expected


def test_single_process_group_is_unique_to_it():
    group = default_group({}, Place(), host="laptop", pid=42, now=0)
    assert group.startswith("local-") and group.endswith("-laptop-42")


def test_place_from_torchrun_and_srun_variables():
    assert place_from_env(TWO_BY_TWO) == Place(3, 1, 1, 4, 2, "10.0.0.1", 29500)
    srun = place_from_env(
        {
            "SLURM_PROCID": "5",
            "SLURM_LOCALID": "1",
            "SLURM_NODEID": "2",
            "SLURM_NTASKS": "6",
            "SLURM_NTASKS_PER_NODE": "2(x3)",
        }
    )
    assert (srun.rank, srun.local_rank, srun.node_rank, srun.world_size, srun.local_world_size, srun.nodes) == (
        5,
        1,
        2,
        6,
        2,
        3,
    )
    with pytest.raises(TrackingError, match=r"^RANK: must be an integer \(got 'x'\)$"):
        place_from_env({"RANK": "x"})


def test_job_types_and_run_keys():
    place = place_from_env(TWO_BY_TWO)
    assert job_type_for("rank0", place, None) == ("main", False)
    assert job_type_for("per-process", place, None) == ("node_1_rank_3", True)
    assert job_type_for("per-process", place, "{role}") == ("worker", False)
    assert job_type_for("per-process", Place(), "{role}") == ("main", False)
    assert run_key("per-process", "node_1_rank_3", True, 3) == "node_1_rank_3"
    assert run_key("per-process", "worker", False, 3) == "worker-rank3"  # 'worker' on many ranks: still one run each
    assert run_key("rank0", "main", False, 0) == "main"
    with pytest.raises(TrackingError, match=r"^job_type: unknown placeholder 'gpu'"):
        job_type_for("per-process", place, "{gpu}")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("slurm-12", "slurm-12"),
        ("a/b c", "a-b-c"),
        ("..", "run"),
        ("rdzv-10.0.0.1-29500", "rdzv-10.0.0.1-29500"),
        ("", "run"),
    ],
)
def test_slug(text, expected):
    assert slug(text) == expected
