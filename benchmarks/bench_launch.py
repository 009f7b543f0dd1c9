"""`slurmgen launch` beside pdsh on the test cluster: start-up fan-out and crash-to-all-gone.

    sudo python benchmarks/bench_launch.py [--repeat 5] [--hosts 1,2,4,8] [--reuse]

Brings up scripts/cluster/up.sh 8 (root; each node a network namespace with its own sshd)
unless --reuse, and tears it down at the end.

1. Time from command start to all ranks running, for 1, 2, 4 and 8 hosts (one rank each):
   - slurmgen launch --hosts node[1-K] -- bash -c 'echo RANK_UP; sleep 1'
   - pdsh -R ssh -w node[1-K] running the same per-node command: the same process loop
     (launch_multi_node.sh written by `slurmgen create`, on the shared disk) with the same
     rank command, node rank from the host name.
   "Running" = the rank's RANK_UP line has reached the launching command's output. Commands
   alternate round by round; medians are printed. Target: 8 hosts <= 1.3 x one host.
   Floor: K parallel `ssh nodeK echo RANK_UP` (OpenSSH): what the simulated hosts themselves
   cost per session (sshd, the login shell and its rc files). All hosts share this machine's
   cores, so that cost adds up with K here where a real cluster pays it once, in parallel;
   "slurmgen launch minus floor" is the launcher's own share.
   Each is measured twice, logged in as two accounts:
   - root, whose ~/.bashrc here runs `pyenv init` (about 0.13 s of CPU in every SSH
     session: Debian's bash reads ~/.bashrc for commands run by sshd);
   - a lean account made for the benchmark (empty rc files; removed at the end): a host
     whose login costs little, so what grows with K is SSH and the launcher.
2. Time from a rank's crash (its own timestamp, taken just before it exits 3) to the last
   process of the job gone from every node, ranks and slurmgen's own (a /proc scan every
   10 ms; the nodes are namespaces of this machine), 8 hosts x 2 ranks, as root.
   Target: <= 2 s. pdsh does not stop the other nodes: shown as how many are still alive
   after 10 s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
CLUSTER = Path(os.environ.get("SLURMGEN_CLUSTER_DIR", "/tmp/slurmgen-cluster"))
PY = sys.executable


def up(nodes: int) -> None:
    env = {**os.environ, "SLURMGEN_CLUSTER_OWNER": str(os.getpid())}
    proc = subprocess.run(["bash", str(REPO / "scripts/cluster/up.sh"), str(nodes)], env=env, capture_output=True,
                          text=True)
    if proc.returncode == 4:
        sys.exit(f"the test cluster is busy (another test run owns it): {proc.stderr.strip()}")
    if proc.returncode != 0:
        sys.exit(f"scripts/cluster/up.sh {nodes} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def down() -> None:
    subprocess.run(["bash", str(REPO / "scripts/cluster/down.sh")], capture_output=True)


def job_pids(*markers: str) -> list[int]:
    """Processes whose command line holds one of `markers` (every node shares this /proc)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if any(m.encode() in cmdline for m in markers):
            found.append(int(entry.name))
    return [p for p in found if p != os.getpid()]


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


def slurmgen_cmd(hosts: int, workdir: Path, port: int, rank_cmd: list[str], gpus: int = 1,
                 user: str = "root") -> list[str]:
    return [PY, "-m", "slurmgen", "launch", "--hosts", f"node[1-{hosts}]", "--gpus", str(gpus),
            "--ssh-config", str(CLUSTER / "ssh/config"), "--user", user, "--workdir", str(workdir),
            "--master-port", str(port), "--backend", "gloo", "--", *rank_cmd]


def pdsh_cmd(hosts: int, script: Path, gpus: int = 1, user: str = "root") -> list[str]:
    # The same process loop, node rank from the host name (nodeK -> K-1).
    remote = (f"cd {script.parent.parent} && NODE_RANK=$(( $(hostname | tr -dc 0-9) - 1 )) "
              f"bash {script} node1 {hosts} {gpus}")
    return ["pdsh", "-R", "ssh", "-l", user, "-w", f"node[1-{hosts}]", remote]


def pdsh_env() -> dict[str, str]:
    return {**os.environ, "PDSH_SSH_ARGS_APPEND": f"-F {CLUSTER / 'ssh/config'}"}


