"""The Python API (slurmgen/api/): the spec from keywords or a file with the commands' errors, what
`render()` gives, the pickling of a function, the rank runner run for real as two processes, and
`slurmgen.submit(fn)` end to end through the launcher on local 'hosts' (every host this machine,
as tests/unit/launch does); `Job.launch()` starts a real `slurmgen launch`. Under real Slurm:
tests/integration/test_python_api_slurm.py."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from helpers import PY, clean_env, kill_local_nodes, local_connector, local_plan

import slurmgen
from slurmgen.api.function import FunctionJob, dumps
from slurmgen.api.handle import Handle
from slurmgen.api.rank import result_path
from slurmgen.contract.states import State
from slurmgen.errors import SlurmgenError
from slurmgen.launch.fanout import Launcher
from slurmgen.launch.registry_entry import LaunchRecord
from slurmgen.runs.model import Recorder, find_run
from slurmgen.runs.registry import Registry
from slurmgen.ssh.connect import SSHOptions

# A module the ranks import the functions from: the standard pickle sends a function by name.
FUNCTIONS = textwrap.dedent("""
    import os

    def where(scale):
        return {"rank": int(os.environ["RANK"]), "world": int(os.environ["WORLD_SIZE"]),
                "master": os.environ.get("MASTER_ADDR"), "value": scale * 7}

    def boom(rank_that_fails):
        if int(os.environ["RANK"]) == rank_that_fails:
            raise ValueError(f"bad batch on rank {rank_that_fails}")
        return "fine"
