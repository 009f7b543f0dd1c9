"""One node's facts for `slurmgen doctor`, as a JSON dict.

Run on every node as `python -m slurmgen.doctor.probe [options]`; it prints
`SLURMGEN-DOCTOR-READY <node> <job>.<step>` once its handler for the preemption signal is in
place (when asked to check it), then one `SLURMGEN-DOCTOR {json}` line. Each check fills its own key and never
raises: a node that cannot answer a question says why in that key (`"error"`), so one broken
node still gives a full row. torch is imported here and nowhere else in the doctor.

The port check needs every probe of a run at once: the node that owns MASTER_ADDR (the one
that can bind it) listens on MASTER_PORT until all `nodes` probes have said hello or the
time is up, and every probe, that one included, connects and waits for the answer.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RESULT_PREFIX = "SLURMGEN-DOCTOR "
READY_PREFIX = "SLURMGEN-DOCTOR-READY "
MAX_FILES = 20_000
SKIP_DIRS = {"__pycache__", "node_modules", "venv", ".venv"}


@dataclass(frozen=True)
class ProbeOptions:
    files: tuple[str, ...] = ()  # empty: the working tree (git ls-files, else a walk)
    out_dir: str = "."
    min_free_gb: float = 1.0
    master_addr: str | None = None
    master_port: int | None = None
    nodes: int = 1  # probes that will connect to the master port, this one included
    port_timeout: float = 10.0
    signal: str = ""  # the preemption signal to check (USR2, USR1; the doctor names the spec's)
    signal_wait: float = 0.0  # 0: not checked (no job step to signal)
    fabric_mb: float = 0.0  # 0: no network preflight (--fabric); else the all-reduce's size in MB
    fabric_timeout: float = 30.0  # seconds the bandwidth probe waits for the other nodes


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def software() -> dict[str, Any]:
    """Python, torch, CUDA and NCCL versions, GPU count (None where torch is missing)."""
    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": None,
        "cuda": None,
        "nccl": None,
        "gpus": None,
    }
    try:
        import torch
    except Exception:  # not installed, or broken: both mean "no torch" on this node
        return facts
    facts.update(torch=torch.__version__, cuda=torch.version.cuda, gpus=torch.cuda.device_count())
    try:
        if torch.cuda.is_available():
            version = torch.cuda.nccl.version()
            facts["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    except Exception:
        pass
    return facts


def _tree(paths: tuple[str, ...], skip: str) -> list[str]:
    """The files to hash, relative to the working directory, sorted; `skip` (the output
    directory, whose logs change while the nodes read them) is left out of a walk."""
    if not paths:
        try:
            out = subprocess.run(["git", "ls-files", "-z"], capture_output=True, timeout=30, check=True).stdout
            return sorted(p for p in out.decode().split("\0") if p and os.path.isfile(p))
        except (OSError, subprocess.SubprocessError):
            paths = (".",)  # no git, or not a repository: every file below here
    found: list[str] = []
    for path in paths:
        if os.path.isfile(path):
            found.append(os.path.normpath(path))
            continue
        if not os.path.isdir(path):
            raise FileNotFoundError(f"no such file or directory: {path}")
        for root, dirs, files in os.walk(path):
            dirs[:] = [
                d
                for d in dirs
                if not d.startswith(".")
                and d not in SKIP_DIRS
                and os.path.realpath(os.path.join(root, d)) != os.path.realpath(skip)
            ]
            found += [os.path.normpath(os.path.join(root, f)) for f in files]
            if len(found) > MAX_FILES:
                raise ValueError(f"more than {MAX_FILES} files under {path}; name the ones that matter with --files")
    return sorted(set(found))


def tree_hash(paths: tuple[str, ...], skip: str = "") -> dict[str, Any]:
    """A short sha256 over the files' names and contents: equal on nodes that run the same code."""
    try:
        files = _tree(paths, skip)
        total = hashlib.sha256()
        for name in files:
            content = hashlib.sha256()
            with open(name, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    content.update(block)
            total.update(name.encode() + b"\0" + content.digest())
        return {"hash": total.hexdigest()[:12], "count": len(files)}
    except (OSError, ValueError) as exc:
        return {"hash": None, "error": str(exc)}


def disk(out_dir: str, min_free_gb: float) -> dict[str, Any]:
    try:
        free = shutil.disk_usage(out_dir).free
    except OSError as exc:
        return {"ok": False, "free_gb": None, "error": f"{out_dir}: {exc.strerror}"}
    gb = round(free / 1e9, 1)
    ok = free >= min_free_gb * 1e9
    return {"ok": ok, "free_gb": gb, "error": None if ok else f"{gb} GB free in {out_dir}, want {min_free_gb:g}"}


def resolve(addr: str) -> dict[str, Any]:
    try:
        ip = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)[0][4][0]
    except OSError as exc:
        return {"addr": addr, "ip": None, "error": f"{addr} does not resolve: {exc.strerror or exc}"}
    return {"addr": addr, "ip": ip, "error": None}


