"""The link between the launchers of one job: launch_multi_node.sh started on every node stops
as one.

Each node's launcher runs a small agent (`agent.py`, standard library only) beside its ranks.
The master node's agent listens on the master address, one port beside MASTER_PORT; the
others connect to it. A rank that fails, a launcher that gets Ctrl-C, dies or is killed, a
node that never shows up: the master hears of it first and tells every node, whose launcher
then stops its ranks and exits naming the node and rank that failed first.

The agent is embedded in the generated script (`source()`), so the nodes need only bash and
a Python 3.8 or newer, not slurmgen: the job's own program may be anything that follows the
torchrun environment contract.
"""

from pathlib import Path

# The line that ends the agent's heredoc in launch_multi_node.sh; the agent never contains it.
HEREDOC_END = "SLURMGEN_LINK_AGENT"


def source() -> str:
    """The agent's source text, as it is embedded in the generated script (read beside this
    file: importlib.resources would cost every `create` ~2 ms of imports for the same bytes)."""
    text = Path(__file__).with_name("agent.py").read_text(encoding="utf-8")
    if HEREDOC_END in text.splitlines():
        raise RuntimeError(f"agent.py holds the heredoc terminator line {HEREDOC_END}")
    return text
