"""slurmgen.launch.ssh.connect without a network: ssh config resolution, ProxyJump parsing, error lines."""

import errno
import socket

import paramiko
import pytest

from slurmgen.errors import SlurmgenError
from slurmgen.launch.ssh.connect import SSHOptions, Target, _explain, connect_all, load_config, resolve
from slurmgen.launch.ssh.target import parse_jump

CONFIG = paramiko.SSHConfig.from_text("""
Host gpu*
  HostName %h.cluster.example
  User alice
  Port 2200
  IdentityFile ~/.ssh/id_gpu
  IdentitiesOnly yes
  UserKnownHostsFile /etc/cluster_known_hosts ~/.ssh/known_hosts2
  ProxyJump bob@bastion:2222
Host *
  IdentityFile ~/.ssh/id_default
""")


def test_config_fills_what_flags_leave_open():
    t = resolve("gpu1", SSHOptions(), CONFIG)
    assert (t.hostname, t.user, t.port, t.identities_only, t.proxy_jump) == (
        "gpu1.cluster.example", "alice", 2200, True, "bob@bastion:2222")
    assert t.identities[0].endswith("/.ssh/id_gpu") and t.identities[1].endswith("/.ssh/id_default")
    assert t.known_hosts[0] == "/etc/cluster_known_hosts" and t.known_hosts[1].endswith("/.ssh/known_hosts2")
    assert t.key_name == "[gpu1.cluster.example]:2200"


def test_flags_win_over_the_config():
    t = resolve("gpu1", SSHOptions(user="root", port=22, identities=("/k",), known_hosts="/kh"), CONFIG)
    assert (t.user, t.port, t.identities[0], t.known_hosts, t.global_known_hosts) == ("root", 22, "/k", ("/kh",), ())
    assert t.key_name == "gpu1.cluster.example"


def test_unknown_host_defaults():
    t = resolve("plain", SSHOptions(), paramiko.SSHConfig())
    assert (t.hostname, t.port, t.proxy_jump) == ("plain", 22, None)
    assert t.known_hosts[0].endswith("/.ssh/known_hosts")


def test_proxy_command_is_expanded_and_none_turns_it_off():
    config = paramiko.SSHConfig.from_text(
        "Host off\n  ProxyCommand none\nHost inner*\n  HostName %h.lan\n  User carol\n  Port 2022\n"
        "  ProxyCommand ssh -W %h:%p -l %r gateway\n")
    t = resolve("inner1", SSHOptions(), config)
    assert t.proxy_command == "ssh -W inner1.lan:2022 -l carol gateway" and t.proxy_jump is None
    assert t.describe() == "carol@inner1.lan:2022 via ProxyCommand 'ssh -W inner1.lan:2022 -l carol gateway'"
    assert resolve("off", SSHOptions(), config).proxy_command is None


@pytest.mark.parametrize("spec, parsed", [("bastion", ("bastion", None, None)), ("bob@bastion:2222", ("bastion", "bob", 2222)),
                                          ("j1:22", ("j1", None, 22))])
def test_proxy_jump_spec(spec, parsed):
    assert parse_jump(spec) == parsed


TARGET = Target("n1", "n1.example", 22, "root", (), False, ("/kh",), (), None)


@pytest.mark.parametrize("exc, words", [
    (socket.gaierror(-2, "Name or service not known"), "n1: cannot resolve host name 'n1.example'"),
    (TimeoutError("timed out"), "n1: no answer from n1.example:22 within 3 s"),
    (paramiko.ssh_exception.NoValidConnectionsError({("1.2.3.4", 22): OSError(errno.ECONNREFUSED, "refused")}),
     "n1: connection refused by n1.example:22"),
    (paramiko.AuthenticationException("Authentication failed."), "n1: authentication as 'root' failed at n1.example:22"),
    (paramiko.SSHException("Error reading SSH protocol banner"), "n1: n1.example:22 sent no SSH greeting within 3 s"),
])
def test_errors_become_one_line_naming_the_host(exc, words):
    assert _explain(TARGET, exc, 3).line().startswith(words)


def test_missing_ssh_config_is_bad_input():
    with pytest.raises(SlurmgenError, match="ssh_config: cannot read '/nonexistent/cfg'"):
        load_config("/nonexistent/cfg")


def test_all_failures_are_reported_together(tmp_path, monkeypatch):
    # Names that do not resolve (the resolver is replaced: no query leaves this machine).
    def no_such_host(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    opts = SSHOptions(known_hosts=str(tmp_path / "kh"), ssh_config=str(tmp_path / "cfg"), connect_timeout=1)
    (tmp_path / "cfg").write_text("")
    with pytest.raises(SlurmgenError) as info:
        connect_all(["a.invalid", "b.invalid"], opts)
    assert info.value.exit_code == 1
    assert [p.split(":")[0] for p in info.value.problems] == ["a.invalid", "b.invalid"]
    assert all("cannot resolve host name" in p for p in info.value.problems)
