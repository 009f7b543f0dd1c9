"""Unlocking passphrase-protected key files before `slurmgen launch` connects (slurmgen/ssh/keys.py).

Real key files from ssh-keygen; the terminal and ssh-agent are stand-ins here (a prompt
function, a list of keys). tests/integration/test_ssh_launch.py runs the same through a real
pseudo-terminal, a real ssh-agent and the test cluster's sshd.
"""

import shutil
import subprocess
from pathlib import Path

import paramiko
import pytest

from slurmgen.errors import SlurmgenError
from slurmgen.ssh.keys import FromAgent, Unusable, public_blob, unlock, unlock_all

pytestmark = pytest.mark.skipif(not shutil.which("ssh-keygen"), reason="ssh-keygen is not installed")

PASSPHRASE = "correct horse $(battery) 'staple'"


def keygen(path, passphrase="", kind="ed25519", pem=False):
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, "-N", passphrase, "-f", str(path), *(["-m", "PEM"] if pem else [])], check=True
    )
    return str(path)


class Prompt:
    def __init__(self, *answers):
        self.answers, self.asked = list(answers), []

    def __call__(self, text):
        self.asked.append(text)
        return self.answers.pop(0)


def test_plain_key_is_left_to_paramiko_and_nobody_is_asked(tmp_path):
    prompt = Prompt()
    assert unlock(keygen(tmp_path / "plain"), prompt, []) is None
    assert prompt.asked == []


@pytest.mark.parametrize("kind, pem", [("ed25519", False), ("rsa", True)])
def test_encrypted_key_is_asked_for_once_and_decrypted(tmp_path, kind, pem):
    path = keygen(tmp_path / "enc", PASSPHRASE, kind, pem)
    prompt = Prompt("wrong", PASSPHRASE)
    key = unlock(path, prompt, [])
    assert key.get_base64() == Path(path + ".pub").read_text().split()[1]
    assert prompt.asked == [f"Enter passphrase for key '{path}': "] * 2


def test_three_wrong_passphrases_stop_with_one_line(tmp_path):
    path = keygen(tmp_path / "enc", PASSPHRASE)
    with pytest.raises(SlurmgenError) as err:
        unlock(path, Prompt("a", "b", "c"), [])
    assert err.value.lines() == [f"identity: wrong passphrase for key file {path} (3 tries)"]
    assert PASSPHRASE not in str(err.value)


def test_without_a_terminal_an_encrypted_key_is_skipped_with_the_fix_kept_for_the_error(tmp_path):
    path = keygen(tmp_path / "enc", PASSPHRASE)
    assert unlock(path, None, []) == Unusable(
        f"encrypted and not in ssh-agent: ssh-add {path}, or run from a terminal to be asked for its passphrase"
    )


def test_key_held_by_the_agent_is_used_from_there_without_asking(tmp_path):
    path = keygen(tmp_path / "enc", PASSPHRASE)
    other = paramiko.Ed25519Key.from_private_key_file(keygen(tmp_path / "other"))
    mine = paramiko.Ed25519Key.from_private_key_file(path, password=PASSPHRASE)
    prompt = Prompt()
    assert unlock(path, prompt, [other, mine]) == FromAgent(mine.get_base64())
    assert prompt.asked == []


def test_public_half_comes_from_the_pub_file_or_the_openssh_header(tmp_path):
    path = keygen(tmp_path / "enc", PASSPHRASE)
    expected = Path(path + ".pub").read_text().split()[1]
    assert public_blob(path) == expected
    (tmp_path / "enc.pub").unlink()
    assert public_blob(path) == expected  # read from the unencrypted header of the key file
    pem = keygen(tmp_path / "pem", PASSPHRASE, "rsa", pem=True)
    (tmp_path / "pem.pub").unlink()
    assert public_blob(pem) is None  # a PEM key keeps no public half outside its encryption


def test_a_file_that_is_no_private_key_is_skipped_with_a_hint(tmp_path):
    path = keygen(tmp_path / "k")
    prompt = Prompt()
    assert unlock(path + ".pub", prompt, []) == Unusable(
        "not a private key slurmgen can read: give the private key, not its .pub"
    )
    assert prompt.asked == []


def test_unlock_all_asks_once_per_file_across_calls(tmp_path):
    enc = keygen(tmp_path / "enc", PASSPHRASE)
    plain = keygen(tmp_path / "plain")
    prompt = Prompt(PASSPHRASE)
    keys = unlock_all([enc, plain, enc, str(tmp_path / "missing")], prompt, agent=[])
    assert set(keys) >= {enc} and plain not in keys
    assert unlock_all([enc], Prompt(), agent=[])[enc] is keys[enc]  # a reconnect asks nobody
    assert len(prompt.asked) == 1
