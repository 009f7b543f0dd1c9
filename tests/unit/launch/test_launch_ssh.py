"""slurmgen.ssh.connect without a network: ssh config resolution, ProxyJump parsing, error lines."""

import errno
import socket

import paramiko
import pytest

from slurmgen.errors import SlurmgenError
from slurmgen.ssh.connect import SSHOptions, Target, connect_all, load_config, resolve
from slurmgen.ssh.explain import explain
from slurmgen.ssh.target import parse_jump

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
        "gpu1.cluster.example",
        "alice",
        2200,
        True,
        "bob@bastion:2222",
    )
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
        "  ProxyCommand ssh -W %h:%p -l %r gateway\n"
    )
    t = resolve("inner1", SSHOptions(), config)
    assert t.proxy_command == "ssh -W inner1.lan:2022 -l carol gateway" and t.proxy_jump is None
    assert t.describe() == "carol@inner1.lan:2022 via ProxyCommand 'ssh -W inner1.lan:2022 -l carol gateway'"
    assert resolve("off", SSHOptions(), config).proxy_command is None


@pytest.mark.parametrize(
    "spec, parsed",
    [("bastion", ("bastion", None, None)), ("bob@bastion:2222", ("bastion", "bob", 2222)), ("j1:22", ("j1", None, 22))],
)
def test_proxy_jump_spec(spec, parsed):
    assert parse_jump(spec) == parsed


TARGET = Target("n1", "n1.example", 22, "root", (), False, ("/kh",), (), None)


@pytest.mark.parametrize(
    "exc, words",
    [
        (socket.gaierror(-2, "Name or service not known"), "n1: cannot resolve host name 'n1.example'"),
        (TimeoutError("timed out"), "n1: no answer from n1.example:22 within 3 s"),
        (
            paramiko.ssh_exception.NoValidConnectionsError({("1.2.3.4", 22): OSError(errno.ECONNREFUSED, "refused")}),
            "n1: connection refused by n1.example:22",
        ),
        (
            paramiko.AuthenticationException("Authentication failed."),
            "n1: authentication as 'root' failed at n1.example:22",
        ),
        (
            paramiko.SSHException("Error reading SSH protocol banner"),
            "n1: n1.example:22 sent no SSH greeting within 3 s",
        ),
    ],
)
def test_errors_become_one_line_naming_the_host(exc, words):
    assert explain(TARGET, exc, 3).line().startswith(words)


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


# ---- jump hosts shared by the targets behind them ---------------------------------------------------
def test_jump_pool_connects_once_for_many_targets_and_shares_a_failure():
    import threading
    import time

    from slurmgen.ssh.connect import ConnectError, Connection
    from slurmgen.ssh.jumps import JumpPool

    class Client:
        closed = 0

        def close(self):
            Client.closed += 1

    made = []

    def make():
        time.sleep(0.05)  # the others arrive while it connects
        made.append(1)
        return Connection(resolve("bastion", SSHOptions(), paramiko.SSHConfig()), Client())

    pool = JumpPool()
    got = []
    threads = [threading.Thread(target=lambda: got.append(pool.get("bastion", make))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and len(got) == 8 and len({id(c) for c in got}) == 1
    for conn in got[:7]:
        conn.close()
    assert Client.closed == 0  # one target still needs it
    got[7].close()
    got[7].close()  # closing a closed connection does nothing
    assert Client.closed == 1
    failures = []

    def refuse():
        failures.append(1)
        raise ConnectError("bastion", "connection refused by bastion:22")

    for _ in range(3):
        with pytest.raises(ConnectError, match="refused"):
            pool.get("other", refuse)
    assert failures == [1]


def test_paramiko_comes_without_invoke_unless_a_config_has_match_exec(tmp_path):
    import subprocess
    import sys

    cfg = tmp_path / "config"
    cfg.write_text('Match exec "test -n x"\n  User bob\nHost x\n  Port 2\n')
    code = (
        "import sys; from slurmgen.ssh.connect import load_config; before = 'invoke' in sys.modules; "
        f"found = load_config({str(cfg)!r}).lookup('x'); print(before, 'invoke' in sys.modules, found['user'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True", "bob"]
