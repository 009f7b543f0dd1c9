"""Spec validation: every field accepts what sbatch accepts and names what it rejects."""

import pytest

from slurmgen.errors import SlurmgenError
from slurmgen.generate.slurm_values import time_limit_seconds
from slurmgen.generate.specfile import build_spec, dump_yaml, load_yaml, merge, spec_from_sources


def problems(values):
    with pytest.raises(SlurmgenError) as err:
        build_spec(values)
    return err.value.problems


def test_defaults_give_a_working_job():
    spec = build_spec({})
    assert (spec.nodes, spec.gpus, spec.launcher, spec.backend) == (1, 1, "srun", "auto")
    assert spec.command == ["python", "-m", "slurmgen.train"]
    assert spec.logs == "out/logs"


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90", 5400),
        ("10:30", 630),
        ("01:00:00", 3600),
        ("36:00:00", 129600),
        ("2-12", 216000),
        ("2-12:30", 217800),
        ("2-12:30:15", 217815),
        ("UNLIMITED", None),
    ],
)
def test_every_slurm_time_form(text, seconds):
    assert time_limit_seconds(text) == seconds
    assert build_spec({"time": text}).time == text


@pytest.mark.parametrize("text", ["1:60:00", "2-24", "2-1:61", "10:75", "a", "1:2:3:4", "-1", "0", "1-", "1.5"])
def test_bad_times(text):
    (line,) = problems({"time": text})
    assert line.startswith("time: ") and repr(text) in line


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("nodes", 0, "greater than or equal to 1"),
        ("nodes", "two", "expected a whole number (got 'two')"),
        ("nodes", [1, 2], "expected a whole number (got [1, 2])"),
        ("nodes", True, "expected a whole number, not true/false (got true)"),
        ("gpus", 2.5, "expected a whole number (got 2.5)"),
        ("exclusive", 1, "expected true or false, not a number (got 1)"),
        ("env", ["A=1"], "expected a mapping of NAME: value, e.g. env: {NCCL_DEBUG: INFO} (got ['A=1'])"),
        ("container", "img.sif", "expected a mapping, e.g. container: {image: torch.sif, runtime: apptainer}"),
        ("command", ["", "train.py"], "the program (first word) must not be empty"),
        ("command", ["--lr", "3e-4"], "not an option (got '--lr')"),
        ("command", "--lr 3e-4", "not an option (got '--lr')"),
        ("gpus", 0, "greater than or equal to 1"),
        ("cpus_per_task", 0, "greater than or equal to 1"),
        ("mem", "64GB", "memory size"),
        ("partition", "gpu main", "letters, digits"),
        ("account", "a;b", "letters, digits"),
        ("qos", "$(x)", "letters, digits"),
        ("constraint", "a100 && ib", "no spaces"),
        ("master_addr", "host name;x", "expected a host name (letters, digits and _ . - only) or an IP address"),
        ("master_addr", "gn1;gn2", "(got 'gn1;gn2')"),
        ("master_port", 80, "greater than or equal to 1024"),
        ("master_port", 70000, "less than or equal to 65535"),
        ("backend", "mpi", "'auto', 'nccl' or 'gloo'"),
        ("launcher", "mpirun", "'srun' or 'torchrun'"),
        ("gpu_request", "gpu", "'auto', 'gpus-per-node', 'gres' or 'none'"),
        ("job_name", "a\nb", "one line"),
        ("job_name", "", "must not be empty"),
        ("output_dir", "x\ny", "one line"),
        ("signal_lead", 0, "greater than or equal to 1"),
        ("exclusive", "maybe", "expected true or false (got 'maybe')"),
        ("command", [], "must not be empty"),
        ("command", "python 'unclosed", "cannot split"),
        ("sbatch_extra", ["--nodes=3"], "set nodes instead"),
        ("sbatch_extra", ["mail"], "not an sbatch option"),
        ("sbatch_extra", ["--comment=a\nb"], "one line"),
        ("heartbeat_timeout", 0, "greater than 0"),
        ("retries", -1, "greater than or equal to 0"),
        ("retry_on", "1,x", "'x' is not an exit code: give whole numbers 1-255, comma-separated"),
        ("retry_on", [256], "256 is not an exit code"),
        ("retry_on", "75", "75 means preempted: that job requeues itself (requeue: true)"),
        ("retry_on", "1,2", "2 is not worth a retry (bad input)"),
    ],
)
def test_bad_field_is_named(field, value, words):
    (line,) = problems({field: value})
    assert line.startswith(f"{field}") and words in line, line


@pytest.mark.parametrize(
    "env, words",
    [
        ({"1BAD": "x"}, "not a valid variable name"),
        ({"RANK": "3"}, "set by the launch scripts"),
        # Hang detection reads this directory: a user's value would switch it off unseen.
        ({"SLURMGEN_HEARTBEAT_DIR": "/tmp/beats"}, "SLURMGEN_HEARTBEAT_DIR is set by the launch scripts"),
        ({"SLURMGEN_PREEMPT_SIGNAL": "USR1"}, "SLURMGEN_PREEMPT_SIGNAL is set by the launch scripts"),
        ({"SLURMGEN_REQUEUE": "1"}, "SLURMGEN_REQUEUE is set by the launch scripts"),
        # launch_multi_node.sh reads its own settings before it exports the spec's env.
        (
            {"SLURMGEN_STOP_GRACE": "60"},
            "SLURMGEN_STOP_GRACE is a setting of launch_multi_node.sh, read from the environment it is started in",
        ),
        ({"SLURMGEN_LINK_TOKEN": "s3cret"}, "SLURMGEN_LINK_TOKEN is a setting of launch_multi_node.sh"),
        ({"X": ["a"]}, "give a string or a number"),
    ],
)
def test_bad_env(env, words):
    (line,) = problems({"env": env})
    assert line.startswith("env") and words in line


