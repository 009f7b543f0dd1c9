"""What every launcher hands each rank besides the rank contract, and what a sweep task runs.

- OMP_NUM_THREADS (issue 20, item 4): without it each of a node's ranks starts one OpenMP
  thread per core. One rule, in bash (templates/omp_threads.sh.j2, in both scripts) and in
  Python (slurmgen/contract/threads.py, the coordinator's agent); the user's value always wins.
- Sweep placeholders (item 12): `{task}` and `{sweep.KEY}` in the command are filled per array
  task, hostile values reaching the program literally; the trainer's default output directory
  is per array task.
Real bash and real processes; srun is the stand-in of test_script_behaviour.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
from helpers import HOSTILE, REPORTER, reports, write

from slurmgen.contract import grid as sweep
from slurmgen.contract.threads import default_omp_threads
from slurmgen.coordinator.models import StartOrder
from slurmgen.coordinator.node_agent import WorkerAgent
from slurmgen.errors import SlurmgenError
from slurmgen.generate.render import LAUNCH_SCRIPT, render, render_template
from slurmgen.generate.specfile import build_spec
from slurmgen.train.cli import build_parser

SHOW_OMP = ["bash", "-c", 'echo "OMP rank $RANK: ${OMP_NUM_THREADS-unset}"']


def omp_seen(stdout: str) -> dict[int, str]:
    return {
        int(line.split("OMP rank ")[1].split(":")[0]): line.rsplit(": ", 1)[1]
        for line in stdout.splitlines()
        if "OMP rank " in line
    }


# --- OMP_NUM_THREADS ---------------------------------------------------------------------------
CASES = [  # (environment, ranks sharing the task's CPUs, ranks on the node) -> what the rank sees
    ({"OMP_NUM_THREADS": "6"}, 2, 2, "6"),
    ({"OMP_NUM_THREADS": "6", "SLURM_CPUS_PER_TASK": "8"}, 1, 2, "6"),
    ({}, 1, 2, "1"),
    ({}, 2, 2, "1"),
    ({}, 1, 1, None),
    ({"OMP_NUM_THREADS": ""}, 1, 2, "1"),
    ({"SLURM_CPUS_PER_TASK": "8"}, 1, 4, "8"),
    ({"SLURM_CPUS_PER_TASK": "8"}, 2, 2, "4"),
    ({"SLURM_CPUS_PER_TASK": "8"}, 3, 3, "2"),
    ({"SLURM_CPUS_PER_TASK": "1"}, 4, 4, "1"),
    ({"SLURM_CPUS_PER_TASK": "08"}, 1, 1, "8"),
    ({"SLURM_CPUS_PER_TASK": "0"}, 2, 2, "1"),
    ({"SLURM_CPUS_PER_TASK": "x"}, 1, 1, None),
]


def clean_environ(**env: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK")}, **env}


@pytest.mark.parametrize("env, sharing, per_node, seen", CASES)
def test_one_rule_for_omp_threads_in_bash_and_python(env, sharing, per_node, seen):
    """The user's value wins; else Slurm's CPUs per task shared by the task's ranks; else 1 with
    several ranks a node (torchrun's rule), the OpenMP default for a lone rank."""
    python = default_omp_threads(env, sharing, per_node) or env.get("OMP_NUM_THREADS") or None
    script = (
        render_template("omp_threads.sh.j2")
        + f"default_omp_threads {sharing} {per_node}\n"
        + 'echo "${OMP_NUM_THREADS-unset}"\n'
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=clean_environ(**env), check=True)
    bash = out.stdout.strip()
    assert (python, None if bash in ("unset", "") else bash) == (seen, seen)


@pytest.mark.parametrize(
    "launcher_env, spec_env, seen",
    [
        ({}, {}, "1"),  # two ranks a node, Slurm says no CPU count
        ({"SLURM_CPUS_PER_TASK": "3"}, {}, "3"),  # a task is a rank with its 3 CPUs
        ({"OMP_NUM_THREADS": "5"}, {}, "5"),  # the user's environment wins
        ({"SLURM_CPUS_PER_TASK": "3"}, {"OMP_NUM_THREADS": "7"}, "7"),  # and so does the spec's env
    ],
)
def test_srun_mode_ranks_get_omp_threads_unless_the_user_set_them(
    tmp_path, fake_slurm, monkeypatch, launcher_env, spec_env, seen
):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    out = write(tmp_path, nodes=2, gpus=2, command=SHOW_OMP, env=spec_env)
    result = fake_slurm(out, env=launcher_env)
    assert result.returncode == 0, result.stderr
    assert omp_seen(result.stdout) == {r: seen for r in range(4)}


@pytest.mark.parametrize(
    "launcher_env, seen", [({}, "1"), ({"OMP_NUM_THREADS": "5"}, "5"), ({"SLURM_CPUS_PER_TASK": "4"}, "2")]
)
def test_launch_multi_node_ranks_get_omp_threads_unless_the_user_set_them(tmp_path, launcher_env, seen):
    out = write(tmp_path, command=SHOW_OMP)
    result = subprocess.run(
        [str(out / LAUNCH_SCRIPT), "127.0.0.1", "1", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_environ(MASTER_PORT="29998", **launcher_env),
    )
    assert result.returncode == 0, result.stderr
    assert omp_seen(result.stdout) == {0: seen, 1: seen}


@pytest.mark.parametrize(
    "forwarded, seen", [({}, {0: "1", 1: "1", 2: "unset"}), ({"OMP_NUM_THREADS": "4"}, {0: "4", 1: "4", 2: "4"})]
)
def test_slurmgen_launch_ranks_get_omp_threads_unless_the_user_set_them(tmp_path, monkeypatch, forwarded, seen):
    """`slurmgen launch` runs launch_multi_node.sh on each node: host h0 runs two ranks (1 thread
    each), h1 one (the OpenMP default); OMP_NUM_THREADS forwarded from the user's shell wins."""
    from helpers import local_plan
    from helpers import run_launcher as run

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    code, out, err = run(local_plan(tmp_path, SHOW_OMP, slots=(2, 1), env=forwarded))
    assert code == 0, err
    assert omp_seen(out) == seen


def test_the_coordinator_agent_gives_its_ranks_omp_threads_unless_the_group_set_them(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    agent = WorkerAgent(client=None, workers=2, host="gn6", state_dir=tmp_path)
    show = [sys.executable, "-c", "import os; print('OMP', os.environ.get('OMP_NUM_THREADS'))"]
    try:
        for worker, env in enumerate([{}, {"OMP_NUM_THREADS": "3"}]):
            agent.procs.start(
                StartOrder(
                    worker=worker,
                    group="g",
                    attempt=1,
                    rank=worker,
                    argv=show,
                    cwd=None,
                    env={"RANK": str(worker), "LOCAL_WORLD_SIZE": "2", **env},
                    heartbeat_timeout=60.0,
                ),
                agent.hb_root,
            )
        deadline = time.monotonic() + 10
        while any(s.exit_code is None for s in agent.procs.slots) and time.monotonic() < deadline:
            time.sleep(0.02)
        report, _ = agent.report()
        assert sorted((ln.rank, ln.line) for ln in report.lines) == [(0, "OMP 1"), (1, "OMP 3")]
    finally:
        agent.procs.stop_all(1)


# --- sweep placeholders ------------------------------------------------------------------------
def test_fill_replaces_task_and_sweep_values_once_per_word():
    point = {"lr": 3e-4, "model.depth": 4, "flag": True, "name": "{task} $(x)"}
    command = [
        "python",
        "t.py",
        "--out-dir",
        "runs/{sweep.lr}/d{sweep.model.depth}-{task}",
        "--tag={sweep.name}",
        "{sweep.flag}",
        "{notours}",
    ]
    assert sweep.fill(command, point, 3) == [
        "python",
        "t.py",
        "--out-dir",
        "runs/0.0003/d4-3",
        "--tag={task} $(x)",
        "true",
        "{notours}",
    ]


@pytest.mark.parametrize(
    "values, words",
    [
        (
            {"command": ["python", "t.py", "--out-dir", "runs/{task}"]},
            "command: {task} is filled per task of a sweep, and this job has no sweep",
        ),
        (
            {"command": ["python", "t.py", "{sweep.lr}"], "array": "0-3"},
            "command: {sweep.lr} is filled per task of a sweep",
        ),
        (
            {"command": ["python", "t.py", "{sweep.bs}"], "sweep": {"lr": [1, 2]}},
            "command: {sweep.bs} names no parameter of sweep point 0 "
            "(expected {task} or {sweep.KEY} with KEY one of: lr)",
        ),
        (
            {"command": ["python", "t.py", "{sweep.bs}"], "sweep": [{"bs": 1}, {"lr": 2}]},
            "command: {sweep.bs} names no parameter of sweep point 1",
        ),
    ],
)
def test_a_placeholder_that_cannot_be_filled_is_refused_at_create(values, words):
    with pytest.raises(SlurmgenError) as caught:
        build_spec({"output_dir": "out", **values})
    assert words in str(caught.value)


def test_each_sweep_task_gets_its_own_out_dir_and_hostile_values_arrive_literally(tmp_path, fake_slurm):
    odd = [h for h in HOSTILE if h.strip() and h.isprintable()]  # a sweep value is one line; an empty one is refused
    out = write(
        tmp_path,
        nodes=1,
        gpus=1,
        command=[*REPORTER, "--out-dir", "runs/x/{task}", "--tag", "{sweep.v}-{task}"],
        sweep=[{"v": v} for v in odd],
        sweep_args="--v={value}",
    )
    script = (out / "run_slurm.sh").read_text()
    if shutil.which("shellcheck"):
        lint = subprocess.run(["shellcheck", str(out / "run_slurm.sh")], capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout
    assert "0) cmd=(python3 -c " in script
    for task, value in enumerate(odd):
        result = fake_slurm(
            out, nodes=1, job_id=str(4240 + task), env={"SLURM_ARRAY_JOB_ID": "4240", "SLURM_ARRAY_TASK_ID": str(task)}
        )
        assert result.returncode == 0, result.stderr
        assert [r["argv"] for r in reports(result.stdout)] == [
            ["--out-dir", f"runs/x/{task}", "--tag", f"{value}-{task}", f"--v={value}"]
        ], result.stdout + result.stderr


def test_a_sweep_without_placeholders_still_appends_to_one_command():
    script = render(build_spec({"output_dir": "out", "command": ["python", "t.py"], "sweep": {"lr": [1, 2]}})).files
    assert "cmd=(python t.py)\n" in script["run_slurm.sh"] and "  1) cmd+=(--lr 2) ;;" in script["run_slurm.sh"]


@pytest.mark.parametrize(
    "environ, out_dir",
    [
        ({}, "runs/train"),
        ({"SLURM_JOB_ID": "77"}, "runs/job-77"),
        # An array task has a job id of its own, but its directory is named as its log is (%A_%a).
        ({"SLURM_JOB_ID": "101", "SLURM_ARRAY_JOB_ID": "100", "SLURM_ARRAY_TASK_ID": "1"}, "runs/job-100_1"),
    ],
)
def test_the_trainers_default_out_dir_is_per_job_and_per_array_task(environ, out_dir):
    assert build_parser(environ).parse_args([]).out_dir == out_dir
