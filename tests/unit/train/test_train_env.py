"""Launcher detection is a pure function of (environment, flags, GPU count): test it as tables."""

import pytest

from slurmgen.contract.ports import job_port
from slurmgen.train.env import (
    DistEnv,
    EnvError,
    LaunchFlags,
    detect,
    first_host,
    resolve_backend,
    tasks_on_node,
)

TORCHRUN = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "node0",
    "MASTER_PORT": "29400",
    "TORCHELASTIC_RUN_ID": "abc",
}
SCRIPT = {
    "RANK": "2",
    "LOCAL_RANK": "0",
    "NODE_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "23456",
    "SLURMGEN_BACKEND": "gloo",
}
SRUN = {
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "2",
    "SLURM_NTASKS": "6",
    "SLURM_STEP_TASKS_PER_NODE": "2(x3)",
    "SLURM_JOB_NODELIST": "gpu[07-09]",
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
}

ROWS = [
    # (name, environ, flags, cuda, expected fields)
    (
        "nothing",
        {},
        LaunchFlags(),
        0,
        dict(
            rank=0,
            local_rank=0,
            node_rank=0,
            world_size=1,
            local_world_size=1,
            launcher="single",
            backend="gloo",
            device="cpu",
        ),
    ),
    (
        "torchrun uses GROUP_RANK",
        TORCHRUN,
        LaunchFlags(),
        0,
        dict(
            rank=3,
            local_rank=1,
            node_rank=1,
            world_size=4,
            local_world_size=2,
            master_addr="node0",
            master_port=29400,
            launcher="torchrun",
        ),
    ),
    (
        "our scripts set NODE_RANK",
        SCRIPT,
        LaunchFlags(backend="gloo"),
        0,
        dict(
            rank=2, local_rank=0, node_rank=1, world_size=4, master_addr="10.0.0.1", master_port=23456, launcher="env"
        ),
    ),
    ("NODE_RANK wins over GROUP_RANK", {**SCRIPT, "GROUP_RANK": "0"}, LaunchFlags(), 0, dict(node_rank=1)),
    (
        "node rank derived when absent",
        {k: v for k, v in SCRIPT.items() if k != "NODE_RANK"},
        LaunchFlags(),
        0,
        dict(node_rank=1),
    ),
    ("spawned children", {**SCRIPT, "SLURMGEN_TRAIN_SPAWNED": "1"}, LaunchFlags(), 0, dict(launcher="spawn")),
    ("env contract beats SLURM", {**SRUN, **SCRIPT}, LaunchFlags(), 0, dict(rank=2, launcher="env")),
    (
        "plain srun",
        SRUN,
        LaunchFlags(),
        0,
        dict(
            rank=5,
            local_rank=1,
            node_rank=2,
            world_size=6,
            local_world_size=2,
            master_addr="gpu07",
            master_port=24242,
            launcher="srun",
        ),
    ),
    (
        "srun with MASTER_ADDR/PORT given",
        {**SRUN, "MASTER_ADDR": "gpu09", "MASTER_PORT": "1234"},
        LaunchFlags(),
        0,
        dict(master_addr="gpu09", master_port=1234),
    ),
    (
        "srun step count wins",
        {**SRUN, "SLURM_STEP_NUM_TASKS": "6", "SLURM_NTASKS": "12"},
        LaunchFlags(),
        0,
        dict(world_size=6),
    ),
    (
        "srun uneven nodes",
        {**SRUN, "SLURM_STEP_TASKS_PER_NODE": "3,2,1", "SLURM_LOCALID": "0"},
        LaunchFlags(),
        0,
        dict(local_world_size=1),
    ),
    (
        "batch step id is not srun",
        {**SRUN, "SLURM_STEP_ID": "4294967294"},
        LaunchFlags(),
        0,
        dict(launcher="single", world_size=1),
    ),
    (
        "batch shell (no step id) is not srun",
        {k: v for k, v in SRUN.items() if k != "SLURM_STEP_ID"},
        LaunchFlags(),
        0,
        dict(
            launcher="single",
            world_size=1,
            note="started in the batch script of a job with SLURM_NTASKS=6, not by srun: "
            "running ONE process; start the trainer with srun (or a slurmgen script) to use every task",
        ),
    ),
    (
        "srun with one task",
        {
            **SRUN,
            "SLURM_NTASKS": "1",
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
            "SLURM_STEP_TASKS_PER_NODE": "1",
        },
        LaunchFlags(),
        0,
        dict(launcher="srun", world_size=1, note=""),
    ),
    (
        "manual flags",
        {},
        LaunchFlags(rank=1, world_size=2, master_addr="h0", master_port=4000),
        0,
        dict(rank=1, world_size=2, local_rank=0, master_addr="h0", master_port=4000, launcher="manual"),
    ),
    (
        "manual flags beat env",
        SCRIPT,
        LaunchFlags(rank=0, world_size=2, local_rank=0),
        0,
        dict(rank=0, world_size=2, master_addr="10.0.0.1", launcher="manual"),
    ),
    (
        "flags override master",
        SCRIPT,
        LaunchFlags(master_addr="other", master_port=999),
        0,
        dict(master_addr="other", master_port=999),
    ),
    ("auto picks nccl with GPUs", SCRIPT, LaunchFlags(), 2, dict(backend="nccl", device="cuda:0")),
    (
        "gloo on a GPU node keeps the GPU",
        {**SCRIPT, "LOCAL_RANK": "1"},
        LaunchFlags(backend="gloo"),
        2,
        dict(backend="gloo", device="cuda:1"),
    ),
    (
        "world of one needs no master",
        {"RANK": "0", "WORLD_SIZE": "1"},
        LaunchFlags(),
        0,
        dict(world_size=1, master_port=29500),
    ),
]


