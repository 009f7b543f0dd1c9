"""Files and values users hand us are taken as written, or refused in one line naming them.

By class: YAML 1.1 implicit types, duplicate keys, empty specs, unreadable or non-UTF-8
files (spec, host file, env file), the one host-name rule, and paths checked before writing.
"""

import pytest
from helpers import run

from slurmgen.errors import SlurmgenError
from slurmgen.generate.hostfile import read_hostfile
from slurmgen.generate.render import SLURM_SCRIPT, render
from slurmgen.generate.specfile import dump_yaml, load_yaml, spec_from_sources
from slurmgen.launch.plan import read_env_file


def spec_file(tmp_path, text, name="job.yaml"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.mark.parametrize(
    "line, field, value",
    [
        ("time: 1:30:00", "time", "1:30:00"),  # YAML 1.1: 5400 (base 60), which Slurm reads as minutes
        ("time: 90:00", "time", "90:00"),
        ("time: 90", "time", "90"),
        ("job_name: on", "job_name", "on"),  # YAML 1.1: True
        ("job_name: 2024-01-01", "job_name", "2024-01-01"),  # YAML 1.1: a date
        ("partition: 0755", "partition", "0755"),  # YAML 1.1: octal 493
        (
            "command: [python, train.py, --lr, 3e-4, --wd, 1.0e-2, --seed, 0x10]",
            "command",
            ["python", "train.py", "--lr", "3e-4", "--wd", "1.0e-2", "--seed", "0x10"],
        ),
        ("env: {LR: 3e-4, FLAG: on, MODE: 0755}", "env", {"LR": "3e-4", "FLAG": "on", "MODE": "0755"}),
    ],
)
def test_scalars_mean_what_was_written(tmp_path, line, field, value):
    spec = spec_from_sources(spec_file(tmp_path, line + "\n"), {})
    assert getattr(spec, field) == value
    # ... and job.yaml reads back the same, with YAML 1.1 readers too (quoted where they differ)
    again = load_yaml(spec_file(tmp_path, dump_yaml(spec), "again.yaml"))
    assert again[field] == value
    if field == "time":
        assert f"#SBATCH --time={value}\n" in render(spec).files[SLURM_SCRIPT]


@pytest.mark.parametrize(
    "text, words",
    [
        ("nodes: true\n", "nodes: expected a whole number, not true/false (got true)"),
        ("gpus: false\n", "gpus: expected a whole number, not true/false (got false)"),
        ("exclusive: 1\n", "exclusive: expected true or false, not a number (got 1)"),
        ("requeue: 0\n", "requeue: expected true or false, not a number (got 0)"),
        ("nodes: [1, 2]\n", "nodes: expected a whole number (got [1, 2])"),
        ("env: [A=1]\n", "env: expected a mapping of NAME: value, e.g. env: {NCCL_DEBUG: INFO} (got ['A=1'])"),
    ],
)
def test_types_are_strict_and_errors_show_the_value(tmp_path, capsys, text, words):
    code, _, err = run(capsys, "create", "--config", str(spec_file(tmp_path, text)), "-o", str(tmp_path / "o"))
    assert code == 2 and err == f"slurmgen: error: {words}\n"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "text, words",
    [
        ("nodes: 2\ngpus: 4\nnodes: 3\n", "config: {path}:3: key 'nodes' is given twice (lines 1 and 3)"),
        ("env:\n  A: 1\n  B: 2\n  A: 3\n", "config: {path}:4: key 'A' is given twice (lines 2 and 4)"),
        ("", "config: {path} holds no spec fields (it is empty or only comments)"),
        ("# nodes: 2\n", "config: {path} holds no spec fields (it is empty or only comments)"),
        ("nodes: [2\n", "config: {path}:2:1: expected ',' or ']', but got '<stream end>'"),
        ("- 2\n", "config: {path} must hold a mapping of spec fields, like 'nodes: 2' (got a list)"),
        (
            b"nodes: 2\njob_name: caf\xe9\n",
            "config: {path}:2: not UTF-8 text (byte 0xe9) (hint: save the file as UTF-8)",
        ),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00", "config: '{path}' is a binary file, not text"),
    ],
)
def test_bad_spec_files_are_named_in_one_line(tmp_path, capsys, text, words):
    path = spec_file(tmp_path, text)
    code, _, err = run(capsys, "create", "--config", str(path), "-o", str(tmp_path / "o"))
    assert code == 2 and err.startswith(f"slurmgen: error: {words.format(path=path)}") and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


