"""Check before submit (issue 36, item 3): a request the cluster can never meet is refused with what
the cluster has and a request that fits; `--no-check` skips it; a job that only waits is submitted.
The facts are Slurm 22.05.8's own output, recorded on the test cluster (2 nodes of 8 CPUs, 16000 MB
and 4 GPUs; a `short` partition of MaxTime 10 added with `scontrol create`, node2 given the feature
`fast`); the stand-in commands on PATH print them. The real cluster: tests/integration/test_request_check_slurm.py."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

import pytest
from helpers import run

from slurmgen.generate.specfile import spec_from_sources
from slurmgen.jobs import request_check, test_only

SINFO = (
    "node1|debug*|8|16000|gpu:4|(null)\n"
    "node1|short|8|16000|gpu:4|(null)\n"
    "node2|debug*|8|16000|gpu:4|fast\n"
    "node2|short|8|16000|gpu:4|fast\n"
)
_PART = (
    "PartitionName={name} AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default={default} QoS=N/A "
    "DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED "
    "MaxTime={max_time} MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=node[1-2] PriorityJobFactor=1 "
    "PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF State=UP "
    "TotalCPUs=16 TotalNodes=2 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED "
    "MaxMemPerNode=UNLIMITED TRES=cpu=16,mem=32000M,node=2,billing=16\n"
)
PARTITIONS = _PART.format(name="debug", default="YES", max_time="UNLIMITED") + _PART.format(
    name="short", default="NO", max_time="00:10:00"
)
NOW = "sbatch: Job 13 to start at 2026-11-28T10:24:57 using 1 processors on nodes node2 in partition debug\n"
LATER = "sbatch: Job 14 to start at 2026-11-28T11:24:57 using 1 processors on nodes node2 in partition debug\n"
NEVER = "allocation failure: Requested node configuration is not available\n"


def facts(enforce: str = "", assoc: str = "root||\n", estimate: str = NOW) -> request_check.Facts:
    return request_check.parse(
        SINFO,
        PARTITIONS,
        f"AccountingStorageEnforce = {enforce or 'none'}\n",
        assoc,
        "2026-11-28T10:24:50\n",
        test_only.parse(estimate, 0 if "to start" in estimate else 1),
    )


def problems(enforce: str = "", assoc: str = "root||\n", estimate: str = NOW, **fields) -> list[str]:
    spec = spec_from_sources(None, {"command": ["python", "train.py"], **fields})
    return request_check.problems(spec, facts(enforce, assoc, estimate))


def test_the_cluster_facts_are_read():
    found = facts()
    assert sorted(found.partitions) == ["debug", "short"]
    debug, short = found.partitions["debug"], found.partitions["short"]
    assert debug.default and not short.default and (debug.max_time, short.max_time) == (None, 600)
    assert [(n.name, n.cpus, n.mem_mb, n.gpus, sorted(n.features)) for n in short.nodes] == [
        ("node1", 8, 16000, {None: 4}, []),
        ("node2", 8, 16000, {None: 4}, ["fast"]),
    ]
    assert found.now == datetime(2026, 11, 28, 10, 24, 50) and found.accounts == frozenset({"root"})


def test_a_request_the_cluster_meets_has_no_problem():
    assert problems(nodes=2, gpus=4, gpu_request="gpus-per-node", mem="16000M") == []
    assert problems(constraint="fast|slow") == []
    assert problems(partition="short", time="10", nodes=1, constraint="fast", cpus_per_task=2, gpus=4) == []


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        (
            {"nodes": 2, "gpus": 8, "gpu_request": "gpus-per-node"},
            "gpus: the nodes of partition debug have at most 4 GPUs (asked 8 per node); fits: --gpus 4",
        ),
        (
            {"nodes": 1, "gpus": 8, "gpu_request": "gpus-per-node"},
            "gpus: the nodes of partition debug have at most 4 GPUs (asked 8 per node); "
            "fits: --nodes 2 --gpus 4 (the same 8 processes)",
        ),
        (
            {"gpus": 2, "gpu_request": "gres", "gpu_type": "a100"},
            "gpu_type: none of the nodes of partition debug has GPUs of type 'a100' (their GPUs are untyped)",
        ),
        (
            {"mem": "99G"},
            "mem: the nodes of partition debug have at most 16000M of memory (asked 101376M per node); "
            "fits: --mem 16000M",
        ),
        (
            {"gpus": 4, "cpus_per_task": 4},
            "cpus_per_task: the nodes of partition debug have at most 8 CPUs (asked 16 per node: 4 processes x 4); "
            "fits: --cpus-per-task 2",
        ),
        (
            {"constraint": "fast&ib"},
            "constraint: none of the nodes of partition debug has feature 'ib' (their features: fast)",
        ),
        (
            {"nodes": 2, "constraint": "fast"},
            "nodes: partition debug has 1 node(s) that fit one node's request (asked 2); fits: --nodes 1",
        ),
        (
            {"partition": "short", "time": "1:00:00"},
            "time: partition short allows at most 00:10:00 (asked 1:00:00); fits: --time 00:10:00, "
            "with --chain K for a longer run",
        ),
        ({"partition": "gpu"}, "partition: the cluster has no partition 'gpu' (it has: debug, short)"),
    ],
)
def test_a_request_the_cluster_can_never_meet_says_what_it_has_and_what_fits(fields, said):
    assert problems(**fields) == [said]


def test_accounts_and_qos_are_held_to_the_associations_only_where_slurm_enforces_them():
    assert problems(account="nosuch", qos="high") == []  # the test cluster: no AccountingStorageEnforce
    assoc = "proj1|normal,high\nproj2|normal\n"
    assert problems("associations,limits,qos", assoc, account="nosuch", qos="urgent") == [
        "account: your associations on this cluster have no account 'nosuch' (yours: proj1, proj2)",
        "qos: your associations on this cluster have no qos 'urgent' (yours: high, normal)",
    ]
    assert problems("associations,limits,qos", assoc, account="proj2", qos="high") == []


def test_test_only_refusal_is_kept_when_the_facts_do_not_explain_it():
    assert problems(estimate=NEVER) == [
        "slurm: sbatch --test-only says the request can never start: Requested node configuration is not available"
    ]


def fake_cluster(tmp_path: Path, monkeypatch, test_only_says: str = NOW) -> Path:
    """sinfo, scontrol, sacctmgr, date and sbatch printing the recorded answers; sbatch logs its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sinfo", SINFO), ("partitions", PARTITIONS), ("test_only", test_only_says)):
        (bin_dir / f"{name}.txt").write_text(text)
    scripts = {
        "sinfo": f'cat "{bin_dir}/sinfo.txt"',
        "scontrol": f'[ "$1" = show ] && [ "$2" = partition ] && cat "{bin_dir}/partitions.txt"; '
        'echo "AccountingStorageEnforce = none"',
        "sacctmgr": "echo 'root||'",
        "date": "echo 2026-11-28T10:24:50",
        "sbatch": f'echo "$*" >>"{bin_dir}/calls"; if [ "$1" = --test-only ]; then cat >/dev/null; '
        f'cat "{bin_dir}/test_only.txt" >&2; grep -q "to start" "{bin_dir}/test_only.txt"; exit $?; fi; echo 77',
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir


def test_submit_refuses_an_impossible_request_and_submits_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bin_dir = fake_cluster(tmp_path, monkeypatch, NEVER)
    code, out, err = run(capsys, "submit", "--registry", "r.sqlite", "--gpus", "8", "--gpu-request", "gres")
    assert (code, out) == (2, ""), err
    assert err == (
        "slurmgen: error: gpus: the nodes of partition debug have at most 4 GPUs (asked 8 per node); "
        "fits: --nodes 2 --gpus 4 (the same 8 processes) (hint: the cluster can never start it; "
        "--no-check submits it anyway)\n"
    )
    assert (bin_dir / "calls").read_text() == "--test-only\n"  # one query, nothing submitted
    code, out, err = run(capsys, "submit", "--registry", "r.sqlite", "--gpus", "8", "--gpu-request", "gres",
                         "--no-check", "--force")  # fmt: skip
    assert (code, out) == (0, "77\n"), err
    assert (bin_dir / "calls").read_text().splitlines()[1].startswith("--parsable")


def test_a_job_that_only_waits_is_submitted_with_when_slurm_expects_it_to_start(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_cluster(tmp_path, monkeypatch, LATER)
    code, out, err = run(capsys, "submit", "--registry", "r.sqlite")
    assert (code, out) == (0, "77\n"), err
    assert "note: Slurm expects the job to start at 2026-11-28 11:24:57" in err


def test_a_cluster_that_cannot_be_asked_is_said_and_the_job_submitted(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bin_dir = fake_cluster(tmp_path, monkeypatch)
    (bin_dir / "sinfo").write_text("#!/bin/sh\necho 'sinfo: error: Unable to contact slurm controller' >&2\nexit 1\n")
    code, out, err = run(capsys, "submit", "--registry", "r.sqlite")
    assert (code, out) == (0, "77\n"), err
    assert "note: the request was not checked against the cluster: sinfo: error: Unable to contact" in err


def test_doctor_slurm_makes_the_same_check_of_the_job_of_config(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bin_dir = fake_cluster(tmp_path, monkeypatch)
    (tmp_path / "job.yaml").write_text("nodes: 1\ngpus: 2\npartition: short\ntime: '20'\n")
    code, out, err = run(capsys, "doctor", "--slurm", "--config", "job.yaml")
    assert (code, out) == (1, ""), err
    assert err == (
        "slurmgen: error: doctor: time: partition short allows at most 00:10:00 (asked 20); "
        "fits: --time 00:10:00, with --chain K for a longer run\n"
    )
    (tmp_path / "job.yaml").write_text("nodes: 1\ngpus: 2\npartition: short\ntime: '10'\n")
    code, out, err = run(capsys, "doctor", "--slurm", "--config", "job.yaml")
    assert (code, err) == (0, ""), err
    fits = "slurm: the request fits (1 node(s) x 2, partition debug); "
    assert out == fits + "Slurm expects it to start at 2026-11-28 10:24:57\n"
    assert (bin_dir / "calls").read_text() == "--test-only\n--test-only\n"  # nothing submitted


def test_the_python_api_makes_the_same_check_before_submitting(tmp_path, monkeypatch):
    """`Job.submit()` refuses what `submit` refuses, with the command's line (its way past the
    check named as the API spells it), writing nothing; `check=False` submits; a wait is a warning."""
    from slurmgen import Job
    from slurmgen.errors import SlurmgenError

    monkeypatch.chdir(tmp_path)
    bin_dir = fake_cluster(tmp_path, monkeypatch, NEVER)
    job = Job(gpus=8, gpu_request="gres", command=["python", "train.py"])
    with pytest.raises(SlurmgenError) as refused:
        job.submit(registry=tmp_path / "r.sqlite")
    assert str(refused.value) == (
        "gpus: the nodes of partition debug have at most 4 GPUs (asked 8 per node); "
        "fits: --nodes 2 --gpus 4 (the same 8 processes) (hint: the cluster can never start it; "
        "check=False submits it anyway)"
    )
    assert (bin_dir / "calls").read_text() == "--test-only\n" and not (tmp_path / "out").exists()
    handle = job.submit(registry=tmp_path / "r.sqlite", check=False)
    assert handle.key == "77" and (bin_dir / "calls").read_text().splitlines()[1].startswith("--parsable")
    (bin_dir / "test_only.txt").write_text(LATER)
    with pytest.warns(UserWarning, match="Slurm expects the job to start at 2026-11-28 11:24:57"):
        Job(command=["python", "train.py"], output_dir="later").submit(registry=tmp_path / "r.sqlite")


def test_doctor_slurm_remote_asks_the_login_node_over_the_connection_submit_uses(
    tmp_path, capsys, monkeypatch, login_node
):
    monkeypatch.chdir(tmp_path)
    bin_dir = fake_cluster(tmp_path, monkeypatch)
    (tmp_path / "job.yaml").write_text("nodes: 1\ngpus: 2\npartition: short\ntime: '20'\n")
    remote = ["--remote", "login1", "--remote-setup", "module load slurm || true"]
    code, out, err = run(capsys, "doctor", "--slurm", "--config", "job.yaml", *remote)
    assert (code, out) == (1, ""), err
    assert err.startswith("slurmgen: error: doctor: time: partition short allows at most 00:10:00 (asked 20)"), err
    assert login_node.opened == [("login1", None, ["module load slurm || true"])]
    assert [line[:35] for line in login_node.lines] == ["module load slurm || true && sh -c "]  # one query, no cd
    (tmp_path / "job.yaml").write_text("nodes: 1\ngpus: 2\n")
    code, out, err = run(capsys, "doctor", "--slurm", "--config", "job.yaml", *remote)
    assert (code, err) == (0, "") and out.startswith("slurm: the request fits (1 node(s) x 2, partition debug)"), err
    assert (bin_dir / "calls").read_text() == "--test-only\n--test-only\n"  # nothing submitted
    code, out, err = run(capsys, "doctor", "--config", "job.yaml", "--remote", "login1")
    assert (code, out) == (2, "") and err.count("\n") == 1 and "remote: --remote login1 asks Slurm there" in err, err


def test_submit_remote_checks_on_the_login_node_before_shipping_anything(tmp_path, capsys, monkeypatch, login_node):
    monkeypatch.chdir(tmp_path)
    bin_dir = fake_cluster(tmp_path, monkeypatch, NEVER)
    code, out, err = run(capsys, "submit", "--registry", "r.sqlite", "--gpus", "8", "--gpu-request", "gres",
                         "--remote", "login1")  # fmt: skip
    assert (code, out) == (2, "") and "gpus: the nodes of partition debug have at most 4 GPUs" in err, err
    assert (bin_dir / "calls").read_text() == "--test-only\n" and len(login_node.lines) == 1
    assert list((tmp_path / "login").iterdir()) == []  # no snapshot, no job directory