@pytest.mark.parametrize("name,environ,flags,cuda,expected", ROWS, ids=[r[0] for r in ROWS])
def test_detect(name, environ, flags, cuda, expected):
    got = detect(environ, flags, cuda)
    assert isinstance(got, DistEnv)
    assert {k: getattr(got, k) for k in expected} == expected


ERRORS = [
    ("RANK >= WORLD_SIZE", {**SCRIPT, "RANK": "4"}, LaunchFlags(), 0, "RANK=4 is not below WORLD_SIZE=4"),
    (
        "LOCAL_RANK too big",
        {**SCRIPT, "LOCAL_RANK": "2"},
        LaunchFlags(),
        0,
        "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2",
    ),
    (
        "more ranks than GPUs",
        {**SCRIPT, "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "3"},
        LaunchFlags(),
        1,
        "LOCAL_RANK=1 but only 1 GPU(s) are visible (CUDA_VISIBLE_DEVICES=3)",
    ),
    ("nccl without GPU", SCRIPT, LaunchFlags(backend="nccl"), 0, "backend nccl needs a CUDA GPU"),
    (
        "missing MASTER_ADDR",
        {k: v for k, v in SCRIPT.items() if k != "MASTER_ADDR"},
        LaunchFlags(),
        0,
        "MASTER_ADDR is not set but WORLD_SIZE=4",
    ),
    (
        "missing MASTER_PORT",
        {k: v for k, v in SCRIPT.items() if k != "MASTER_PORT"},
        LaunchFlags(),
        0,
        "MASTER_PORT is not set",
    ),
    (
        "missing LOCAL_RANK",
        {k: v for k, v in SCRIPT.items() if k != "LOCAL_RANK"},
        LaunchFlags(),
        0,
        "LOCAL_RANK is not",
    ),
    (
        "not an integer",
        {**SCRIPT, "WORLD_SIZE": "four"},
        LaunchFlags(),
        0,
        "WORLD_SIZE must be an integer (got 'four')",
    ),
    (
        "local world larger than world",
        {**SCRIPT, "LOCAL_WORLD_SIZE": "8"},
        LaunchFlags(),
        0,
        "LOCAL_WORLD_SIZE=8 is larger than WORLD_SIZE=4",
    ),
    (
        "bad port",
        {**SCRIPT, "MASTER_PORT": "70000"},
        LaunchFlags(),
        0,
        "MASTER_PORT must be between 1 and 65535 (got 70000)",
    ),
    ("manual rank alone", {}, LaunchFlags(rank=1), 0, "--rank and --world-size must be given together"),
    ("manual without master", {}, LaunchFlags(rank=1, world_size=2), 0, "--master-addr is needed with --world-size 2"),
    (
        "srun without nodelist",
        {k: v for k, v in SRUN.items() if k != "SLURM_JOB_NODELIST"},
        LaunchFlags(),
        0,
        "without MASTER_ADDR and without SLURM_JOB_NODELIST",
    ),
    ("unknown backend", {}, LaunchFlags(backend="mpi"), 0, "backend must be one of auto, nccl, gloo (got 'mpi')"),
]


@pytest.mark.parametrize("name,environ,flags,cuda,message", ERRORS, ids=[r[0] for r in ERRORS])
def test_detect_names_the_mistake(name, environ, flags, cuda, message):
    with pytest.raises(EnvError) as info:
        detect(environ, flags, cuda)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "nodelist,host",
    [
        ("node1", "node1"),
        ("gpu[07-09,11],cpu1", "gpu07"),
        ("gpu[011-012]", "gpu011"),
        ("a,b", "a"),
        ("n[1-2]-ib[3-4]", "n1-ib3"),
        ("rack[2,5]-n[01-04]", "rack2-n01"),
        ("10.0.0.5", "10.0.0.5"),
    ],
)
def test_first_host(nodelist, host):
    assert first_host(nodelist) == host


@pytest.mark.parametrize("bad", ["", "[", "gpu[01"])
def test_first_host_rejects_garbage(bad):
    with pytest.raises(EnvError):
        first_host(bad)


def test_tasks_on_node():
    assert [tasks_on_node("2(x3),1", i) for i in range(4)] == [2, 2, 2, 1]
    with pytest.raises(EnvError):
        tasks_on_node("2(x2)", 2)
    with pytest.raises(EnvError):
        tasks_on_node("two", 0)


def test_job_port_is_stable_and_in_range():
    assert job_port("123456") == 20000 + 3456
    assert job_port("77_3") == job_port("773")  # array job ids
    assert all(20000 <= job_port(str(j)) < 30000 for j in range(0, 100000, 997))


def test_resolve_backend():
    assert resolve_backend("auto", 0) == ("gloo", "cpu")
    assert resolve_backend("auto", 4) == ("nccl", "cuda")
    assert resolve_backend("gloo", 4) == ("gloo", "cuda")


def test_describe_is_one_line():
    text = detect(SCRIPT, LaunchFlags(), 0).describe()
    assert "rank=2" in text and "launcher=env" in text and "\n" not in text


def test_torch_versions_the_trainer_refuses_warns_about_or_accepts():
    from slurmgen.train import compat

    error, _ = compat.check("2.1.2+cu121", cuda=True)
    assert error.startswith("torch 2.1.2+cu121 is too old for slurmgen.train: it needs torch >= 2.3")
    assert "pytorch/pytorch#153960" in compat.check("2.6.3", cuda=True)[1]
    assert compat.check("2.6.3", cuda=False)[1].startswith("torch 2.6.3 is older than the tested 2.13")
    assert compat.check("2.13.0+cpu", cuda=False) == compat.check("2.14.1", cuda=True) == (None, None)
