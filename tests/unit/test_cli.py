"""The slurmgen command line, end to end in-process (and in a subprocess for imports)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import run

REPO = Path(__file__).resolve().parents[2]


def snapshot(directory: Path):
    return {p.relative_to(directory): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_create_writes_scripts_spec_and_log_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "create", "--nodes", "2", "--gpus", "4")
    assert code == 0, err
    for name in ("run_slurm.sh", "launch_multi_node.sh", "job.yaml"):
        assert (tmp_path / "out" / name).is_file()
    assert os.access(tmp_path / "out" / "run_slurm.sh", os.X_OK)
    assert (tmp_path / "out" / "logs").is_dir()
    assert "WORLD_SIZE 8" in out and "node 1: ranks 4-7" in out and "sbatch out/run_slurm.sh" in out
    assert yaml.safe_load((tmp_path / "out" / "job.yaml").read_text())["gpus"] == 4


def test_config_file_with_flags_over_it_and_reproduction(tmp_path, capsys):
    config = tmp_path / "job.yaml"
    config.write_text("nodes: 4\ngpus: 2\npartition: gpu\nenv:\n  A: '1'\n  B: '2'\n")
    out_dir = tmp_path / "o"
    code, _, err = run(
        capsys,
        "create",
        "--config",
        str(config),
        "--nodes",
        "2",
        "-e",
        "B=3",
        "-o",
        str(out_dir),
        "--",
        "python",
        "train.py",
        "--lr",
        "3e-4",
    )
    assert code == 0, err
    resolved = yaml.safe_load((out_dir / "job.yaml").read_text())
    assert (resolved["nodes"], resolved["gpus"], resolved["partition"]) == (2, 2, "gpu")
    assert resolved["env"] == {"A": "1", "B": "3"}
    assert resolved["command"] == ["python", "train.py", "--lr", "3e-4"]
    first = snapshot(out_dir)
    code, _, err = run(capsys, "create", "--config", str(out_dir / "job.yaml"), "--force")
    assert code == 0, err
    assert snapshot(out_dir) == first  # the resolved spec reproduces the very same files


def test_dry_run_prints_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "create", "--dry-run", "--nodes", "2")
    assert code == 0
    assert "# ===== out/run_slurm.sh =====" in out and "#SBATCH --nodes=2" in out
    assert list(tmp_path.iterdir()) == []


def test_existing_files_need_force(tmp_path, capsys):
    out_dir = tmp_path / "o"
    assert run(capsys, "create", "-o", str(out_dir))[0] == 0
    before = snapshot(out_dir)
    code, _, err = run(capsys, "create", "-o", str(out_dir), "--nodes", "3")
    assert code == 2 and "already exists" in err and "--force" in err
    assert snapshot(out_dir) == before
    assert run(capsys, "create", "-o", str(out_dir), "--nodes", "3", "--force")[0] == 0
    assert "#SBATCH --nodes=3" in (out_dir / "run_slurm.sh").read_text()


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--nodes", "0"], "slurmgen: error: nodes: expected a number greater than or equal to 1 (got '0')"),
        (["--nodes", "abc"], "slurmgen: error: nodes: expected a whole number (got 'abc')"),
        (["--time", "1:99:00"], "slurmgen: error: time: minutes must be 0-59 (got '1:99:00')"),
        (["--backend", "mpi"], "slurmgen: error: backend: expected 'auto', 'nccl' or 'gloo' (got 'mpi')"),
        (["--env", "NOEQUALS"], "slurmgen: error: env: expected KEY=VALUE (got 'NOEQUALS')"),
        (["--env", "RANK=1"], "slurmgen: error: env: RANK is set by the launch scripts"),
        (
            ["--env", "SLURMGEN_HEARTBEAT_DIR=/tmp/b"],
            "slurmgen: error: env: SLURMGEN_HEARTBEAT_DIR is set by the launch scripts",
        ),
        (["--nodez", "2"], "slurmgen: error: No such option: --nodez"),
        (
            ["--master-port", "80"],
            "slurmgen: error: master_port: expected a number greater than or equal to 1024 (got '80')",
        ),
        (["--", "", "train.py"], "slurmgen: error: command: the program (first word) must not be empty"),
        (
            ["--", "--lr", "3e-4"],
            "slurmgen: error: command: the first word is the program to run, not an option (got '--lr')",
        ),
        (["--config", "/nonexistent.yaml"], "slurmgen: error: config: cannot read '/nonexistent.yaml'"),
        (["--sbatch", "--nodes=4"], "slurmgen: error: sbatch_extra: --nodes is written by slurmgen; set nodes instead"),
        (["--sbatch", "-x n1"], "slurmgen: error: sbatch_extra: -x is written by slurmgen; set exclude instead"),
        (
            ["--nodelist", "gpu[01-"],
            "slurmgen: error: nodelist: expected a Slurm hostlist, e.g. gpu[01-04],gpu07 (hostlist: unmatched '[' in "
            "'gpu[01-') (got 'gpu[01-')",
        ),
        (["--gpus", "a100:4"], "slurmgen: error: gpus: give the GPU type apart: gpus: 4 and gpu_type: a100"),
        (["--mem-per-gpu", "4X"], "slurmgen: error: mem_per_gpu: not a Slurm memory size; use e.g. 64G"),
        (["--time-min", "1:99:00"], "slurmgen: error: time_min: minutes must be 0-59 (got '1:99:00')"),
        (["--preempt-signal", "SIGUSR1"], "slurmgen: error: preempt_signal: expected 'USR2' or 'USR1' (got 'SIGUSR1')"),
        (["--preempt-signal", "TERM"], "slurmgen: error: preempt_signal: expected 'USR2' or 'USR1' (got 'TERM')"),
        # In-job restarts and spares (issue 35): a spare is only used by a restart, and must fit.
        (
            ["--spare-nodes", "1"],
            "slurmgen: error: spec: spare_nodes: 1 spare(s) take a failed node's place at an in-job restart; "
            "give restarts: N",
        ),
        (["--restarts", "-1"], "slurmgen: error: restarts: expected a number greater than or equal to 0 (got '-1')"),
        (["--spare-nodes", "x"], "slurmgen: error: spare_nodes: expected a whole number (got 'x')"),
        (
            ["--nodes", "100000", "--restarts", "1", "--spare-nodes", "1"],
            "slurmgen: error: spec: spare_nodes: nodes (100000) + spare_nodes (1) is more than 100000 nodes",
        ),
        (
            ["--nodes", "2", "--restarts", "1", "--spare-nodes", "1", "--nodelist", "n[1-4]"],
            "slurmgen: error: spec: nodelist: n[1-4] names 4 nodes, more than nodes: 2 + spare_nodes: 1",
        ),
        # A smaller world (--min-nodes): only by an in-job restart, between 1 and --nodes.
        (
            ["--min-nodes", "1"],
            "slurmgen: error: spec: min_nodes: 1 is the fewest nodes an in-job restart goes on with; give restarts: N",
        ),
        (
            ["--nodes", "2", "--restarts", "1", "--min-nodes", "3"],
            "slurmgen: error: spec: min_nodes: 3 is more than nodes (2); expected 1 to 2",
        ),
        (
            ["--restarts", "1", "--min-nodes", "0"],
            "slurmgen: error: min_nodes: expected a number greater than or equal to 1 (got '0')",
        ),
        (["--restarts", "1", "--min-nodes", "two"], "slurmgen: error: min_nodes: expected a whole number (got 'two')"),
        (
            ["--restarts", "5", "--master-port", "65533"],
            "slurmgen: error: spec: restarts: 5 restarts take the ports after master_port 65533, past 65535",
        ),
        # A warm restart (--restart-mode warm) is an in-job restart, under srun: torchrun's agent stops every worker.
        (
            ["--restart-mode", "warm"],
            "slurmgen: error: spec: restart_mode: warm restarts are in-job restarts; "
            "give restarts: N (each counts as one)",
        ),
        (
            ["--restarts", "1", "--restart-mode", "warm", "--launcher", "torchrun"],
            "slurmgen: error: spec: restart_mode: warm needs launcher srun (torchrun's agent stops every worker when "
            "one fails); use launcher: srun, or restart_mode: cold with torchrun",
        ),
        (
            ["--restarts", "1", "--restart-mode", "hot"],
            "slurmgen: error: restart_mode: expected 'cold' or 'warm' (got 'hot')",
        ),
        # Lightning's documented line: the refusal gives the flags that write it.
        (
            ["--sbatch", "--signal=SIGUSR1@90"],
            "slurmgen: error: sbatch_extra: --signal is written by slurmgen (the rank wrappers and the trainer must "
            "know the signal): give --requeue --preempt-signal USR1 --signal-lead 90 (in a spec: requeue: true, "
            "preempt_signal: USR1, signal_lead: 90)",
        ),
        (
            ["--sbatch", "--signal=B:TERM"],
            "slurmgen: error: sbatch_extra: --signal is written by slurmgen (the rank wrappers and the trainer must "
            "know the signal): give --requeue --preempt-signal USR2 (in a spec: requeue: true, preempt_signal: "
            "USR2); preempt_signal is USR2 or USR1",
        ),
    ],
)
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, capsys, args, expected):
    out_dir = tmp_path / "o"
    code, out, err = run(capsys, "create", "-o", str(out_dir), *args)
    assert code == 2
    assert err.startswith(expected), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out_dir.exists()


def test_the_preempt_signal_flag_is_the_spec_field_for_create_and_submit(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "create", "-o", "a", "--requeue", "--preempt-signal", "USR1", "--signal-lead", "90")
    assert code == 0, err
    script = (tmp_path / "a" / "run_slurm.sh").read_text()
    assert "#SBATCH --signal=USR1@90\n" in script and "export SLURMGEN_PREEMPT_SIGNAL=USR1\n" in script
    assert yaml.safe_load((tmp_path / "a" / "job.yaml").read_text())["preempt_signal"] == "USR1"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "sbatch").write_text("#!/bin/sh\necho 77\n")
    (tmp_path / "bin" / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    code, out, err = run(capsys, "submit", "--registry", "r.sqlite", "-o", "b", "--requeue", "--preempt-signal", "USR1")
    assert (code, out) == (0, "77\n"), err
    assert "#SBATCH --signal=USR1@120\n" in (tmp_path / "b" / "run_slurm.sh").read_text()


def test_bad_yaml_key_suggests(tmp_path, capsys):
    config = tmp_path / "job.yaml"
    config.write_text("nodes: 2\ngpu: 4\n")
    code, _, err = run(capsys, "create", "--config", str(config), "-o", str(tmp_path / "o"))
    assert code == 2 and err.strip() == "slurmgen: error: gpu: unknown key (did you mean 'gpus'?)"


def test_ranks_text_and_json(tmp_path, capsys):
    code, out, _ = run(capsys, "ranks", "--hosts", "gn6,gn7", "--gpus", "2", "--master", "gn6", "--json")
    assert code == 0
    assert json.loads(out) == [
        {"host": "gn6", "rank": 0, "local_rank": 0, "node_rank": 0, "local_world_size": 2, "world_size": 4},
        {"host": "gn6", "rank": 1, "local_rank": 1, "node_rank": 0, "local_world_size": 2, "world_size": 4},
        {"host": "gn7", "rank": 2, "local_rank": 0, "node_rank": 1, "local_world_size": 2, "world_size": 4},
        {"host": "gn7", "rank": 3, "local_rank": 1, "node_rank": 1, "local_world_size": 2, "world_size": 4},
    ]
    code, out, _ = run(capsys, "ranks", "--hosts", "gpu[1-2]", "--gpus", "1", "--master", "gpu2")
    lines = [line.split() for line in out.strip().splitlines()]
    assert lines[0] == ["host", "rank", "local_rank", "node_rank", "local_world_size", "world_size"]
    assert lines[1:] == [["gpu2", "0", "0", "0", "1", "2"], ["gpu1", "1", "0", "1", "1", "2"]]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("b slots=1\na slots=3\n")
    code, out, _ = run(capsys, "ranks", "--hostfile", str(hostfile), "--json")
    assert [(r["host"], r["rank"], r["local_world_size"]) for r in json.loads(out)] == [
        ("b", 0, 1),
        ("a", 1, 3),
        ("a", 2, 3),
        ("a", 3, 3),
    ]
    code, out, _ = run(capsys, "ranks", "--nodes", "2", "--gpus", "3", "--json")
    assert [r["node_rank"] for r in json.loads(out)] == [0, 0, 0, 1, 1, 1]


def test_ranks_order_alphabetical_by_default_natural_on_request(capsys):
    args = ("ranks", "--hosts", "gn39,gn40,gn7,gn6", "--gpus", "1", "--master", "gn6", "--json")
    code, out, _ = run(capsys, *args)
    assert code == 0 and [r["host"] for r in json.loads(out)] == ["gn6", "gn39", "gn40", "gn7"]
    code, out, _ = run(capsys, *args, "--order", "natural")
    assert code == 0 and [r["host"] for r in json.loads(out)] == ["gn6", "gn7", "gn39", "gn40"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--hosts", "a,b", "--order", "random"], "order: expected natural or alphabetical (got 'random')"),
        (["--hosts", "gn1;gn2"], "hosts: 'gn1;gn2' is not a host name (expected letters, digits and _ . - only"),
        (
            ["--hosts", "gn1:4,gn2:4"],
            "hosts: 'gn1:4' is not a host name (it looks like MPICH's host:slots) "
            "(hint: give slots per host in a --hostfile",
        ),
        (["--hosts", "a,b", "--world-size", "5"], "5 processes asked for, but the hosts offer only 2"),
        (["--hosts", "a,b", "--master", "c"], "master: 'c' is not one of the hosts"),
        (["--hosts", "a", "--nodes", "2"], "give exactly one of --hosts, --hostfile, --nodes"),
        (["--hosts", "gpu[1-"], "hostlist: unmatched '['"),
    ],
)
def test_ranks_errors(capsys, args, words):
    code, _, err = run(capsys, "ranks", *args)
    assert code == 2 and words in err and err.count("\n") == 1


def test_schema_is_json_schema(capsys):
    code, out, _ = run(capsys, "schema")
    schema = json.loads(out)
    assert code == 0 and schema["additionalProperties"] is False and "nodes" in schema["properties"]


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["create", "--help"],
        ["create", "--dry-run"],
        ["runs", "--help"],
        ["plot", "--help"],
        ["submit", "--help"],
        ["status", "--registry", "/nonexistent"],
        ["doctor", "--help"],
        ["group", "--help"],
        ["serve", "--help"],
    ],
)
def test_cli_does_not_import_torch_or_paramiko(args):
    probe = (
        "import sys, runpy; sys.argv = ['slurmgen', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('slurmgen', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'paramiko', 'numpy', 'matplotlib', 'fastapi', 'starlette', 'uvicorn',\n"
        "                     'httpx') if m in sys.modules]\n"
        "print('HEAVY', heavy)"
    )
    result = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert "HEAVY []" in result.stdout, result.stdout[-500:] + result.stderr[-2000:]


# What start-up may not cost (issue 21, "start-up stays lean"): the rank table and the help need
# neither the spec's validators (msgspec) nor the templates (jinja2) nor YAML; nothing loads pydantic
# (~90 ms; the spec left it for msgspec) or builds typer's per-option pydantic adapters (typer 0.29+,
# ~60-100 ms a run: pyproject keeps typer below).
ADAPTERS = ("typer._adapters", "pydantic.type_adapter")
# A command imports only its own package's commands (the run records and the coordinator were ~25 ms).
OTHER_PACKAGES = (
    "slurmgen.tracking",
    "slurmgen.coordinator.cli",
    "slurmgen.jobs.cli",
    "slurmgen.doctor.cli",
    "slurmgen.launch.cli",
)
LEAN = [
    (["ranks", "--nodes", "2", "--gpus", "4"], ("msgspec", "pydantic", "jinja2", "yaml", *ADAPTERS, *OTHER_PACKAGES)),
    (["ranks", "--hosts", "a,b", "--json"], ("msgspec", "pydantic", "jinja2", "yaml", *ADAPTERS, *OTHER_PACKAGES)),
    (["--help"], ("msgspec", "pydantic", "jinja2", "yaml", *ADAPTERS)),
    (["create", "--help"], ("msgspec", "pydantic", "jinja2", "yaml", *ADAPTERS, *OTHER_PACKAGES)),
    (["create", "--nodes", "2", "--gpus", "4", "--dry-run"], ("pydantic", *ADAPTERS, *OTHER_PACKAGES)),
]


@pytest.mark.parametrize(("args", "absent"), LEAN)
def test_start_up_imports_only_what_the_command_needs(args, absent):
    probe = (
        "import sys, runpy; absent = sys.argv[1].split(','); sys.argv = ['slurmgen', *sys.argv[2:]]\n"
        "try:\n    runpy.run_module('slurmgen', run_name='__main__')\n"
        "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "print('LOADED', [m for m in absent if m in sys.modules])"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, ",".join(absent), *args], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert "LOADED []" in result.stdout, result.stdout[-500:] + result.stderr[-2000:]


def test_nothing_imports_the_composition_root():
    """`cli.py` only composes each package's commands: a package that took a helper from it (as
    jobs and the coordinator once took `create` and `_parse_env`) closes an import cycle."""
    import ast

    importers = []
    for path in sorted((REPO / "slurmgen").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            if "slurmgen.cli" in names:
                importers.append(str(path.relative_to(REPO)))
    assert importers == ["slurmgen/__main__.py"]


def test_python_dash_m_and_version():
    result = subprocess.run([sys.executable, "-m", "slurmgen", "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("slurmgen ")


def test_train_passes_flags_through_to_the_trainer():
    helped = subprocess.run(
        [sys.executable, "-m", "slurmgen", "train", "--help"], capture_output=True, text=True, timeout=60
    )
    assert helped.returncode == 0 and "usage: slurmgen train" in helped.stdout and "--max-steps" in helped.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "slurmgen", "train", "--max-steps", "x"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "--max-steps" in bad.stderr and "Traceback" not in bad.stderr


def test_runs_from_a_source_checkout_without_installing(tmp_path):
    # As `python -m slurmgen` in a fresh clone: the installed (editable) finder is taken away,
    # so `slurmgen.templates` does not exist and the top-level templates/ must be found.
    probe = (
        "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
        f"sys.path.insert(0, {str(REPO)!r}); import runpy, importlib.util\n"
        "assert importlib.util.find_spec('slurmgen.templates') is None\n"
        "sys.argv = ['slurmgen', 'create', '--dry-run', '--nodes', '2']\n"
        "runpy.run_module('slurmgen', run_name='__main__')"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "#SBATCH --nodes=2" in result.stdout


def test_create_notes_a_torchrun_agent_missing_here(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no torchrun on it
    code, _, err = run(capsys, "create", "-o", str(tmp_path / "a"), "--launcher", "torchrun", "--", "./train.sh")
    assert code == 0 and err == (
        "slurmgen: note: launcher torchrun: 'torchrun' is not on PATH here; the nodes "
        "need it there (or make the program the venv's Python: -- /path/to/venv/bin/python "
        "train.py)\n"
    )
    no_torch = tmp_path / "python"
    no_torch.write_text("#!/bin/sh\nexit 1\n")  # stands for an interpreter without torch
    no_torch.chmod(0o755)
    code, _, err = run(
        capsys, "create", "-o", str(tmp_path / "b"), "--launcher", "torchrun", "--", str(no_torch), "x.py"
    )
    assert (
        code == 0
        and err
        == f"slurmgen: note: launcher torchrun: {no_torch} has no torch here "
        f"({no_torch} -m torch.distributed.run would fail)\n"
    )
    code, _, err = run(
        capsys, "create", "-o", str(tmp_path / "c"), "--launcher", "torchrun", "--", sys.executable, "x.py"
    )
    assert code == 0 and err == ""  # this test's own Python has torch


@pytest.mark.parametrize(
    ("args", "built"),
    [
        (["launch", "--dry-run", "--hosts", "a"], ["launch"]),
        (["-v", "ranks", "--nodes", "2"], ["ranks"]),
        (["group", "list"], ["group"]),
        (["--help", "create"], None),  # the root's help lists every command
        (["--version"], None),
        (["crate"], None),  # "No such command 'crate'. Did you mean 'create'?" needs them all
        ([], None),
    ],
)
def test_start_up_builds_only_the_command_it_runs(args, built):
    from slurmgen.cli import PACKAGES, command_tree

    everything = list(command_tree().commands)
    assert list(command_tree(args).commands) == (everything if built is None else built)
    assert sorted(everything) == sorted(name for _, _, names in PACKAGES for name in names)


def test_each_package_adds_the_commands_the_root_knows_it_by():
    """The root imports a package's commands only for the names it lists for that package."""
    import importlib

    import typer

    from slurmgen.cli import PACKAGES

    for module, register, names in PACKAGES:
        app = typer.Typer()
        getattr(importlib.import_module(module), register)(app)
        added = [c.name or typer.main.get_command_name(c.callback.__name__) for c in app.registered_commands]
        assert sorted(added + [g.name for g in app.registered_groups]) == sorted(names), module
