"""`slurmgen launch` on the command line: bad input is one line and exit 2; --dry-run shows
per host what would run and connects to nothing."""

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "args, words",
    [
        ([], "hosts: give exactly one of --hosts and --hostfile (got neither)"),
        (["--hosts", "a", "--hostfile", "f"], "hosts: give exactly one of --hosts and --hostfile (got both)"),
        (["--hosts", "a[1-"], "hostlist: unmatched '['"),
        (["--hosts", "a,b", "--include", "c"], "include: host 'c' is not one of the hosts ['a', 'b']"),
        (["--hosts", "a,b", "--exclude", "a:x"], "exclude: slots of a must be whole numbers"),
        (["--hosts", "a,b", "--master", "z"], "master: 'z' is not one of the hosts"),
        (["--hosts", "a,a"], "hosts: 'a' is listed more than once"),
        (["--hosts", "a", "--env", "RANK=1"], "env: RANK is set by the launch scripts"),
        (
            ["--hosts", "a", "--env", "SLURMGEN_HEARTBEAT_DIR=/b"],
            "env: SLURMGEN_HEARTBEAT_DIR is set by the launch scripts",
        ),
        (["--hosts", "a", "--env", "NOVALUE"], "env: expected KEY=VALUE (got 'NOVALUE')"),
        (["--hosts", "a", "--gpus", "0"], "gpus:"),
        (["--hosts", "a", "--port", "70000"], "port: must be a port number 1-65535 (got 70000)"),
        (["--hosts", "a", "--port", "0"], "port: must be a port number 1-65535 (got 0)"),
        (["--hosts", "a", "--max-restarts", "-1"], "max_restarts: must be 0 or more (got -1)"),
        (["--hosts", "a", "--connect-timeout", "0"], "connect_timeout: must be more than 0 seconds (got 0)"),
        (["--hosts", "a", "--keepalive", "0"], "keepalive: must be more than 0 seconds (got 0)"),
        (["--hosts", "a", "--heartbeat-timeout", "-2.5"], "heartbeat_timeout: must be more than 0 seconds (got -2.5)"),
        (["--hosts", "a", "--stop-grace", "-1"], "stop_grace: must be 0 or more seconds (got -1)"),
        (["--hosts", "a", "--env-file", "/nonexistent/env"], "env_file: cannot read '/nonexistent/env'"),
        (["--hostfile", "/nonexistent/hosts"], "hostfile: cannot read '/nonexistent/hosts'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, words):
    code, out, err = run(capsys, "launch", "--dry-run", *args, "--", "true")
    assert code == 2, err
    assert words in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_env_file_error_names_file_and_line(capsys, tmp_path):
    env = tmp_path / "my_env"
    env.write_text("A=1\nnot a pair\n")
    code, _, err = run(capsys, "launch", "--dry-run", "--hosts", "a", "--env-file", str(env), "--", "true")
    assert code == 2 and f"{env}:2: expected KEY=VALUE" in err


def test_dry_run_shows_each_host_hides_secrets_and_connects_to_nothing(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("HOME_ONLY", "not forwarded")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two hosts that do not exist\nnode-a slots=2\nnode-b slots=3\n")
    envfile = tmp_path / ".deepspeed_env"
    envfile.write_text("HF_TOKEN=hf_s3cret\nMY_SETTING=7\n")
    sshcfg = tmp_path / "ssh_config"
    sshcfg.write_text("Host node-a\n  HostName 192.0.2.10\n  User alice\n  Port 2222\n")
    code, out, err = run(
        capsys,
        "launch",
        "--dry-run",
        "--hostfile",
        str(hostfile),
        "--include",
        "node-a@node-b:0,2",
        "--env-file",
        str(envfile),
        "--ssh-config",
        str(sshcfg),
        "--workdir",
        "/srv/job",
        "-e",
        "VISIBLE=yes",
        "--",
        "python",
        "train.py",
        "--lr",
        "3e-4",
    )
    assert code == 0, err
    assert "# ===== node-a (alice@192.0.2.10:2222): node rank 0, ranks 0-1 =====" in out
    assert "# ===== node-b (" in out and "node rank 1, ranks 2-3 =====" in out
    assert "master_addr=192.0.2.10" in out and "rank_offset=2" in out and "workdir=/srv/job" in out
    assert "export NCCL_DEBUG=INFO" in out and "export MY_SETTING=7" in out
    assert "export CUDA_VISIBLE_DEVICES='0,2'" in out
    assert "HF_TOKEN='<hidden>'" in out and "hf_s3cret" not in out
    assert "HOME_ONLY" not in out
    assert "export VISIBLE=yes" in out  # --env goes into the node script itself
    assert "cmd=(python train.py --lr 3e-4)" in out


@pytest.mark.parametrize("args", [["launch", "--help"], ["create", "--dry-run"], ["ranks", "--hosts", "a,b"]])
def test_only_launch_itself_imports_paramiko(args):
    probe = (
        "import sys, runpy; sys.argv = ['slurmgen', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('slurmgen', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('HEAVY', [m for m in ('torch', 'paramiko') if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert "HEAVY []" in result.stdout, result.stdout[-500:] + result.stderr[-2000:]


# ... nor YAML (flags alone: no --config, no job.yaml) nor pydantic (~90 ms; the spec is msgspec's).
DRY_RUN_SKIPS = (
    "torch",
    "paramiko",
    "cryptography",
    "invoke",
    "sqlite3",
    "slurmgen.ssh.connect",
    "slurmgen.launch.fanout",
    "slurmgen.runs.registry",
    "yaml",
    "typer._adapters",
    "pydantic",
    "slurmgen.tracking",
    "slurmgen.coordinator.cli",
    "slurmgen.jobs.cli",
)


def test_a_dry_run_imports_no_ssh_stack_and_no_registry(tmp_path):
    # `launch --dry-run` connects to nothing and records nothing: paramiko (with cryptography)
    # and the run registry were most of its start-up before it printed a line.
    (tmp_path / "none").write_text("Host node-a\n  HostName 192.0.2.10\n  User alice\n")
    probe = (
        "import sys, runpy; sys.argv = ['slurmgen', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('slurmgen', run_name='__main__')\n"
        "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
        f"print('HEAVY', [m for m in {DRY_RUN_SKIPS!r} if m in sys.modules])"
    )
    args = ["launch", "--dry-run", "--hosts", "node-a", "--ssh-config", str(tmp_path / "none"), "--", "python", "x.py"]
    result = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert "# ===== node-a (alice@192.0.2.10:22): node rank 0, ranks 0 =====" in result.stdout, result.stderr[-2000:]
    assert "HEAVY []" in result.stdout, result.stdout[-500:] + result.stderr[-2000:]


def test_same_yaml_spec_as_create(capsys, tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text(
        "gpus: 3\nbackend: gloo\nmaster_port: 31337\nenv:\n  NCCL_DEBUG: WARN\n"
        "setup: ['source /opt/venv/bin/activate']\ncommand: python train.py --epochs 2\n"
    )
    code, out, err = run(
        capsys,
        "launch",
        "--dry-run",
        "--config",
        str(config),
        "--hosts",
        "x1,x2",
        "--ssh-config",
        str(tmp_path / "none"),
        "--max-restarts",
        "2",
        "--heartbeat-timeout",
        "30",
    )
    assert code == 2 and "ssh_config: cannot read" in err  # an explicit config file must exist
    (tmp_path / "none").write_text("")
    code, out, err = run(
        capsys,
        "launch",
        "--dry-run",
        "--config",
        str(config),
        "--hosts",
        "x1,x2",
        "--ssh-config",
        str(tmp_path / "none"),
        "--heartbeat-timeout",
        "30",
    )
    assert code == 0, err
    assert "6 rank(s), master x1:31337" in out and "nproc=3" in out and "heartbeat_ms=30000" in out
    assert " heartbeat_dir=" not in out and "SLURMGEN_HEARTBEAT_DIR=$heartbeat_dir" in out  # the node's own directory
    assert "export NCCL_DEBUG=WARN" in out and "source /opt/venv/bin/activate" in out
    assert "cmd=(python train.py --epochs 2)" in out


def test_the_spec_heartbeat_timeout_applies_unless_the_flag_says_otherwise(capsys, tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text("heartbeat_timeout: 7\n")
    (tmp_path / "none").write_text("")
    args = ["launch", "--dry-run", "--config", str(config), "--hosts", "x1", "--ssh-config", str(tmp_path / "none")]
    code, out, err = run(capsys, *args)
    assert code == 0 and "heartbeat_ms=7000" in out, err
    code, out, err = run(capsys, *args, "--heartbeat-timeout", "2")
    assert code == 0 and "heartbeat_ms=2000" in out, err
