"""Issue 35, bad input: a warm restart asked of a program that does not take part is refused on every
path that starts a Slurm job (`create`, `submit`, `slurmgen.Job`) by the one rule `slurmgen launch`
uses (generate/preflight.py's `warm_refusal`): one line naming restart_mode, exit 2, nothing written.
The coordinator's side is in tests/unit/coordinator/test_group_warm_rules.py."""

from __future__ import annotations

import pytest
from helpers import run

from slurmgen.errors import SlurmgenError

WARM = ("--restarts", "1", "--restart-mode", "warm")
PLAIN = (
    "slurmgen: error: restart_mode: warm needs a program that takes part in it (the bundled trainer, or "
    "slurmgen.train.warm), and plain.py does not use slurmgen.train\n"
)


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A directory like a project's: create runs in it, as sbatch will (the ranks start there)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain.py").write_text("import torch\nprint(torch.__version__)\n")
    (tmp_path / "mine.py").write_text("from slurmgen.train import warm\n")
    return tmp_path


@pytest.mark.parametrize("command", ["create", "submit"])
def test_warm_asked_of_a_plain_script_is_one_line_exit_2_nothing_written(here, capsys, command):
    code, out, err = run(capsys, command, "-o", "out", *WARM, "--", "python3", "plain.py")
    assert (code, out, err) == (2, "", PLAIN)
    assert sorted(p.name for p in here.iterdir()) == ["mine.py", "plain.py"]  # no output dir, no logs dir


@pytest.mark.parametrize(
    "program, said",
    [
        (("torchrun", "--nproc-per-node", "2", "mine.py"), "and torchrun restarts its workers itself"),
        (("python", "-c", "import torch"), "and the -c code does not use slurmgen.train"),
        (("/abs/venv/bin/python3.11", "plain.py"), "and plain.py does not use slurmgen.train"),
    ],
)
def test_warm_is_refused_for_torchrun_and_code_that_does_not_take_part(here, capsys, program, said):
    code, out, err = run(capsys, "create", "-o", "out", *WARM, "--", *program)
    assert code == 2 and out == "" and err.startswith("slurmgen: error: restart_mode: warm needs a program")
    assert err.endswith(f"{said}\n") and err.count("\n") == 1 and not (here / "out").exists(), err


def test_warm_under_launcher_torchrun_is_the_specs_own_refusal(here, capsys):
    code, _, err = run(capsys, "create", "-o", "out", *WARM, "--launcher", "torchrun", "--", "python", "mine.py")
    assert code == 2 and "restart_mode: warm needs launcher srun" in err and err.count("\n") == 1, err
    assert not (here / "out").exists()


@pytest.mark.parametrize(
    "extra",
    [
        (),  # the bundled trainer, python -m slurmgen.train
        ("--", "python", "mine.py"),  # a program through slurmgen.train.warm
        ("--", "python", "-m", "mypackage.train"),  # a module: not knowable here
        ("--", "python", "only_on_the_nodes.py"),  # not here: not knowable
        ("--setup", "cd /scratch/project", "--", "python", "plain.py"),  # the job moves: not this plain.py
        ("--sbatch", "--chdir=/scratch/project", "--", "python", "plain.py"),
    ],
)
def test_warm_is_accepted_where_the_program_takes_part_or_cannot_be_known(here, capsys, extra):
    code, _, err = run(capsys, "create", "-o", "out", *WARM, *extra)
    assert code == 0, err
    assert (here / "out" / "run_slurm.sh").is_file()


def test_a_cold_restart_of_a_plain_script_is_as_before(here, capsys):
    code, _, err = run(capsys, "create", "-o", "out", "--restarts", "1", "--", "python", "plain.py")
    assert code == 0, err


def test_the_python_api_refuses_it_as_create_does(here):
    from slurmgen import Job

    with pytest.raises(SlurmgenError) as refused:
        Job(restarts=1, restart_mode="warm", command=["python", "plain.py"])
    assert [f"slurmgen: error: {line}\n" for line in refused.value.lines()] == [PLAIN]
    assert Job(restarts=1, restart_mode="warm", command=["python", "mine.py"]).spec.restart_mode == "warm"
    assert sorted(p.name for p in here.iterdir()) == ["mine.py", "plain.py"]
