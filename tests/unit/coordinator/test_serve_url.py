"""The URL `slurmgen serve` prints is one a browser can open, IPv6 included (issue 22)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from slurmgen.coordinator.cli import url_of


def test_an_ipv6_address_is_bracketed_in_the_url():
    assert url_of("::", 18470) == "http://[::]:18470"
    assert url_of("fe80::1", 443, tls=True) == "https://[fe80::1]:443"
    assert url_of("127.0.0.1", 8470) == "http://127.0.0.1:8470" and url_of("node1", 80) == "http://node1:80"


def _free_ipv6_port() -> int:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
            return s.getsockname()[1]
    except OSError:
        pytest.skip("no IPv6 loopback here")


def test_serve_on_all_ipv6_addresses_prints_a_url_that_answers(tmp_path):
    port = _free_ipv6_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slurmgen",
            "serve",
            "--host",
            "::",
            "--port",
            str(port),
            "--db",
            str(tmp_path / "c.db"),
            "--token-file",
            str(tmp_path / "token"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    try:
        lines = [proc.stdout.readline() for _ in range(3)]  # new token (2 lines), then the URL
        url = lines[2].split()[2]
        assert url == f"http://[::]:{port}", lines
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(url + "/", timeout=2)
                break
            except urllib.error.HTTPError:  # any HTTP answer (a login page, 401) is the server answering
                break
            except OSError:
                assert time.monotonic() < deadline, f"{url} never answered"
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        proc.stdout.close()