def test_container_fields():
    assert (
        build_spec({"container": {"image": "img.sif", "runtime": "apptainer", "mounts": ["/d:/d"]}}).container.runtime
        == "apptainer"
    )
    lines = problems({"container": {"imag": "x", "mounts": ["nocolon", "a:b,c:d"]}})
    assert "container.imag: unknown key (did you mean 'image'?)" in lines
    assert "container.image: required, but not given" in lines
    assert any(line.startswith("container.mounts") for line in lines)


def test_unknown_keys_suggest_the_right_one():
    assert problems({"gpus_per_node": 4}) == ["gpus_per_node: unknown key (did you mean 'gpus'?)"]
    assert problems({"cpus-per-task": 4}) == ["cpus-per-task: unknown key (did you mean 'cpus_per_task'?)"]
    (line,) = problems({"zzzz": 1})
    assert "known keys:" in line and "nodes" in line


def test_all_problems_reported_at_once():
    lines = problems({"nodes": 0, "time": "9:99:99", "tme": 1, "backend": "x"})
    assert [line.split(":")[0] for line in lines] == ["nodes", "time", "backend", "tme"]


def test_values_are_read_as_written_or_from_their_text():
    """A quoted number is a number where one is expected; YAML 1.1's yes/no still mean a boolean (yaml12
    reads them as text); a sweep keeps each value's own type, so `x: true` reaches the program as true."""
    spec = build_spec({"nodes": "2", "exclusive": "yes", "requeue": "off", "heartbeat_timeout": "5"})
    assert (spec.nodes, spec.exclusive, spec.requeue, spec.heartbeat_timeout) == (2, True, False, 5.0)
    sweep = build_spec({"sweep": [{"lr": "3", "x": True, "n": 2, "f": 0.5}]}).sweep
    assert sweep == [{"lr": "3", "x": True, "n": 2, "f": 0.5}]
    assert [type(v) for v in sweep[0].values()] == [str, bool, int, float]


def test_signal_lead_must_fit_in_time_limit():
    (line,) = problems({"requeue": True, "time": "1", "signal_lead": 120})
    assert "signal_lead" in line and "60s" in line
    assert build_spec({"requeue": False, "time": "1", "signal_lead": 120}).time == "1"


def test_gpu_style_follows_backend():
    assert build_spec({"backend": "gloo"}).gpu_style == "none"
    assert build_spec({"backend": "nccl"}).gpu_style == "gpus-per-node"
    assert build_spec({"backend": "gloo", "gpu_request": "gres"}).gpu_style == "gres"


def test_command_string_is_split_like_a_shell():
    assert build_spec({"command": "python train.py --name 'a b'"}).command == ["python", "train.py", "--name", "a b"]


def test_merge_cli_over_yaml():
    merged = merge(
        {"nodes": 2, "env": {"A": "1", "B": "2"}, "setup": ["x"], "container": {"image": "i"}},
        {"nodes": 4, "env": {"B": "3"}, "setup": ["y"], "container": {"runtime": "apptainer"}},
    )
    assert merged == {
        "nodes": 4,
        "env": {"A": "1", "B": "3"},
        "setup": ["y"],
        "container": {"image": "i", "runtime": "apptainer"},
    }


def test_yaml_round_trip_is_identical(tmp_path):
    spec = build_spec(
        {
            "nodes": 2,
            "gpus": 4,
            "time": 90,
            "env": {"X": "a'b $(c)"},
            "command": ["p", "a b"],
            "container": {"image": "i"},
            "requeue": True,
        }
    )
    path = tmp_path / "job.yaml"
    path.write_text(dump_yaml(spec))
    again = spec_from_sources(path, {})
    assert again == spec and again.digest() == spec.digest()


def test_yaml_errors_point_at_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("nodes: 2\ngpus: [\n")
    with pytest.raises(SlurmgenError) as err:
        load_yaml(path)
    assert str(path) in str(err.value) and ":3:" in str(err.value)
    path.write_text("- a\n- b\n")
    with pytest.raises(SlurmgenError, match="must hold a mapping"):
        load_yaml(path)
    with pytest.raises(SlurmgenError, match="cannot read"):
        load_yaml(tmp_path / "missing.yaml")


def test_retry_policy_fields_go_together():
    assert build_spec({"retries": 2, "retry_on": "143, 1,124,1"}).retry_on == [1, 124, 143]
    assert problems({"retries": 1}) == [
        "spec: retries needs retry_on: the exit codes worth another attempt, e.g. 1,124,143"
    ]
    assert problems({"exclude_failed_node": True}) == ["spec: exclude_failed_node needs retries: N (the most requeues)"]
    assert problems({"retry_on": "1"}) == [
        "spec: retry_on needs retries: N (the most requeues) or restarts: N (the most in-job restarts)"
    ]
    # In-job restarts take retry_on too: the codes worth a new step.
    assert build_spec({"restarts": 2, "retry_on": "137,1"}).retry_on == [1, 137]
