"""The pure parts of `slurmgen launch`: host filters, ranks, environment, command assembly."""

import shlex

import pytest

from slurmgen.errors import SlurmgenError
from slurmgen.generate.hostfile import parse_hostfile
from slurmgen.generate.specfile import build_spec
from slurmgen.generate.topology import Host
from slurmgen.launch.plan import build_plan, forwarded_env, node_plans, parse_env_file, parse_filter, select_hosts
from slurmgen.launch.remote import REMOTE_PREFIX, bootstrap, env_text, node_args, payload, remote_command

HOSTS = parse_hostfile("worker-1 slots=4\nworker-2 slots=4\nworker-3 slots=2\n", 1)


def slots(hosts):
    return {h.name: h.slots for h in hosts}


# ---- --include / --exclude (DeepSpeed syntax) ----------------------------------------------------
def test_parse_filter():
    assert parse_filter("worker-1:0,2@worker-2", "include") == {"worker-1": (0, 2), "worker-2": None}
    assert parse_filter("a:3,1,3", "exclude") == {"a": (1, 3)}


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "empty"),
        ("a@@b", "bad host"),
        ("a:x", "whole numbers"),
        ("a:", "whole numbers"),
        ("a@a", "named twice"),
        ("a b", "bad host"),
    ],
)
def test_parse_filter_errors_name_the_flag(text, words):
    with pytest.raises(SlurmgenError) as info:
        parse_filter(text, "include")
    assert str(info.value).startswith("include:") and words in str(info.value)


def test_include_keeps_named_hosts_and_slots_in_file_order():
    assert slots(select_hosts(HOSTS, include="worker-2:1,3@worker-1")) == {"worker-1": (0, 1, 2, 3), "worker-2": (1, 3)}


def test_exclude_drops_slots_and_whole_hosts():
    assert slots(select_hosts(HOSTS, exclude="worker-1:0@worker-3")) == {
        "worker-1": (1, 2, 3),
        "worker-2": (0, 1, 2, 3),
    }
    assert slots(select_hosts(HOSTS, exclude="worker-3:0,1")) == {"worker-1": (0, 1, 2, 3), "worker-2": (0, 1, 2, 3)}


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"include": "worker-9"}, "not one of the hosts"),
        ({"include": "worker-3:5"}, "has no slot 5"),
        ({"include": "a", "exclude": "b"}, "cannot be used together"),
        ({"exclude": "worker-1@worker-2@worker-3"}, "no host is left"),
    ],
)
def test_filter_mistakes(kwargs, words):
    with pytest.raises(SlurmgenError, match=words):
        select_hosts(HOSTS, **kwargs)


# ---- ranks --------------------------------------------------------------------------------------------
def test_uneven_slots_master_first_then_natural_order():
    hosts = [Host.with_count("n10", 1), Host.with_count("n2", 3), Host.with_count("n1", 2)]
    nodes = node_plans(hosts, master="n2")
    assert [(n.host, n.node_rank, n.rank_offset, n.nproc, n.ranks) for n in nodes] == [
        ("n2", 0, 0, 3, "0-2"),
        ("n1", 1, 3, 2, "3-4"),
        ("n10", 2, 5, 1, "5"),
    ]


def test_plan_sets_gpu_list_only_for_partial_slots():
    spec = build_spec({"backend": "gloo"})
    plan = build_plan(spec, select_hosts(HOSTS, include="worker-1:1,3@worker-2"), env={"NCCL_DEBUG": "WARN"})
    assert plan.world_size == 6 and plan.master_addr == "worker-1"
    assert plan.node_env(plan.nodes[0]) == {"NCCL_DEBUG": "WARN", "CUDA_VISIBLE_DEVICES": "1,3"}
    assert plan.node_env(plan.nodes[1]) == {"NCCL_DEBUG": "WARN"}


def test_plan_master_address_sources():
    hosts = [Host.with_count("a", 1), Host.with_count("b", 1)]
    assert build_plan(build_spec({}), hosts, master_addr=lambda h: f"{h}.example").master_addr == "a.example"
    assert build_plan(build_spec({"master_addr": "10.0.0.1"}), hosts, master_addr="x").master_addr == "10.0.0.1"
    assert build_plan(build_spec({"master_port": 31000}), hosts).master_port == 31000
    assert build_plan(build_spec({}), hosts).master_port == 29500


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"max_restarts": -1}, "max_restarts"),
        ({"heartbeat_timeout": 0}, "heartbeat_timeout"),
        ({"stop_grace": -1}, "stop_grace"),
    ],
)
def test_plan_rejects_bad_numbers(kwargs, words):
    with pytest.raises(SlurmgenError, match=words):
        build_plan(build_spec({}), [Host.with_count("a", 1)], **kwargs)


def test_pyxis_is_refused_for_launch():
    spec = build_spec({"container": {"image": "img", "runtime": "pyxis"}})
    with pytest.raises(SlurmgenError, match="container.runtime"):
        build_plan(spec, [Host.with_count("a", 1)])


