"""A launch's log on this machine (launch/registry_entry.py), which its run page follows: every line the
nodes sent, a rank's lines labelled with its rank, a line between attempts, private to its owner;
the page's log reader and `slurmgen logs LAUNCH_ID` split it by rank like a Slurm job's."""

from __future__ import annotations

import stat
import textwrap

import pytest
from helpers import PY, local_plan, recorded_launch
from helpers import run as run_cli

from slurmgen.runs.model import find_by_ref
from slurmgen.runs.registry import Registry

# Each rank says hello per attempt; rank 1 fails the first one once both have said it.
HELLO = textwrap.dedent("""
    import os, sys, time
    print(f"hello from {os.environ['RANK']} in attempt {os.environ['SLURMGEN_ATTEMPT']}", flush=True)
    if os.environ["RANK"] == "1" and os.environ["SLURMGEN_ATTEMPT"] == "1":
        time.sleep(1)
        sys.exit(3)
""")


def test_a_launch_keeps_its_nodes_lines_for_its_page_split_by_rank_and_attempt(tmp_path, capsys):
    path = tmp_path / "state" / "jobs.sqlite"
    plan = local_plan(tmp_path, [PY, "-c", HELLO], slots=(1, 1), max_restarts=1)
    plan.env.update({"SLURMGEN_LAUNCH_ID": "L7", "SLURMGEN_GROUP": "launch-L7"})
    code, launcher = recorded_launch(path, plan, HELLO)
    assert code == 0, launcher.err.getvalue()
    with Registry.open(path) as reg:
        row = find_by_ref(reg, "L7")
    log = tmp_path / "state" / "launch-logs" / "launch-L7.log"
    assert row is not None and row["info"]["log_file"] == str(log)
    assert stat.S_IMODE(log.stat().st_mode) == 0o600 and stat.S_IMODE(log.parent.stat().st_mode) == 0o700
    lines = log.read_text().splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith("slurmgen: ----- attempt")]
    assert [lines[i] for i in marks] == ["slurmgen: ----- attempt 1 -----", "slurmgen: ----- attempt 2 -----"]
    first, second = lines[marks[0] : marks[1]], lines[marks[1] :]
    assert {"0: hello from 0 in attempt 1", "1: hello from 1 in attempt 1"} <= set(first), first
    assert {"0: hello from 0 in attempt 2", "1: hello from 1 in attempt 2"} <= set(second), second

    pytest.importorskip("fastapi")
    from slurmgen.coordinator.web.run_logs import BadTask, read_lines

    rank1 = read_lines(path, row["seq"], 0, 1)
    assert [(x["rank"], x["text"]) for x in rank1["lines"]] == [
        (1, "hello from 1 in attempt 1"),
        (1, "hello from 1 in attempt 2"),
    ]
    rows = read_lines(path, row["seq"], 0, None)["lines"]
    every = [x["text"] for x in rows]
    assert "slurmgen: ----- attempt 2 -----" in every and every.index("hello from 0 in attempt 2") > every.index(
        "slurmgen: ----- attempt 2 -----"
    )
    shown = {(x["worker"], x["text"].split(" ")[0]) for x in rows if x["rank"] is None}
    assert {("launch", "slurmgen:"), ("h0", "node"), ("h1", "node")} <= shown, shown  # "[h1] node 1/2 started ..."
    with pytest.raises(BadTask, match="not an array job"):
        read_lines(path, row["seq"], 0, None, task=1)

    code, out, err = run_cli(capsys, "logs", "L7", "--registry", str(path), "--rank", "1")
    assert (code, out) == (0, "[rank 1] hello from 1 in attempt 1\n[rank 1] hello from 1 in attempt 2\n"), err
    code, out, err = run_cli(capsys, "logs", "L7", "--registry", str(path), "--rank", "0", "--tail", "1", "--json")
    assert code == 0 and out == '{"rank": 0, "task": 0, "line": "hello from 0 in attempt 2"}\n', err
    code, out, err = run_cli(capsys, "logs", "L7", "--registry", str(path), "--rank", "0", "--follow")
    assert code == 0 and out.count("hello from 0") == 2, err  # the launch has ended: all, then done
    code, out, err = run_cli(capsys, "logs", "L7", "--registry", str(path), "--rank", "2")
    assert code == 2 and err.strip().endswith("rank: launch L7 has ranks 0-1 (got 2)"), err


# Rank 0 prints 200 lines of 100 bytes (about 20 KB with its label).
CHATTY = "import sys\nfor i in range(200):\n    print(f'{i:04d} ' + 'x' * 95, flush=True)\n"


def test_the_launch_log_stops_at_its_limit_with_a_line_naming_the_whole_logs_and_the_row_still_ends(tmp_path):
    path = tmp_path / "state" / "jobs.sqlite"
    plan = local_plan(tmp_path, [PY, "-c", CHATTY], slots=(1,))
    plan.env.update({"SLURMGEN_LAUNCH_ID": "L8", "SLURMGEN_GROUP": "launch-L8"})
    code, launcher = recorded_launch(path, plan, CHATTY, log_limit=4096)
    assert code == 0, launcher.err.getvalue()
    text = (tmp_path / "state" / "launch-logs" / "launch-L8.log").read_text()
    *kept, last = text.splitlines()
    assert last == (
        "slurmgen: ----- this log stops here, at its limit; each node keeps its ranks' whole logs in "
        f"{tmp_path / 'out' / 'logs'} -----"
    )
    assert len("\n".join(kept).encode()) <= 4096 and kept[-1].startswith("0: 00"), kept[-3:]
    assert len((tmp_path / "out" / "logs" / "rank-0.log").read_text().splitlines()) == 201  # "=====" and all
    with Registry.open(path) as reg:
        row = find_by_ref(reg, "L8")
    assert row is not None and row["state"] == "succeeded"
