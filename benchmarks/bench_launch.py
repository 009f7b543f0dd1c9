"""`slurmgen launch` beside pdsh and plain ssh on the test cluster, from 1 to 32 hosts.

    sudo python benchmarks/bench_launch.py [--repeat 3] [--hosts 1,8,16,32] [--reuse] [--wait 1800]

Brings up scripts/cluster/up.sh N (root; each node a network namespace with its own sshd; no
Slurm daemons, which launch does not need) unless --reuse, and tears it down at the end. The
cluster is shared through an owner lock: --wait seconds for another session to finish.

1. Start-up: time from command start to all ranks running, one rank per host:
   - slurmgen launch --hosts node[1-K] -- bash -c 'echo RANK_UP; sleep 1'
   - pdsh -R ssh -w node[1-K] running the same per-node command: the same process loop
     (launch_multi_node.sh written by `slurmgen create`, on the shared disk) with the same
     rank command, node rank from the host name.
   - plain parallel ssh: K `ssh nodeK true` processes (OpenSSH) at once, until all ended.
   "Running" = the rank's RANK_UP line has reached the launching command's output. Commands
   alternate round by round; medians are printed. All hosts share this machine's two cores,
   so every host's sshd and shell add up here where a real cluster pays them once, in
   parallel: the fair figure is how each grows from 1 to K hosts against plain ssh.
   Goals: slurmgen's growth 1 -> 32 below plain ssh's; faster than pdsh at every size.
   Logged in as a lean account made for the benchmark (empty rc files; removed at the end),
   so what grows with K is SSH and the launcher, not a login shell's rc files.
2. The launching machine's CPU per host: user + system CPU of the `slurmgen launch` process
   (getrusage of reaped children) over its whole start-up run, divided by K. Goal: flat.
3. Crash to all gone: from a rank's crash (its own timestamp, taken just before it exits 3)
   to the last process of the job gone from every node, ranks and slurmgen's own (a /proc
   scan every 10 ms; the nodes are namespaces of this machine), K hosts x 1 rank.
   Goal: <= 2 s at 32 hosts. pdsh does not stop the other nodes: shown as how many are
   still alive 10 s after the crash.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLUSTER = Path(os.environ.get("SLURMGEN_CLUSTER_DIR", "/tmp/slurmgen-cluster"))
PY = sys.executable


def up(nodes: int, wait: float) -> None:
    """The cluster with `nodes` SSH-only nodes, waiting up to `wait` s for another owner."""
    env = {
        **os.environ,
        "SLURMGEN_CLUSTER_OWNER": str(os.getpid()),
        "SLURMGEN_CLUSTER_SLURM_NODES": "0",
        "SLURMGEN_CLUSTER_TIMEOUT": "60",
    }
    deadline = time.monotonic() + wait
    while True:
        proc = subprocess.run(
            ["bash", str(REPO / "scripts/cluster/up.sh"), str(nodes)], env=env, capture_output=True, text=True
        )
        if proc.returncode != 4:
            break
        if time.monotonic() > deadline:
            sys.exit(f"the test cluster is busy (another session owns it): {proc.stderr.strip()}")
        time.sleep(10)
    if proc.returncode != 0:
        sys.exit(f"scripts/cluster/up.sh {nodes} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def down() -> None:
    subprocess.run(["bash", str(REPO / "scripts/cluster/down.sh")], capture_output=True)


def node_namespaces() -> set[int]:
    """Inodes of the cluster nodes' network namespaces."""
    return {os.stat(f"/run/netns/{name}").st_ino for name in os.listdir("/run/netns") if name.startswith("sg-node")}


def job_pids(*markers: str) -> list[int]:
    """Processes on the cluster's nodes whose command line holds one of `markers` (the nodes
    share this /proc; processes of other sessions on this machine are not on the nodes)."""
    nodes = node_namespaces()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read()
            if any(m.encode() in cmdline for m in markers) and os.stat(f"/proc/{entry.name}/ns/net").st_ino in nodes:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def wait_ranks_up(proc: subprocess.Popen, count: int, start: float, timeout: float = 60) -> float:
    """Seconds from `start` until `count` RANK_UP lines came out of proc's stdout."""
    seen = 0
    deadline = start + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        if "RANK_UP" in line and "echo" not in line:
            seen += 1
            if seen == count:
                return time.perf_counter() - start
        if time.perf_counter() > deadline:
            break
    raise RuntimeError(f"only {seen} of {count} ranks came up")