# ---- environment ----------------------------------------------------------------------------------
def test_allow_list_forwards_only_matching_names():
    environ = {
        "NCCL_DEBUG": "INFO",
        "PYTHONPATH": "/x",
        "HOME": "/root",
        "PATH": "/bin",
        "TORCH_LOGS": "+dynamo",
        "RANK": "3",
        "WANDB_API_KEY": "k",
        "SSH_AUTH_SOCK": "/tmp/a",
        "TORCH_NCCL_BLOCKING_WAIT": "1",
    }
    assert forwarded_env(environ) == {
        "NCCL_DEBUG": "INFO",
        "PYTHONPATH": "/x",
        "TORCH_LOGS": "+dynamo",
        "TORCH_NCCL_BLOCKING_WAIT": "1",
        "WANDB_API_KEY": "k",
    }


@pytest.mark.parametrize(
    "name",
    [
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "ZE_AFFINITY_MASK",
        "HF_HOME",
        "TORCH_HOME",
        "TRANSFORMERS_CACHE",
        "WANDB_DIR",
        "SLURM_JOB_ID",
        "LOCAL_RANK",
        "SLURMGEN_HEARTBEAT_DIR",
        "SLURMGEN_EVENT_FD",
    ],
)
def test_this_machines_devices_and_paths_are_never_forwarded(name):
    assert forwarded_env({name: "0"}) == {}


def test_env_file_format():
    text = "# comment\n\nA=1\nexport B = two words\nC='quoted # not a comment'\nD=x=y\nE=\n"
    assert parse_env_file(text, "f") == {
        "A": "1",
        "B": " two words",
        "C": "quoted # not a comment",
        "D": "x=y",
        "E": "",
    }


@pytest.mark.parametrize(
    "text, words",
    [
        ("JUSTAKEY\n", "f:1: expected KEY=VALUE"),
        ("OK=1\n1BAD=2\n", "f:2: expected KEY=VALUE"),
        ("RANK=2\n", "f:1: RANK is set by slurmgen launch"),
    ],
)
def test_env_file_errors_name_file_and_line(text, words):
    with pytest.raises(SlurmgenError, match=words):
        parse_env_file(text, "f")


def test_env_text_quotes_values_and_hides_secrets_on_request():
    env = {"A": "it's $HOME", "WANDB_API_KEY": "s3cret", "HF_TOKEN": "t"}
    shown = env_text(env, show_secrets=False)
    assert "s3cret" not in shown and "HF_TOKEN='<hidden>'" in shown
    assert 'export A="it\'s \\$HOME"' in env_text(env)


# ---- what goes over the wire ----------------------------------------------------------------------------
def plan_2x2(**kw):
    spec = build_spec({"backend": "gloo", "command": ["python", "-c", "print(1)"]})
    return build_plan(
        spec, [Host.with_count("a", 2), Host.with_count("b", 3)], workdir="/w d", env={"SECRET_TOKEN": "xyz"}, **kw
    )


def test_remote_command_is_fixed_prefix_plus_plain_arguments():
    plan = plan_2x2(heartbeat_timeout=2.5)
    cmd = remote_command(plan, plan.nodes[1], attempt=3)
    assert cmd.startswith(REMOTE_PREFIX + " ")
    words = shlex.split(cmd[len(REMOTE_PREFIX) :])
    assert words == node_args(plan, plan.nodes[1], 3)
    args = dict(w.split("=", 1) for w in words)
    assert args == {
        "attempt": "3",
        "workdir": "/w d",
        "master_addr": "a",
        "master_port": "29500",
        "nnodes": "2",
        "nproc": "3",
        "node_rank": "1",
        "rank_offset": "2",
        "world_size": "5",
        "log_dir": "out/logs",
        "stop_grace": "1",
        "heartbeat_ms": "2500",
        "silence": "20",
        "warm": "0",
    }
    assert "xyz" not in cmd  # the environment never travels on the command line


def test_payload_frames_bootstrap_script_and_environment():
    plan = plan_2x2()
    data = payload(plan, plan.nodes[0])
    n, rest = data.split(b"\n", 1)
    boot, rest = rest[: int(n)], rest[int(n) :]
    assert boot.decode() == bootstrap()
    header, rest = rest.split(b"\n", 1)
    magic, script_len, env_len = header.decode().split()
    assert magic == "slurmgen-payload-1"
    assert rest[: int(script_len)].decode() == plan.script
    rest = rest[int(script_len) :]
    assert rest[: int(env_len)].decode() == "export SECRET_TOKEN=xyz\n"
    assert rest[int(env_len) :] == b"slurmgen-payload-end\n"


def test_bootstrap_and_prefix_lint_clean(tmp_path, shellcheck):
    import subprocess

    f = tmp_path / "bootstrap.sh"
    f.write_text(bootstrap())
    g = tmp_path / "prefix.sh"
    # SC2016: the single quotes are meant, the inner bash expands what they hold.
    g.write_text("#!/bin/sh\n# shellcheck disable=SC2016\n" + REMOTE_PREFIX + " attempt=1\n")
    result = subprocess.run([shellcheck, "-S", "style", str(f), str(g)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
