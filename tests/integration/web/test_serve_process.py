"""A real `slurmgen serve` process: what a stranger's huge POST costs it in memory, and how it
stops (with an agent's long poll open) -- things only the process itself can show."""

from __future__ import annotations

import signal
import socket
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the coordinator needs the serve extra")
BIG = 200 * 1024 * 1024
CHUNK = 1024 * 1024


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _post_big(url: str, path: str, chunked: bool) -> bytes:
    """POST BIG bytes without a token; stop sending when the server answers or closes."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        length = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {BIG}"
        s.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            f"{length}\r\n\r\n".encode()
        )
        block = b"token=" + b"a" * (CHUNK - 6)
        try:
            for _ in range(BIG // CHUNK):
                s.sendall(f"{CHUNK:x}\r\n".encode() + block + b"\r\n" if chunked else block)
        except OSError:  # the server answered and closed: it is not reading the rest
            pass
        s.settimeout(10)
        try:
            return s.recv(4096)
        except OSError:
            return b""


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_huge_unauthenticated_post_is_refused_in_bounded_memory(serve, chunked):
    """A 200 MB POST to /ui/login took the server from 85 MB to 800 MB resident."""
    coord = serve()
    server = coord.procs[0]
    before = _rss_mb(server.pid)
    answer = _post_big(coord.url, "/ui/login", chunked)
    after = _rss_mb(server.pid)
    print(
        f"RSS of slurmgen serve: {before:.1f} MB before, {after:.1f} MB after a 200 MB POST "
        f"({'chunked' if chunked else 'Content-Length'}); answer {answer[:12]!r}"
    )
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert after - before < 20, f"{before:.1f} MB -> {after:.1f} MB"
    assert coord.api("GET", "/api/health", token=None)[0] == 200, "still serving"


def test_stopping_the_server_is_quick_and_quiet_with_agents_polling(serve):
    """Every stop printed "ERROR: Cancel 3 running task(s), timeout graceful shutdown exceeded"."""
    coord = serve(("127.0.0.1", "localhost"))
    home = coord.home
    time.sleep(1.5)  # each agent's long poll is open now
    server = coord.procs[0]
    started = time.monotonic()
    server.send_signal(signal.SIGTERM)
    server.wait(10)
    took = time.monotonic() - started
    log = (home / "serve.log").read_text()
    assert "ERROR" not in log and "Traceback" not in log, log
    # uvicorn ends by re-raising the signal it caught: "killed by TERM" is its clean exit
    assert server.returncode in (0, -signal.SIGTERM) and took < 2.0, (server.returncode, took, log)


def test_rank_logs_on_a_real_agent_are_private(serve):
    coord = serve(("127.0.0.1",))
    home = coord.home
    workers = [w["name"] for w in coord.wait_workers(2)]
    assert coord.api("POST", "/api/groups", {"name": "private"})[0] == 201
    assert coord.api("POST", "/api/workers/move", {"workers": workers, "group": "private"})[0] == 200
    assert (
        coord.api(
            "PUT", "/api/groups/private/config", {"backend": "gloo", "argv": [sys.executable, "-c", "print('secret')"]}
        )[0]
        == 200
    )
    assert coord.api("POST", "/api/groups/private/start")[0] == 200
    logs = home / "state" / "slurmgen" / "agent" / "127.0.0.1" / "logs"
    deadline = time.monotonic() + 20
    while len(list(logs.glob("private/attempt-1/rank-*.log"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    files = sorted(logs.glob("private/attempt-1/rank-*.log"))
    assert len(files) == 2
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o600, f
    for d in (files[0].parent, files[0].parent.parent, logs):
        assert d.stat().st_mode & 0o777 == 0o700, d