def _listen(ip: str, port: int) -> socket.socket | None:
    """A listening socket if this node owns `ip` and the port is free, else None.

    Taken already, the port may be another probe's on the same machine (fine) or another
    program's: then the hello gets no "ok", and that is what the check reports."""
    sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((ip, port))
        sock.listen(64)  # two SO_REUSEADDR sockets may both bind; only one may listen
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.EADDRNOTAVAIL, errno.EADDRINUSE):
            return None
        raise
    return sock


def _serve(sock: socket.socket, nodes: int, deadline: float, heard: list[str]) -> None:
    """Answer hellos until every probe has said one or the time is up."""
    with sock:
        while len(heard) < nodes and (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    heard.append(conn.makefile().readline().strip())
                    conn.sendall(b"ok\n")
                except OSError:
                    continue


def _hello(ip: str, port: int, deadline: float) -> str | None:
    """Say hello to the master until it answers; None when it did, else the last error."""
    last = "no attempt"
    while (left := deadline - time.monotonic()) > 0:
        try:
            with socket.create_connection((ip, port), timeout=min(1.0, left)) as conn:
                conn.sendall(f"{node_name()}\n".encode())
                if conn.makefile().readline().strip() == "ok":
                    return None
                last = "another program answers on that port"
        except OSError as exc:
            last = exc.strerror or type(exc).__name__
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    return last


def port_check(ip: str, port: int, nodes: int, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    heard: list[str] = []
    try:
        sock = _listen(ip, port)
    except OSError as exc:
        return {"ok": False, "listener": True, "error": f"cannot listen on {ip}:{port}: {exc.strerror}"}
    server = threading.Thread(target=_serve, args=(sock, nodes, deadline, heard), daemon=True) if sock else None
    if server:
        server.start()
    error = _hello(ip, port, deadline)
    if server:
        server.join()
    result: dict[str, Any] = {
        "ok": error is None,
        "listener": server is not None,
        "error": None if error is None else f"{ip}:{port} unreachable within {timeout:g} s: {error}",
    }
    if server:
        result["heard"] = sorted(heard)
    return result


class Arrival:
    """Notes the arrival of the preemption signal (what Slurm sends before the time limit): the
    one the job's spec names, since a program may handle USR2 and not USR1, or the reverse."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.arrived = threading.Event()
        signal.signal(signal.Signals["SIG" + name], lambda *_: self.arrived.set())

    def result(self, wait: float) -> dict[str, Any]:
        ok = self.arrived.wait(wait)
        return {"ok": ok, "name": self.name, "error": None if ok else f"no {self.name} arrived within {wait:g} s"}


def probe(opts: ProbeOptions, arrival: Arrival | None = None) -> dict[str, Any]:
    """Every check on this node. Network first: the other nodes wait for this one's listener."""
    row: dict[str, Any] = {"node": node_name()}
    if opts.master_addr:
        row["master"] = resolve(opts.master_addr)
        ip = row["master"]["ip"]
        if ip and opts.master_port:
            row["port"] = port_check(ip, opts.master_port, opts.nodes, opts.port_timeout)
    if opts.fabric_mb > 0:  # right after the port check: every node is there now
        from slurmgen.doctor import fabric

        ip = (row.get("master") or {}).get("ip")
        row["fabric"] = fabric.check(ip, opts.master_port, opts.nodes, opts.fabric_mb, opts.fabric_timeout, row["node"])
    row.update(software())
    row["files"] = tree_hash(opts.files, skip=opts.out_dir)
    row["disk"] = disk(opts.out_dir, opts.min_free_gb)
    if arrival is not None:
        row["signal"] = arrival.result(opts.signal_wait)
    return row


def parse_args(argv: list[str]) -> ProbeOptions:
    p = argparse.ArgumentParser(prog="python -m slurmgen.doctor.probe", description=__doc__.split("\n")[0])
    p.add_argument("--files", nargs="*", default=[])
    p.add_argument("--dir", default=".")
    p.add_argument("--min-free-gb", type=float, default=1.0)
    p.add_argument("--master-addr")
    p.add_argument("--master-port", type=int)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--port-timeout", type=float, default=10.0)
    p.add_argument("--signal", default="")
    p.add_argument("--signal-wait", type=float, default=0.0)
    p.add_argument("--fabric-mb", type=float, default=0.0)
    p.add_argument("--fabric-timeout", type=float, default=30.0)
    a = p.parse_args(argv)
    return ProbeOptions(
        tuple(a.files),
        a.dir,
        a.min_free_gb,
        a.master_addr,
        a.master_port,
        a.nodes,
        a.port_timeout,
        a.signal,
        a.signal_wait,
        a.fabric_mb,
        a.fabric_timeout,
    )


def main(argv: list[str] | None = None, emit: Callable[[str], None] = print) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    arrival = Arrival(opts.signal) if opts.signal and opts.signal_wait > 0 else None
    if arrival is not None:
        step = f"{os.environ.get('SLURM_JOB_ID', '')}.{os.environ.get('SLURM_STEP_ID', '')}"
        emit(f"{READY_PREFIX}{node_name()} {step}")
        sys.stdout.flush()
    emit(RESULT_PREFIX + json.dumps(probe(opts, arrival)))
    if opts.fabric_mb > 0 and argv is None:
        # gloo's worker thread may abort the interpreter's exit (torch 2.13, CPU): the row is out.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