""")


@pytest.fixture
def functions(tmp_path, monkeypatch):
    """The module `apifns` importable here and by every process the test starts."""
    (tmp_path / "apifns.py").write_text(FUNCTIONS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    import importlib

    return importlib.import_module("apifns")


# ---- the spec ----------------------------------------------------------------------------------
def test_a_job_takes_the_spec_fields_as_keywords_and_renders_what_create_writes(tmp_path):
    job = slurmgen.Job(nodes=2, gpus=4, command="python train.py", time=90, output_dir=str(tmp_path / "o"))
    files = job.render()
    assert sorted(files) == ["job.yaml", "launch_multi_node.sh", "run_slurm.sh"]
    assert "#SBATCH --nodes=2" in files["run_slurm.sh"] and "#SBATCH --time=90" in files["run_slurm.sh"]
    assert not (tmp_path / "o").exists()  # nothing written
    assert job.spec.command == ["python", "train.py"]


def test_from_yaml_is_config_with_the_keywords_over_it(tmp_path):
    (tmp_path / "job.yaml").write_text("nodes: 2\ngpus: 2\njob_name: exp\n")
    job = slurmgen.Job.from_yaml(tmp_path / "job.yaml", gpus=8)
    assert (job.spec.nodes, job.spec.gpus, job.spec.job_name) == (2, 8, "exp")


@pytest.mark.parametrize(
    "fields, said",
    [
        ({"nodez": 2}, "nodez: unknown key (did you mean 'nodes'?)"),
        ({"gpus_per_node": 2}, "gpus_per_node: unknown key (did you mean 'gpus'?)"),
        ({"nodes": 0}, "nodes: expected a number greater than or equal to 1 (got 0)"),
        ({"preempt_signal": "TERM"}, "preempt_signal: expected 'USR2' or 'USR1' (got 'TERM')"),
    ],
)
def test_a_bad_keyword_is_the_commands_one_line_error_naming_the_field(fields, said):
    with pytest.raises(SlurmgenError) as info:
        slurmgen.Job(**fields)
    assert str(info.value) == said


def test_a_sweep_renders_one_array_task_per_point(tmp_path):
    files = slurmgen.Job(sweep={"lr": [0.1, 0.01, 0.001]}, command=["python", "t.py"]).render()
    assert "#SBATCH --array=0-2" in files["run_slurm.sh"]
    assert len(files["sweep.jsonl"].splitlines()) == 3


def test_importing_slurmgen_loads_no_part_of_the_api():
    code = (
        "import sys, slurmgen; print(sorted(m for m in sys.modules if m.startswith('slurmgen.api') or m == 'msgspec'))"
    )
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True, env=clean_env())
    assert out.stdout.strip() == "[]"


# ---- the function's job: refused before anything is written -----------------------------------
def test_a_function_that_cannot_be_pickled_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lock = threading.Lock()
    with pytest.raises(SlurmgenError, match=r"^fn: .* cannot be pickled: .*lock"):
        slurmgen.submit(print, lock)
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing submitted


@pytest.mark.parametrize(
    "kw, said",
    [
        ({"nodez": 2}, "nodez: unknown key (did you mean 'nodes'?)"),
        ({"command": ["x"]}, "command: slurmgen.submit runs the function; give command to slurmgen.Job instead"),
        ({"nodes": 2, "gpus": 2, "world_size": 3}, "world_size: the job gives 4 ranks (nodes x gpus), not 3"),
        ({"hosts": "a,b", "nodes": 3}, "nodes: the job asks for 3 nodes but hosts names 2 (a, b)"),
    ],
)
def test_bad_input_to_submit_is_one_error_naming_it_and_nothing_is_written(tmp_path, monkeypatch, kw, said):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SlurmgenError) as info:
        slurmgen.submit(len, [1], **kw)
    assert str(info.value) == said
    assert list(tmp_path.iterdir()) == []


def test_without_cloudpickle_a_function_of_main_is_refused_before_the_ranks_fail_to_find_it(monkeypatch):
    def local():
        return 1

    monkeypatch.setitem(sys.modules, "cloudpickle", None)  # as if it were not installed
    with pytest.raises(SlurmgenError, match=r"fn: .*local is not importable by the ranks"):
        dumps(local, ())
    assert pickle.loads(dumps(len, ([1, 2],))) == (len, ([1, 2],), {})


# ---- the rank runner, for real -----------------------------------------------------------------
def _ranks(call: Path, world: int) -> list[subprocess.CompletedProcess[str]]:
    procs = [
        subprocess.Popen(
            [PY, "-m", "slurmgen.api.rank", str(call)],
            env=clean_env(RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    return [subprocess.CompletedProcess(p.args, p.wait(60), *p.communicate()) for p in procs]


def _handle_of_ended_run(tmp_path: Path) -> Handle:
    """A handle whose run has ended: a launch row recorded as succeeded (result() reads the files)."""
    plan = local_plan(tmp_path, [PY, "-c", "pass"], slots=(1,))
    plan.env.update({"SLURMGEN_LAUNCH_ID": "L0"})
    record = LaunchRecord.start(Recorder(tmp_path / "jobs.sqlite"), plan, "fn", ["x"])
    record.recorder.ended(record.run, State.SUCCEEDED, 0, None)
    return Handle(tmp_path / "jobs.sqlite", record.run or 0, "launch", "L0")


def test_two_ranks_run_the_function_and_rank_0s_result_comes_back(tmp_path, functions):
    call = tmp_path / "job" / "call.pkl"
    call.parent.mkdir()
    call.write_bytes(dumps(functions.where, (6,)))
    done = _ranks(call, 2)
    assert [p.returncode for p in done] == [0, 0], [p.stderr for p in done]
    assert sorted(p.name for p in call.parent.iterdir()) == ["call.pkl", "result-0.pkl", "result-1.pkl"]
    assert pickle.loads(result_path(call, 1).read_bytes()) == (
        True,
        {"rank": 1, "world": 2, "master": "127.0.0.1", "value": 42},
    )
    job: FunctionJob[dict] = FunctionJob(_handle_of_ended_run(tmp_path), call, 2)
    assert job.result() == {"rank": 0, "world": 2, "master": "127.0.0.1", "value": 42}


def test_a_failing_ranks_exception_comes_back_with_its_traceback(tmp_path, functions):
    call = tmp_path / "job" / "call.pkl"
    call.parent.mkdir()
    call.write_bytes(dumps(functions.boom, (1,)))
    done = _ranks(call, 2)
    assert [p.returncode for p in done] == [0, 1]
    assert "ValueError: bad batch on rank 1" in done[1].stderr
    with pytest.raises(ValueError, match="bad batch on rank 1") as info:
        FunctionJob(_handle_of_ended_run(tmp_path), call, 2).result()
    told = "\n".join(getattr(info.value, "__notes__", [])) or str(info.value.__cause__)
    assert "raised on rank 1 of the job:" in told and 'apifns.py", line 10, in boom' in told, told


# ---- end to end through the launcher ----------------------------------------------------------
def _launched_function(tmp_path: Path, key: str, fn, *args) -> FunctionJob:
    """`fn(*args)` run by `python -m slurmgen.api.rank` under the launch bootstrap on two local
    'hosts' (the rank contract set by the real node script), recorded as `slurmgen launch` records
    it (fanout.launch: the verdict at the end); the FunctionJob of its handle."""
    registry = tmp_path / "state" / "jobs.sqlite"
    call = tmp_path / key / "call.pkl"
    call.parent.mkdir()
    call.write_bytes(dumps(fn, args))
    plan = local_plan(tmp_path, [PY, "-m", "slurmgen.api.rank", str(call)], slots=(1, 1))
    plan.env.update({"SLURMGEN_LAUNCH_ID": key, "SLURMGEN_GROUP": f"launch-{key}"})
    plan.env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    record = LaunchRecord.start(Recorder(registry), plan, fn.__name__, ["python", "-m", "slurmgen.api.rank"])
    made: dict = {}
    launcher = Launcher(
        plan,
        SSHOptions(),
        out=io.StringIO(),
        err=io.StringIO(),
        colour=False,
        record=record,
        connector=local_connector(made),
    )
    try:
        record.ended(launcher.run(), False, launcher.first_failure)
    finally:
        kill_local_nodes(made)
    return FunctionJob(Handle.find(key, registry), call, 2)


def test_submit_a_function_through_the_launcher_rank_0s_result_comes_back(tmp_path, functions):
    job = _launched_function(tmp_path, "L1", functions.where, 3)
    with Registry.open(tmp_path / "state" / "jobs.sqlite") as reg:
        assert job.handle.seq == find_run(reg, "launch", "L1")
    assert job.state == "succeeded" and job.wait(timeout=5) == "succeeded"
    assert [a["state"] for a in job.attempts] == ["succeeded"]
    assert job.result() == {"rank": 0, "world": 2, "master": "127.0.0.1", "value": 21}


def test_submit_a_function_through_the_launcher_the_failing_ranks_exception_comes_back(tmp_path, functions):
    job = _launched_function(tmp_path, "L2", functions.boom, 1)
    assert job.wait(timeout=5) == "failed"
    assert job.attempts[0]["rank"] == 1
    assert "ValueError: bad batch on rank 1" in job.logs(rank=1)
    assert "[rank 1] ValueError: bad batch on rank 1" in job.logs()
    with pytest.raises(ValueError, match="bad batch on rank 1") as info:
        job.result()
    assert "raised on rank 1 of the job:" in "\n".join(getattr(info.value, "__notes__", [str(info.value.__cause__)]))


def test_job_launch_runs_slurmgen_launch_and_its_handle_sees_the_verdict(tmp_path):
    """A real `slurmgen launch` in the background, to a host that does not exist: the handle is
    there as soon as the launch is registered, and wait() gives its verdict."""
    registry = tmp_path / "jobs.sqlite"
    job = slurmgen.Job(command=[PY, "-c", "pass"], output_dir=str(tmp_path / "out"))
    handle = job.launch("nohost.invalid", registry=registry, options=["--connect-timeout", "2"])
    assert handle.kind == "launch" and handle.wait(timeout=60) == "failed"
    out = next((tmp_path / "out").glob("launch-*.out")).read_text()
    assert "nohost.invalid" in out
    assert handle.cancel().said  # an ended launch: the control says why it does nothing


def test_job_launch_with_a_bad_option_raises_the_launchers_own_words(tmp_path):
    job = slurmgen.Job(command=[PY, "-c", "pass"], output_dir=str(tmp_path / "out"))
    with pytest.raises(SlurmgenError, match="No such option"):
        job.launch("h1", registry=tmp_path / "jobs.sqlite", options=["--nope"])
