"""The request fields once written by hand into sbatch_extra (issue 36, item 5): mem_per_gpu,
gpu_type, reservation, nodelist, exclude, time_min. Each is validated, rendered as its own
#SBATCH line, and refused in sbatch_extra with a pointer to the field."""

import pytest

from slurmgen.errors import SlurmgenError
from slurmgen.generate.render import SLURM_SCRIPT, render
from slurmgen.generate.specfile import build_spec


def sbatch_lines(values):
    text = render(build_spec(values)).files[SLURM_SCRIPT]
    return [line.removeprefix("#SBATCH ") for line in text.splitlines() if line.startswith("#SBATCH ")]


def problem(values):
    with pytest.raises(SlurmgenError) as err:
        build_spec(values)
    assert len(err.value.problems) == 1
    return err.value.problems[0]


def test_every_field_is_one_sbatch_line():
    lines = sbatch_lines(
        {
            "nodes": 2,
            "gpus": 4,
            "gpu_type": "a100",
            "mem_per_gpu": "40g",
            "time": "1-00",
            "time_min": 720,  # YAML's number: minutes, as sbatch reads it
            "reservation": "maint,r2",
            "nodelist": "gpu[01-02]",
            "exclude": "gpu07",
        }
    )
    for line in (
        "--gpus-per-node=a100:4",
        "--mem-per-gpu=40G",
        "--time-min=720",
        "--reservation=maint,r2",
        "--nodelist=gpu[01-02]",
        "--exclude=gpu07",
    ):
        assert line in lines
    assert not any(line.startswith("--mem=") for line in lines)


def test_gpu_type_follows_the_gpu_request():
    assert "--gres=gpu:h100:2" in sbatch_lines({"gpus": 2, "gpu_type": "h100", "gpu_request": "gres"})
    assert "--gpus-per-node=2" in sbatch_lines({"gpus": 2})  # no type: as before


@pytest.mark.parametrize(
    "values, expected",
    [
        ({"gpus": "a100:4"}, "gpus: give the GPU type apart: gpus: 4 and gpu_type: a100"),
        ({"gpus": "gpu:a100:4"}, "gpus: give the GPU type apart: gpus: 4 and gpu_type: a100"),
        ({"gpu_type": "a100:2"}, "gpu_type: expected a GPU type as the cluster names it, e.g. a100"),
        ({"gpu_type": "a100", "backend": "gloo"}, "spec: gpu_type: this job asks for no GPUs"),
        ({"mem_per_gpu": "lots"}, "mem_per_gpu: not a Slurm memory size; use e.g. 64G"),
        ({"mem_per_gpu": 0}, "mem_per_gpu: a memory per GPU is above 0"),
        ({"mem_per_gpu": "40G", "mem": "100G"}, "spec: mem_per_gpu: give mem (per node) or mem_per_gpu, not both"),
        ({"mem_per_gpu": "4G", "gpu_request": "none"}, "spec: mem_per_gpu: this job asks for no GPUs"),
        ({"time_min": "1:61:00"}, "time_min: minutes must be 0-59"),
        ({"time_min": "infinite"}, "time_min: a shortest time limit is a time, not unlimited"),
        ({"time_min": "2:00:00", "time": "1:00:00"}, "spec: time_min: 2:00:00 is longer than the time limit 1:00:00"),
        ({"reservation": "a b"}, "reservation: expected reservation names"),
        ({"nodelist": "gpu[1-"}, "nodelist: expected a Slurm hostlist, e.g. gpu[01-04],gpu07"),
        ({"exclude": "gpu[3-1]"}, "exclude: expected a Slurm hostlist"),
        ({"nodelist": "a,b,c", "nodes": 2}, "spec: nodelist: a,b,c names 3 nodes, more than nodes: 2"),
        ({"nodelist": "n[1-2]", "nodes": 2, "exclude": "n2"}, "spec: exclude: n2 is also in nodelist"),
    ],
)
def test_bad_values_name_the_field_and_the_form(values, expected):
    assert problem(values).startswith(expected)


def test_the_value_is_shown():
    assert problem({"nodelist": "gpu[1-"}).endswith("(got 'gpu[1-')")


@pytest.mark.parametrize(
    "option, field",
    [
        ("--mem-per-gpu=8G", "mem_per_gpu"),
        ("--reservation=maint", "reservation"),
        ("--nodelist=n1", "nodelist"),
        ("-w n1", "nodelist"),
        ("--exclude=n1", "exclude"),
        ("-x n1", "exclude"),
        ("--time-min=30", "time_min"),
        ("--gres=gpu:a100:4", "gpu_request and gpu_type"),
        ("--gpus-per-node=a100:4", "gpus, gpu_type and gpu_request"),
    ],
)
def test_sbatch_extra_points_at_the_field(option, field):
    flag = option.split("=")[0].split()[0]
    assert problem({"sbatch_extra": [option]}).startswith(
        f"sbatch_extra: {flag} is written by slurmgen; set {field} instead"
    )
