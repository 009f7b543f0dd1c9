"""Where the doctor's rows come from: this machine, every node of a Slurm allocation, or SSH hosts.

Each way runs the same probe (`probe.py`) on every node at once (the port check needs them
together) and returns its JSON rows; a node that gave none gets a row that says why.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from slurmgen.doctor.probe import READY_PREFIX, RESULT_PREFIX, Arrival, ProbeOptions, probe

# How long a probe waits for the preemption signal the doctor sends once every node is ready.
SIGNAL_WAIT = 5.0
# Beyond those waits: start-up, the torch import and the file hash on a slow node.
STEP_GRACE = 120.0


def _budget(opts: ProbeOptions) -> float:
    """Seconds a whole run of probes may take: its waits, plus the grace."""
    return opts.port_timeout + SIGNAL_WAIT + (opts.fabric_timeout if opts.fabric_mb > 0 else 0.0) + STEP_GRACE


def probe_args(opts: ProbeOptions) -> list[str]:
    """`python -m slurmgen.doctor.probe` arguments for these options."""
    args: list[str] = []
    for key, value in asdict(opts).items():
        flag = "--" + key.replace("_", "-").replace("out-dir", "dir")
        if key == "files":
            args += [flag, *value] if value else []
        elif value is not None:
            args += [flag, str(value)]
    return args


def _parse(line: str) -> dict[str, Any] | None:
    if not line.startswith(RESULT_PREFIX):
        return None
    try:
        row = json.loads(line[len(RESULT_PREFIX) :])
    except ValueError:
        return None
    return row if isinstance(row, dict) and "node" in row else None


def _fill(expected: Sequence[str], rows: list[dict[str, Any]], why: str) -> list[dict[str, Any]]:
    """Rows in the expected node order, with a row saying `why` for each node that gave none."""
    by_node = {row["node"]: row for row in rows}
    extra = [row for row in rows if row["node"] not in expected]
    return [by_node.get(node) or {"node": node, "error": why} for node in expected] + extra


def local_rows(opts: ProbeOptions) -> list[dict[str, Any]]:
    return [probe(replace(opts, nodes=1, signal_wait=0.0))]


def allocation_rows(opts: ProbeOptions, hosts: list[str], python: str = sys.executable) -> list[dict[str, Any]]:
    """One probe per node of this allocation (an srun step); the signal goes to that step once all are ready."""
    n = len(hosts)
    opts = replace(opts, nodes=n, signal_wait=SIGNAL_WAIT)
    argv = [
        "srun",
        "--overlap",
        f"--ntasks={n}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=0",
        "--export=ALL",
        python,
        "-m",
        "slurmgen.doctor.probe",
        *probe_args(opts),
    ]
    rows: list[dict[str, Any]] = []
    ready: set[str] = set()
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True) as proc:
        assert proc.stdout is not None
        # A step that cannot start (or a probe stuck in a broken file system) must not hang the doctor.
        watchdog = threading.Timer(_budget(opts), proc.kill)
        watchdog.start()
        for line in proc.stdout:
            if line.startswith(READY_PREFIX):
                node, step = line[len(READY_PREFIX) :].split()
                ready.add(node)
                if len(ready) == n:  # what Slurm does before the time limit: signal the step's tasks
                    subprocess.run(["scancel", f"--signal={opts.signal}", step], check=False, timeout=30)
            elif (row := _parse(line)) is not None:
                rows.append(row)
            else:
                sys.stderr.write(line)
        watchdog.cancel()
    return _fill(hosts, rows, f"no answer from the probe (srun exited {proc.returncode})")


def ssh_rows(opts: ProbeOptions, hosts: list[str], ssh_opts: Any, python: str, workdir: str) -> list[dict[str, Any]]:
    """One probe per host over SSH (the launch package's connections); rows named by host alias."""
    from slurmgen.ssh.connect import connect_all  # paramiko: only for --hosts

    command = f"cd {shlex.quote(workdir)} && exec {shlex.quote(python)} -m slurmgen.doctor.probe " + " ".join(
        shlex.quote(a) for a in probe_args(replace(opts, nodes=len(hosts), signal_wait=0.0))
    )
    conns = connect_all(hosts, ssh_opts)
    rows: dict[str, dict[str, Any]] = {}
    tails: dict[str, str] = {}

    def run(host: str) -> None:
        proc = conns[host].start(command, b"")
        proc.close_stdin()
        out = b""
        while chunk := proc.read():
            out += chunk
        code = proc.exit_status()
        lines = out.decode(errors="replace").splitlines()
        for line in lines:
            if (row := _parse(line)) is not None:
                rows[host] = {**row, "node": host}
        tails[host] = f"the probe exited {code}: {lines[-1] if lines else 'no output'}"

    try:
        threads = [threading.Thread(target=run, args=(h,), daemon=True) for h in hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for conn in conns.values():
            conn.close()
    return [rows.get(h) or {"node": h, "error": tails.get(h, "no answer")} for h in hosts]


def _wait_for(directory: Path, suffix: str, count: int, deadline: float) -> list[Path]:
    while len(found := sorted(directory.glob(f"*{suffix}"))) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def step_rows(opts: ProbeOptions, hosts: list[str]) -> list[dict[str, Any]] | None:
    """`srun slurmgen doctor`: the first task of each node probes and leaves its row in a
    directory under the (shared) output directory; task 0 signals the step once every node
    is ready, collects the rows and returns them. Every other task returns None."""
    env = os.environ
    step = f"{env.get('SLURM_JOB_ID')}.{env.get('SLURM_STEP_ID')}"
    exchange = Path(opts.out_dir) / f".slurmgen-doctor-{step}"
    exchange.mkdir(parents=True, exist_ok=True)
    # Every task says it is ready for the signal (which reaches all of them), probing or not.
    ready = exchange / f"{env.get('SLURM_PROCID', '0')}.ready"
    if env.get("SLURM_LOCALID", "0") != "0":
        signal.signal(signal.Signals[f"SIG{opts.signal}"], signal.SIG_IGN)
        ready.touch()
        return None
    arrival = Arrival(opts.signal)
    ready.touch()
    opts = replace(opts, nodes=len(hosts), signal_wait=SIGNAL_WAIT)
    deadline = time.monotonic() + _budget(opts)
    leader = env.get("SLURM_PROCID") == "0"
    if leader:
        tasks = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or len(hosts))

        def signal_when_ready() -> None:
            if len(_wait_for(exchange, ".ready", tasks, deadline)) == tasks:
                subprocess.run(["scancel", f"--signal={opts.signal}", step], check=False, timeout=30)

        threading.Thread(target=signal_when_ready, daemon=True).start()
    row = probe(opts, arrival)
    tmp = exchange / f".{row['node']}.tmp"
    tmp.write_text(json.dumps(row))
    tmp.rename(exchange / f"{row['node']}.json")
    if not leader:
        return None
    rows = [json.loads(p.read_text()) for p in _wait_for(exchange, ".json", len(hosts), deadline)]
    shutil.rmtree(exchange, ignore_errors=True)
    return _fill(hosts, rows, "no answer from this node's probe (is the output directory shared?)")
