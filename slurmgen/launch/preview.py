"""`slurmgen launch --dry-run`: per host exactly what would run, connecting to nothing.

Apart from fanout.py so that a dry run imports neither paramiko (the targets come from the ssh
config alone: ssh/sshconfig.py) nor the run registry: it prints in a fraction of a real
launch's start-up.
"""

from __future__ import annotations

from slurmgen.contract.node_events import KEEPALIVE_INTERVAL
from slurmgen.launch.plan import LaunchPlan
from slurmgen.launch.remote import bootstrap, env_text, remote_command
from slurmgen.ssh.sshconfig import describe_targets
from slurmgen.ssh.target import SSHOptions


def dry_run_text(plan: LaunchPlan, opts: SSHOptions, keepalive: float = KEEPALIVE_INTERVAL) -> str:
    """Per host exactly what would run: the SSH target, the command line, the environment
    sent on stdin (secret-looking values hidden), then the bootstrap and node script."""
    targets = describe_targets([n.host for n in plan.nodes], opts)
    lines = [
        f"# slurmgen launch --dry-run: {len(plan.nodes)} node(s), {plan.world_size} rank(s), "
        f"master {plan.master_addr}:{plan.master_port}, working directory {plan.workdir}",
        "# Each host runs the command line below over SSH; its stdin then carries the bootstrap,",
        "# the node script and the environment shown, and stays open as the node's lifeline",
        f"# (a keepalive line every {keepalive:g}s; silence=S: a node that hears none for S seconds stops).",
        "",
    ]
    for node in plan.nodes:
        lines += [
            f"# ===== {node.host} ({targets[node.host]}): node rank {node.node_rank}, ranks {node.ranks} =====",
            remote_command(plan, node, 1, keepalive),
            "# environment (on stdin):",
        ]
        lines += _bind_lines(plan, node.nproc)
        env = env_text(plan.node_env(node), show_secrets=False).rstrip("\n")
        lines += [env] if env else ["# (none beyond the node script's own)"]
        lines.append("")
    boot = bootstrap()
    lines += [
        f"# ===== bootstrap (on stdin, {len(boot.encode())} bytes) =====",
        boot.rstrip("\n"),
        "",
        f"# ===== launch_multi_node.sh (on stdin, {len(plan.script.encode())} bytes) =====",
        plan.script.rstrip("\n"),
    ]
    return "\n".join(lines) + "\n"


def _bind_lines(plan: LaunchPlan, nproc: int) -> list[str]:
    """Which CPUs each rank would get under the spec's bind: the host decides from its own
    topology when it starts (generate/binding.py is the same rule), shown for one like this machine."""
    from slurmgen.generate.binding import cpu_list, plan_here

    if plan.bind == "none":
        return []
    planned = plan_here(nproc, plan.bind)
    head = f"# bind {plan.bind}: the host plans each rank's CPUs from its own lscpu -p when it starts"
    if isinstance(planned, str):
        return [f"{head}; on a host like this machine: {planned}"]
    each = ", ".join(f"local rank {r} CPUs {cpu_list(cpus)}" for r, cpus in enumerate(planned))
    return [f"{head}; on a host like this machine: {each}"]
