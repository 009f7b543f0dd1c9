"""The retry policy and the attempts record of run_slurm.sh, run by real bash with a stand-in
srun (one node, one task, srun's own failure line), a stand-in torchrun agent (its workers one
after the other) and an scontrol that logs its calls.
tests/integration/test_slurm_heal.py runs the same against a real Slurm."""

import json
import os
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest

from slurmgen.generate.output import write_files
from slurmgen.generate.render import SLURM_SCRIPT, render
from slurmgen.generate.specfile import build_spec
from slurmgen.heal.attempts import attempts_path, cause, finished_path, read_attempts, stuck

FAKE_SRUN = textwrap.dedent("""\
    #!/usr/bin/env bash
    while [[ $1 == -* ]]; do shift; done
    SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_NTASKS=1 SLURMD_NODENAME=${FAKE_NODE:-gpu07} "$@"
    rc=$?
    if ((rc == 137)); then
      echo "srun: error: gpu07: task 0: Killed" >&2
    elif ((rc != 0)); then
      echo "srun: error: gpu07: task 0: Exited with exit code $rc" >&2
    fi
    exit $rc
""")
# The agent of one node: its workers get the torchrun variables; like torchrun it exits 1 when
# one fails, so the srun report names the agent's task, never the failing rank.
FAKE_TORCHRUN = textwrap.dedent("""\
    #!/usr/bin/env bash
    if [[ -n ${FAKE_AGENT_FAILS:-} ]]; then echo "$FAKE_AGENT_FAILS" >&2; exit 1; fi
    nproc=1
    while [[ $1 == -* ]]; do
      case $1 in --nproc-per-node=*) nproc=${1#*=} ;; esac
      shift
    done
    rc=0
    for ((i = 0; i < nproc; i++)); do
      RANK=$((SLURM_NODEID * nproc + i)) LOCAL_RANK=$i GROUP_RANK=$SLURM_NODEID "$@" || rc=1
    done
    exit $rc
""")
FAKE_SCONTROL = textwrap.dedent("""\
    #!/usr/bin/env bash
    echo "$*" >>"$SCONTROL_LOG"
    case $1 in
      show) [[ $2 == hostnames ]] && echo localhost || echo "JobId=$3 ExcNodeList=gpu01 NodeList=gpu07" ;;
    esac
""")


@pytest.fixture
def job(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("torchrun", FAKE_TORCHRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755 | stat.S_IEXEC)
    calls = tmp_path / "scontrol.log"
    runs = tmp_path / "runs"

    def run(code_by_attempt, restart=0, program=None, batch_env=None, **spec):
        program = program or [
            "bash",
            "-c",
            f"echo run >>{runs}; codes=({' '.join(map(str, code_by_attempt))}); "
            'exit "${codes[${SLURM_RESTART_COUNT:-0}]}"',
        ]
        built = build_spec({"output_dir": str(tmp_path / "out"), "command": program, **spec})
        write_files(Path(built.output_dir), render(built).files, force=True, extra_dirs=[Path(built.logs)])
        env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "SCONTROL_LOG": str(calls),
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "gpu07",
            "SLURM_JOB_NUM_NODES": "1",
            "SLURM_RESTART_COUNT": str(restart),
            **(batch_env or {}),
        }
        done = subprocess.run(
            ["bash", str(Path(built.output_dir) / SLURM_SCRIPT)], capture_output=True, text=True, timeout=60, env=env
        )
        log = Path(built.logs)
        scontrol = [c for c in (calls.read_text().splitlines() if calls.exists() else []) if "hostnames" not in c]
        return done, read_attempts(attempts_path(log, "4242")), scontrol, finished_path(log, "4242")

    run.runs = runs
    return run


def test_a_matching_failure_requeues_and_excludes_its_node_until_retries_run_out(job):
    spec = {"retries": 1, "retry_on": "3", "exclude_failed_node": True}
    done, records, scontrol, _ = job([3, 3], **spec)
    assert done.returncode == 3 and "requeueing the job (retry 1 of 1)" in done.stderr, done.stderr
    assert scontrol == ["requeue 4242", "show job -o 4242", "update JobId=4242 ExcNodeList=gpu01,gpu07"]
    end = records[-1]
    assert (end["event"], end["exit_code"], end["rank"], end["node"], end["task"], end["action"], end["exclude"]) == (
        "end",
        3,
        0,
        "gpu07",
        0,
        "requeue",
        "gpu07",
    )
    assert cause(end) == "exit 3 (rank 0 on gpu07)"
    # The requeued attempt fails the same way: the one retry is used up, so it stops.
    done, records, scontrol, _ = job([3, 3], restart=1, **spec)
    assert done.returncode == 3 and len(scontrol) == 3
    # Attempts count from 1 (contract/attempts.py): Slurm's restart count 0 is attempt 1.
    assert [(r["event"], r["attempt"], r.get("action")) for r in records] == [
        ("start", 1, None),
        ("end", 1, "requeue"),
        ("start", 2, None),
        ("end", 2, "stop"),
    ]


def test_without_the_earlier_attempts_in_the_record_the_restart_count_limits_retries(job, tmp_path):
    done, records, scontrol, _ = job([3, 3, 3], restart=1, retries=1, retry_on="3")
    assert done.returncode == 3 and scontrol == [] and records[-1]["action"] == "stop"
    done, records, scontrol, _ = job([3, 3, 3], restart=2, retries=3, retry_on="3")
    assert scontrol == ["requeue 4242"] and records[-1]["action"] == "requeue"