def finish(proc: subprocess.Popen, timeout: float = 60) -> None:
    try:
        proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def slurmgen_cmd(
    hosts: int, workdir: Path, port: int, rank_cmd: list[str], gpus: int = 1, user: str = "root"
) -> list[str]:
    return [
        PY,
        "-m",
        "slurmgen",
        "launch",
        "--hosts",
        f"node[1-{hosts}]",
        "--gpus",
        str(gpus),
        "--ssh-config",
        str(CLUSTER / "ssh/config"),
        "--user",
        user,
        "--workdir",
        str(workdir),
        "--master-port",
        str(port),
        "--backend",
        "gloo",
        "--",
        *rank_cmd,
    ]


def pdsh_cmd(hosts: int, script: Path, gpus: int = 1, user: str = "root") -> list[str]:
    # The same process loop, node rank from the host name (nodeK -> K-1).
    remote = (
        f"cd {script.parent.parent} && NODE_RANK=$(( $(hostname | tr -dc 0-9) - 1 )) bash {script} node1 {hosts} {gpus}"
    )
    return ["pdsh", "-R", "ssh", "-l", user, "-w", f"node[1-{hosts}]", remote]


def pdsh_env() -> dict[str, str]:
    return {**os.environ, "PDSH_SSH_ARGS_APPEND": f"-F {CLUSTER / 'ssh/config'}"}


def write_script(workdir: Path, rank_cmd: list[str], nodes: int, gpus: int) -> Path:
    out = workdir / f"out-{nodes}x{gpus}"
    subprocess.run(
        [
            PY,
            "-m",
            "slurmgen",
            "create",
            "--nodes",
            str(nodes),
            "--gpus",
            str(gpus),
            "--backend",
            "gloo",
            "-o",
            str(out),
            "--force",
            "--",
            *rank_cmd,
        ],
        check=True,
        capture_output=True,
    )
    return out / "launch_multi_node.sh"


@contextlib.contextmanager
def lean_account(workdir: Path) -> Iterator[str]:
    """A throwaway login with empty rc files, removed afterwards. The cluster's sshd takes the
    cluster key for any account (AuthorizedKeysFile is one fixed file); `usermod -p '*'`
    unlocks the account for key logins (sshd refuses a locked one) without any password."""
    name = f"sgbench{os.getpid() % 100000}"
    home = workdir / "lean-home"
    subprocess.run(
        ["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/bash", name],
        check=True,
        capture_output=True,
    )
    try:
        subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)
        home.mkdir()
        for rc in (".bashrc", ".profile"):
            (home / rc).write_text("")
        shutil.chown(home, name)
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def plain_ssh(hosts: int, user: str) -> float:
    """K parallel `ssh nodeK true` (OpenSSH, one process per host), until all have ended."""
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            ["ssh", "-F", str(CLUSTER / "ssh/config"), "-l", user, f"node{i}", "true"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(1, hosts + 1)
    ]
    for proc in procs:
        proc.wait()
    return time.perf_counter() - start