def test_a_directory_given_as_spec_is_named(tmp_path, capsys):
    code, _, err = run(capsys, "create", "--config", str(tmp_path))
    assert code == 2 and err == f"slurmgen: error: config: {str(tmp_path)!r} is a directory, not a file\n"


@pytest.mark.parametrize("reader, what", [(lambda p: read_hostfile(p, 1), "hostfile"), (read_env_file, "env_file")])
def test_host_and_env_files_that_are_not_text_are_named(tmp_path, reader, what):
    path = spec_file(tmp_path, b"node1 slots=2\nn\xf6de2\n", "file")
    with pytest.raises(SlurmgenError) as err:
        reader(path)
    assert str(err.value) == f"{what}: {path}:2: not UTF-8 text (byte 0xf6) (hint: save the file as UTF-8)"
    path.write_bytes(b"\x00\x01binary")
    with pytest.raises(SlurmgenError) as err:
        reader(path)
    assert str(err.value) == f"{what}: {str(path)!r} is a binary file, not text"


def test_host_files_take_mpich_slots_and_one_name_rule(tmp_path):
    hosts = read_hostfile(spec_file(tmp_path, "gn1:4\ngn2 slots=2\ngn3\nfe80::1 slots=1\n", "hosts"), 8)
    assert [(h.name, len(h.slots)) for h in hosts] == [("gn1", 4), ("gn2", 2), ("gn3", 8), ("fe80::1", 1)]
    for line, words in (
        ("gn1;gn2", "'gn1;gn2' is not a host name"),
        ("$(x)", "'$(x)' is not a host name"),
        ("gn1:4 slots=2", "slots given twice"),
    ):
        with pytest.raises(SlurmgenError) as err:
            read_hostfile(spec_file(tmp_path, f"ok\n{line}\n", "bad"), 1)
        assert str(err.value).startswith(f"{tmp_path / 'bad'}:2: ") and words in str(err.value), str(err.value)


def test_launch_refuses_shell_metacharacters_in_hosts(capsys):
    code, _, err = run(capsys, "launch", "--hosts", "node1,node2;reboot", "--dry-run", "--", "true")
    assert (
        code == 2
        and err
        == "slurmgen: error: hosts: 'node2;reboot' is not a host name "
        "(expected letters, digits and _ . - only, or an IP address)\n"
    )


@pytest.mark.parametrize(
    "make, flag, words",
    [
        (lambda t: (t / "logs").write_text("x"), "--log-dir", "log_dir: '{t}/logs' is a file, not a directory"),
        (
            lambda t: (t / "f").write_text("x"),
            "--log-dir",
            "log_dir: cannot create '{t}/f/logs': '{t}/f' is a file, not a directory",
        ),
        (lambda t: (t / "o").write_text("x"), "--output-dir", "output_dir: '{t}/o' is a file, not a directory"),
    ],
)
def test_paths_are_checked_before_anything_is_written(tmp_path, capsys, make, flag, words):
    make(tmp_path)
    target = {
        "--log-dir": str(tmp_path / ("logs" if "'{t}/logs'" in words else "f/logs")),
        "--output-dir": str(tmp_path / "o"),
    }[flag]
    out = tmp_path / "out"
    code, stdout, err = run(
        capsys,
        "create",
        "-o",
        str(out if flag != "--output-dir" else target),
        *((flag, target) if flag != "--output-dir" else ()),
    )
    assert code == 2 and err == f"slurmgen: error: {words.format(t=tmp_path)}\n" and stdout == ""
    assert not out.exists()