def test_under_torchrun_the_record_names_the_failing_rank_not_the_nodes_agent(job):
    # Worker rank 1 exits 3; the agent (task 0) exits 1, and srun reports only the agent.
    done, records, scontrol, _ = job(
        [],
        program=["bash", "-c", "((RANK != 1)) || exit 3"],
        launcher="torchrun",
        gpus=2,
        retries=1,
        retry_on="3",
        exclude_failed_node=True,
    )
    end = records[-1]
    assert (end["exit_code"], end["rank"], end["node"], end["task"], end["action"], end["exclude"]) == (
        3,
        1,
        "gpu07",
        0,
        "requeue",
        "gpu07",
    ), done.stderr
    assert scontrol[-1] == "update JobId=4242 ExcNodeList=gpu01,gpu07" and done.returncode == 3
    done, records, _, _ = job([], program=["bash", "-c", "((RANK != 1)) || exit 3"], launcher="torchrun", gpus=2)
    assert done.returncode == 3 and done.stderr.splitlines()[-1] == (
        "slurmgen: rank 1 on gpu07 exited with code 3 first; the job exits with it (the step's code was 1)"
    )


def test_without_a_note_srun_s_report_is_the_answer(job):
    # The rank's wrapper is killed before it could write a note: srun's line names the task.
    killed = {
        "program": ["bash", "-c", "kill -KILL $PPID"],
        "retries": 1,
        "retry_on": "137",
        "exclude_failed_node": True,
    }
    done, records, scontrol, _ = job([], **killed)
    assert done.returncode == 137 and "slurmgen-exit" not in done.stderr, done.stderr
    end = records[-1]
    assert (end["exit_code"], end["rank"], end["node"], end["task"], end["exclude"]) == (137, 0, "gpu07", 0, "gpu07")
    done, _, _, _ = job([], restart=1, **killed)  # the retry used up: the job stops, saying why
    assert done.stderr.splitlines()[-1] == (
        "slurmgen: task 0 on gpu07 ended first, by a signal (srun's report "
        "above); the job exits with the step's code 137"
    )
    # A torchrun agent that fails by itself (its rendezvous, say) names its node and task, no rank.
    done, records, _, _ = job(
        [], program=["bash", "-c", "exit 0"], launcher="torchrun", env={"FAKE_AGENT_FAILS": "rendezvous timed out"}
    )
    end = records[-1]
    assert (done.returncode, end["exit_code"], end["rank"], end["node"], end["task"]) == (1, 1, None, "gpu07", 0)
    assert "slurmgen: task 0 on gpu07 exited with code 1 first (srun's report" in done.stderr.splitlines()[-1]


@pytest.mark.parametrize("node", ["gpu\"07\\'$x*", "007"])
def test_the_record_parses_whatever_the_node_names_hold(job, node):
    """Quotes, backslashes and control characters become JSON escapes, and a name that only looks
    like a number (a leading 0) stays a string: every line parses, to the names themselves."""
    host, nodes = 'batch "1"\\\n\tend\x01', node + ",gpu[08-09]\nx"
    done, records, scontrol, _ = job(
        [3, 3],
        retries=1,
        retry_on="3",
        exclude_failed_node=True,
        batch_env={"SLURMD_NODENAME": host, "SLURM_JOB_NODELIST": nodes, "FAKE_NODE": node},
    )
    assert done.returncode == 3, done.stderr
    assert [(r["event"], r["host"]) for r in records] == [("start", host), ("end", host)]
    assert records[0]["nodes"] == nodes
    end = records[-1]
    assert (end["exit_code"], end["rank"], end["node"], end["action"], end["exclude"]) == (3, 0, node, "requeue", node)
    assert scontrol[-1] == f"update JobId=4242 ExcNodeList=gpu01,{node}"


def test_other_codes_stop_and_a_finished_job_never_runs_again(job):
    done, records, scontrol, finished = job([1, 0, 0], retries=2, retry_on=[3, 124])
    assert done.returncode == 1 and scontrol == [] and records[-1]["action"] == "stop"
    assert not finished.exists()
    done, records, _, finished = job([1, 0, 0], restart=1, retries=2, retry_on=[3, 124])
    assert done.returncode == 0 and records[-1]["action"] == "finished" and finished.exists()
    done, records, scontrol, _ = job([1, 0, 0], restart=2, retries=2, retry_on=[3, 124])
    assert done.returncode == 0 and "already finished" in done.stderr
    assert records[-1]["event"] == "skipped" and scontrol == []
    assert job.runs.read_text().count("run") == 2


def test_the_record_reader_skips_a_line_cut_by_a_kill(tmp_path):
    path = tmp_path / "a.jsonl"
    lines = [
        {"event": "start", "job": "7", "attempt": 1},
        {"event": "end", "job": "7", "attempt": 1, "exit_code": 124, "hung_rank": 5, "node": "n2"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"event": "sta')
    assert read_attempts(path) == lines
    assert cause(lines[1]) == "hung (rank 5 on n2)"
    assert cause({"exit_code": 3, "rank": None, "task": 1, "node": "n2"}) == "exit 3 (task 1 on n2)"


def test_status_says_where_the_hung_rank_was_stuck():
    end = {
        "event": "end",
        "exit_code": 124,
        "hung_rank": 3,
        "stack": [
            {"file": "/usr/lib/python3.11/threading.py", "line": 327, "function": "wait"},
            {"file": "/w/train.py", "line": 123, "function": "step"},
            {"file": "/w/train.py", "line": 200, "function": "main"},
            {"file": "/w/train.py", "line": 210, "function": "<module>"},
        ],
    }
    assert (
        stuck(end) == "rank 3 stuck in threading.py:327 in wait() <- train.py:123 in step() <- train.py:200 in main()"
    )
    assert stuck({**end, "stack": None}) is None and stuck({"event": "end"}) is None