def children_cpu() -> float:
    """User + system CPU seconds of every child process reaped so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


SLURMGEN, PDSH, SSH = "slurmgen launch", "pdsh + launch_multi_node.sh", "plain parallel ssh host true"
DRY = "  of which: --dry-run (no SSH)"


def bench_startup(
    hosts_list: list[int], repeat: int, workdir: Path, have_pdsh: bool, user: str
) -> tuple[dict[str, dict[int, list[float]]], dict[int, list[float]]]:
    """Start-up times per launcher and host count, and slurmgen's CPU seconds per host."""
    rank_cmd = ["bash", "-c", "echo RANK_UP; sleep 1"]
    names = [SLURMGEN, DRY, *([PDSH] if have_pdsh else []), SSH]
    samples: dict[str, dict[int, list[float]]] = {name: {h: [] for h in hosts_list} for name in names}
    cpu: dict[int, list[float]] = {h: [] for h in hosts_list}
    scripts = {h: write_script(workdir, rank_cmd, h, 1) for h in hosts_list}
    for round_ in range(repeat + 1):  # round 0 warms caches and is dropped
        for hosts in hosts_list:
            took = plain_ssh(hosts, user)
            if round_:
                samples[SSH][hosts].append(took)
            before = children_cpu()
            start = time.perf_counter()
            proc = subprocess.Popen(
                slurmgen_cmd(hosts, workdir, random.randint(21000, 28999), rank_cmd, user=user),
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            took = wait_ranks_up(proc, hosts, start)
            finish(proc)
            if proc.returncode != 0:
                raise RuntimeError(f"slurmgen launch on {hosts} hosts exited {proc.returncode}")
            if round_:
                samples[SLURMGEN][hosts].append(took)
                cpu[hosts].append(children_cpu() - before)
            # What the launcher costs before it connects: Python, imports, the plan, rendering.
            dry = slurmgen_cmd(hosts, workdir, 29500, rank_cmd, user=user)
            dry.insert(dry.index("launch") + 1, "--dry-run")
            start = time.perf_counter()
            subprocess.run(dry, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            if round_:
                samples[DRY][hosts].append(time.perf_counter() - start)
            if have_pdsh:
                start = time.perf_counter()
                proc = subprocess.Popen(
                    pdsh_cmd(hosts, scripts[hosts], user=user),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    env=pdsh_env(),
                )
                took = wait_ranks_up(proc, hosts, start)
                finish(proc)
                if round_:
                    samples[PDSH][hosts].append(took)
    return samples, cpu


CRASHER = """
import os, sys, time
marker = sys.argv[1]
if os.environ["RANK"] == os.environ["CRASH_RANK"]:
    time.sleep(float(os.environ.get("CRASH_AFTER", "3")))
    with open(os.environ["CRASH_FILE"], "w") as f:
        f.write(repr(time.time()))
    os._exit(3)
time.sleep(120)
"""


def crash_once(hosts: int, workdir: Path, tag: str) -> float:
    """Seconds from the last rank's crash to the last process of the job gone."""
    marker = f"slurmgen-bench-crash-{os.getpid()}-{tag}"
    crash_file = workdir / f"crash-{tag}"
    crash_file.unlink(missing_ok=True)
    env = {**os.environ, "CRASH_RANK": str(hosts - 1), "CRASH_FILE": str(crash_file)}
    args = ["--env", f"CRASH_RANK={hosts - 1}", "--env", f"CRASH_FILE={crash_file}"]
    cmd = slurmgen_cmd(hosts, workdir, random.randint(21000, 28999), [PY, "-c", CRASHER, marker])
    cmd[cmd.index("--") : cmd.index("--")] = args
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    while not crash_file.exists() or not crash_file.read_text():
        if proc.poll() is not None:
            raise RuntimeError(f"slurmgen launch ended early ({proc.returncode})")
        time.sleep(0.005)
    crashed = float(crash_file.read_text())
    # The ranks, and every process slurmgen put on the nodes (bootstrap, process loop).
    while job_pids(marker, "slurmgen-launch"):
        time.sleep(0.01)
    took = time.time() - crashed
    proc.wait(30)
    if proc.returncode != 3:
        raise RuntimeError(f"slurmgen launch exited {proc.returncode}, expected the crashed rank's 3")
    return took


def pdsh_crash(hosts: int, workdir: Path) -> str:
    """How many of pdsh's other ranks are still running 10 s after one crashed."""
    marker = f"slurmgen-bench-crash-pdsh-{os.getpid()}"
    crash_file = workdir / "crash-pdsh"
    script = write_script(workdir, [PY, "-c", CRASHER, marker], hosts, 1)
    env = {**pdsh_env(), "CRASH_RANK": str(hosts - 1), "CRASH_FILE": str(crash_file)}
    remote = pdsh_cmd(hosts, script)
    remote[-1] = f"export CRASH_RANK={hosts - 1} CRASH_FILE={crash_file}; " + remote[-1]
    proc = subprocess.Popen(remote, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    while not crash_file.exists() or not crash_file.read_text():
        time.sleep(0.01)
    time.sleep(10)
    left = len(job_pids(marker))
    proc.kill()
    proc.wait()
    for pid in job_pids(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    return f"pdsh: {left} rank processes of {hosts - 1} still running 10 s after the crash (not stopped)"


def row(name: str, values: list[float], unit: str = "s", ratio: bool = True) -> str:
    cells = "".join(f"{'-':>12}" if v != v else f"{v:{12 - len(unit)}.2f}{unit}" for v in values)
    return f"{name:32}" + cells + (f"{values[-1] / values[0]:11.2f}x" if ratio else "")


def report(
    startup: dict[str, dict[int, list[float]]],
    cpu: dict[int, list[float]],
    crash: dict[int, list[float]],
    hosts_list: list[int],
    repeat: int,
) -> str:
    med = {name: [statistics.median(per[h]) for h in hosts_list] for name, per in startup.items()}
    cpu_med = [statistics.median(cpu[h]) * 1000 for h in hosts_list]
    # CPU of each host beyond the first: what grows with the host count (flat = per host constant).
    extra = [
        (c - cpu_med[0]) / (h - hosts_list[0]) if h > hosts_list[0] else float("nan")
        for h, c in zip(hosts_list, cpu_med)
    ]
    crash_med = [statistics.median(crash[h]) for h in hosts_list]
    last = f"{hosts_list[-1]}/{hosts_list[0]}"
    lines = [
        f"start-up to all ranks running (median of {repeat}; one rank per host)",
        f"{'':32}" + "".join(f"{str(h) + ' host(s)':>12}" for h in hosts_list) + f"{last:>12}",
    ]
    lines += [row(name, values) for name, values in med.items()]
    lines.append(row("slurmgen launch / plain ssh", [s / f for s, f in zip(med[SLURMGEN], med[SSH])], "x"))
    lines.append(row("launcher CPU, total", cpu_med, "ms"))
    lines.append(row("launcher CPU per extra host", extra, "ms", ratio=False))
    lines.append(row("crash to all gone", crash_med))
    growth, ssh_growth = med[SLURMGEN][-1] / med[SLURMGEN][0], med[SSH][-1] / med[SSH][0]
    lines += [
        "",
        "goals:",
        f"  start-up growth {last}: slurmgen {growth:.2f}x vs plain ssh {ssh_growth:.2f}x: "
        + ("met" if growth < ssh_growth else f"MISSED by {growth / ssh_growth:.2f}x"),
    ]
    if PDSH in med:
        worse = [h for h, s, p in zip(hosts_list, med[SLURMGEN], med[PDSH]) if s >= p]
        lines.append("  faster than pdsh at every size: " + ("met" if not worse else f"MISSED at {worse} hosts"))
    lines.append(
        f"  crash to all gone at {hosts_list[-1]} hosts <= 2 s: {crash_med[-1]:.2f}s "
        + ("met" if crash_med[-1] <= 2 else "MISSED")
    )
    if len(hosts_list) > 2:
        lines.append(
            f"  launcher CPU per extra host: {extra[1]:.1f} ms up to {hosts_list[1]} hosts, "
            f"{extra[-1]:.1f} ms up to {hosts_list[-1]} (flat: no per-host cost that grows with the count)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hosts", default="1,8,16,32")
    parser.add_argument("--reuse", action="store_true", help="use the cluster already up (enough nodes)")
    parser.add_argument("--wait", type=float, default=1800, help="seconds to wait for a busy cluster")
    args = parser.parse_args()
    hosts_list = [int(h) for h in args.hosts.split(",")]
    have_pdsh = shutil.which("pdsh") is not None
    if not have_pdsh:
        print("pdsh not found (Debian package pdsh; scripts/setup.sh --test installs it): slurmgen alone")
    if not args.reuse:
        up(max(hosts_list), args.wait)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
            top = Path(tmp)
            top.chmod(0o755)  # the lean account reaches its own directory through it
            workdir = top / "lean"
            workdir.mkdir()
            with lean_account(top) as lean:
                shutil.chown(workdir, lean)
                startup, cpu = bench_startup(hosts_list, args.repeat, workdir, have_pdsh, user=lean)
            as_root = top / "root"
            as_root.mkdir()
            crash = {h: [crash_once(h, as_root, f"{h}-{i}") for i in range(args.repeat)] for h in hosts_list}
            pdsh_note = pdsh_crash(max(hosts_list), as_root) if have_pdsh else "pdsh not installed"
    finally:
        if not args.reuse:
            down()
    print(report(startup, cpu, crash, hosts_list, args.repeat))
    print(pdsh_note)


if __name__ == "__main__":
    main()