def write_script(workdir: Path, rank_cmd: list[str], nodes: int, gpus: int) -> Path:
    out = workdir / f"out-{nodes}x{gpus}"
    subprocess.run([PY, "-m", "slurmgen", "create", "--nodes", str(nodes), "--gpus", str(gpus), "--backend", "gloo",
                    "-o", str(out), "--force", "--", *rank_cmd], check=True, capture_output=True)
    return out / "launch_multi_node.sh"


@contextlib.contextmanager
def lean_account(workdir: Path) -> Iterator[str]:
    """A throwaway login with empty rc files, removed afterwards. The cluster's sshd takes the
    cluster key for any account (AuthorizedKeysFile is one fixed file); `usermod -p '*'`
    unlocks the account for key logins (sshd refuses a locked one) without any password."""
    name = f"sgbench{os.getpid() % 100000}"
    home = workdir / "lean-home"
    subprocess.run(["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/bash", name],
                   check=True, capture_output=True)
    try:
        subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)
        home.mkdir()
        for rc in (".bashrc", ".profile"):
            (home / rc).write_text("")
        shutil.chown(home, name)
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def ssh_floor(hosts: int, user: str = "root") -> float:
    """K parallel `ssh nodeK echo RANK_UP` (OpenSSH, one process per host): what the simulated
    hosts themselves cost per session (sshd, the login shell and its rc files), all sharing
    this machine's cores; on a real cluster every host has its own."""
    start = time.perf_counter()
    procs = [subprocess.Popen(["ssh", "-F", str(CLUSTER / "ssh/config"), "-l", user, f"node{i}", "echo RANK_UP"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for i in range(1, hosts + 1)]
    for proc in procs:
        proc.communicate()
    return time.perf_counter() - start


def bench_startup(hosts_list: list[int], repeat: int, workdir: Path, have_pdsh: bool,
                  user: str = "root") -> dict[str, dict[int, list[float]]]:
    """Start-up times per launcher and host count, logged in as `user` (workdir is theirs)."""
    rank_cmd = ["bash", "-c", "echo RANK_UP; sleep 1"]
    samples: dict[str, dict[int, list[float]]] = {"slurmgen launch": {h: [] for h in hosts_list}}
    if have_pdsh:
        samples["pdsh + launch_multi_node.sh"] = {h: [] for h in hosts_list}
    samples["floor: K x ssh host echo"] = {h: [] for h in hosts_list}
    scripts = {h: write_script(workdir, rank_cmd, h, 1) for h in hosts_list}
    for round_ in range(repeat + 1):  # round 0 warms caches and is dropped
        for hosts in hosts_list:
            took = ssh_floor(hosts, user)
            if round_:
                samples["floor: K x ssh host echo"][hosts].append(took)
            start = time.perf_counter()
            proc = subprocess.Popen(slurmgen_cmd(hosts, workdir, random.randint(21000, 28999), rank_cmd, user=user),
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            took = wait_ranks_up(proc, hosts, start)
            finish(proc)
            if proc.returncode != 0:
                raise RuntimeError(f"slurmgen launch on {hosts} hosts exited {proc.returncode}")
            if round_:
                samples["slurmgen launch"][hosts].append(took)
            if have_pdsh:
                start = time.perf_counter()
                proc = subprocess.Popen(pdsh_cmd(hosts, scripts[hosts], user=user), stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True, env=pdsh_env())
                took = wait_ranks_up(proc, hosts, start)
                finish(proc)
                if round_:
                    samples["pdsh + launch_multi_node.sh"][hosts].append(took)
    return samples


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


def bench_crash(hosts: int, gpus: int, repeat: int, workdir: Path, have_pdsh: bool) -> tuple[list[float], str]:
    results = []
    for i in range(repeat):
        marker = f"slurmgen-bench-crash-{os.getpid()}-{i}"
        crash_file = workdir / f"crash-{i}"
        crash_file.unlink(missing_ok=True)
        env = {**os.environ, "CRASH_RANK": str(hosts * gpus - 1), "CRASH_FILE": str(crash_file)}
        args = ["--env", f"CRASH_RANK={hosts * gpus - 1}", "--env", f"CRASH_FILE={crash_file}"]
        cmd = slurmgen_cmd(hosts, workdir, random.randint(21000, 28999), [PY, "-c", CRASHER, marker], gpus)
        cmd[cmd.index("--"):cmd.index("--")] = args
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        while not crash_file.exists() or not crash_file.read_text():
            if proc.poll() is not None:
                raise RuntimeError(f"slurmgen launch ended early ({proc.returncode})")
            time.sleep(0.005)
        crashed = float(crash_file.read_text())
        # The ranks, and every process slurmgen put on the nodes (bootstrap, process loop).
        while job_pids(marker, "slurmgen-launch"):
            time.sleep(0.01)
        results.append(time.time() - crashed)
        proc.wait(30)
        if proc.returncode != 3:
            raise RuntimeError(f"slurmgen launch exited {proc.returncode}, expected the crashed rank's 3")
    pdsh_note = "pdsh not installed"
    if have_pdsh:
        marker = f"slurmgen-bench-crash-pdsh-{os.getpid()}"
        crash_file = workdir / "crash-pdsh"
        script = write_script(workdir, [PY, "-c", CRASHER, marker], hosts, gpus)
        env = {**pdsh_env(), "CRASH_RANK": str(hosts * gpus - 1), "CRASH_FILE": str(crash_file)}
        remote = pdsh_cmd(hosts, script, gpus)
        remote[-1] = f"export CRASH_RANK={hosts * gpus - 1} CRASH_FILE={crash_file}; " + remote[-1]
        proc = subprocess.Popen(remote, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        while not crash_file.exists() or not crash_file.read_text():
            time.sleep(0.01)
        time.sleep(10)
        left = len(job_pids(marker))
        pdsh_note = f"pdsh: {left} rank processes of {hosts * gpus - 1} still running 10 s after the crash (not stopped)"
        proc.kill()
        proc.wait()
        for pid in job_pids(marker):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
    return results, pdsh_note


def print_startup(title: str, startup: dict[str, dict[int, list[float]]], hosts_list: list[int]) -> None:
    print(title)
    print(f"{'launcher':30}" + "".join(f"{str(h) + ' host(s)':>12}" for h in hosts_list) + f"{'max/1 host':>12}")
    medians = {name: [statistics.median(per_hosts[h]) for h in hosts_list] for name, per_hosts in startup.items()}
    for name, values in medians.items():
        print(f"{name:30}" + "".join(f"{m:11.2f}s" for m in values) + f"{values[-1] / values[0]:11.2f}x")
    floor = medians["floor: K x ssh host echo"]
    print(f"{'slurmgen launch minus floor':30}" + "".join(
        f"{s - f:11.2f}s" for s, f in zip(medians["slurmgen launch"], floor)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--hosts", default="1,2,4,8")
    parser.add_argument("--reuse", action="store_true", help="use the cluster already up (8 nodes)")
    args = parser.parse_args()
    hosts_list = [int(h) for h in args.hosts.split(",")]
    have_pdsh = shutil.which("pdsh") is not None
    if not have_pdsh:
        print("pdsh not found (Debian package pdsh; scripts/setup.sh --test installs it): slurmgen alone")
    if not args.reuse:
        up(max(hosts_list))
    try:
        with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
            top = Path(tmp)
            top.chmod(0o755)  # the lean account reaches its own directory through it
            as_root, as_lean = top / "root", top / "lean"
            as_root.mkdir()
            as_lean.mkdir()
            startup_root = bench_startup(hosts_list, args.repeat, as_root, have_pdsh)
            with lean_account(top) as lean:
                shutil.chown(as_lean, lean)
                startup_lean = bench_startup(hosts_list, args.repeat, as_lean, have_pdsh, user=lean)
            crash, pdsh_note = bench_crash(max(hosts_list), 2, max(3, args.repeat), as_root, have_pdsh)
    finally:
        if not args.reuse:
            down()
    what = f"time from command start to all ranks running (median of {args.repeat}, one rank per host)"
    print_startup(f"{what}, as root (~/.bashrc runs pyenv init):", startup_root, hosts_list)
    print()
    print_startup(f"{what}, as a lean account (empty rc files):", startup_lean, hosts_list)
    print()
    print(f"crash to all processes gone, {max(hosts_list)} hosts x 2 ranks (slurmgen launch): "
          f"median {statistics.median(crash):.2f}s, max {max(crash):.2f}s over {len(crash)} runs")
    print(pdsh_note)


if __name__ == "__main__":
    main()
