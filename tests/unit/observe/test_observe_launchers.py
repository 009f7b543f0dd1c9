"""The timeline of a run that is not a Slurm job (issue 23): `slurmgen launch` on local 'hosts'
(the real bootstrap and launch_multi_node.sh, no SSH) of a program patched with two lines of
`slurmgen.beat`, restarted once after a failure; its registry row names the timeline file and
keeps the stragglers and goodput, and `slurmgen status LAUNCH_ID --timeline --json` finds it
(`slurmgen status FILE --timeline` reads the file itself, as for launch_multi_node.sh by hand)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from helpers import PY, local_plan, recorded_launch
from helpers import run as run_cli

from slurmgen.launch.remote import timeline_file
from slurmgen.observe import stragglers
from slurmgen.runs.model import find_by_ref
from slurmgen.runs.registry import Registry

# No torch: the imports are inferred from `from slurmgen import beat`; rank 1 of attempt 1 fails.
TWO_LINES = textwrap.dedent("""
    import os, sys, time
    from slurmgen import beat
    for step in range(1, 31):
        time.sleep(0.03 if os.environ["RANK"] == "1" else 0.002)
        beat(step=step, loss=1.0 / step)
        if step == 10 and os.environ["RANK"] == "1" and os.environ["SLURMGEN_ATTEMPT"] == "1":
            sys.exit(7)
""")


def test_a_restarted_launch_has_each_attempts_timeline_with_the_launchers_phases_found_by_its_id(tmp_path, capsys):
    path = tmp_path / "jobs.sqlite"
    plan = local_plan(tmp_path, [PY, "-c", TWO_LINES], slots=(1, 1), max_restarts=1)
    tl = timeline_file(str(tmp_path), plan.log_dir, "L1")
    plan.env.update({"SLURMGEN_LAUNCH_ID": "L1", "SLURMGEN_GROUP": "launch-L1", "SLURMGEN_TIMELINE_FILE": tl})
    code, launcher = recorded_launch(path, plan, TWO_LINES)
    assert code == 0, launcher.err.getvalue()

    code, out, err = run_cli(capsys, "status", "--registry", str(path), "L1", "--timeline", "--json")
    assert code == 0, err
    found = json.loads(out)
    first, second = found["attempts"]
    assert (first["attempt"], second["attempt"]) == (1, 2) and first["end"] is not None, found
    # A launch waits in no queue: the launcher's start-up before its first attempt is not one.
    assert first["queued"] is None and found["goodput"]["queue"] is None, (first, found["goodput"])
    assert [r["status"] for r in first["ranks"] if r["rank"] == 1] == ["failed"], first
    code, out, err = run_cli(capsys, "status", tl, "--timeline", "--json")  # the file alone, as by hand

    def ranks(view):  # the ranks' own words (the registry adds each attempt's bounds)
        return [[(r["rank"], r["status"], r["last_step"]) for r in a["ranks"]] for a in view["attempts"]]

    assert code == 0 and ranks(json.loads(out)) == ranks(found), out + err
    code, out, err = run_cli(capsys, "status", tl, "--timeline")
    assert code == 0 and out.startswith("attempt 1") and "slowest" in out, out + err
    said = [json.loads(x) for x in Path(tl).read_text().splitlines()]
    assert {
        (x["attempt"], x["rank"], x["code"]) for x in said if x.get("by") == "launcher" and x["event"] == "end"
    } >= {(1, 1, 7), (2, 0, 0), (2, 1, 0)}, said  # the launcher saw each exit, with its code
    for r in second["ranks"]:
        assert None not in (r["process"], r["imports"], r["first_step"], r["end"]), r
        assert r["process"] <= r["imports"] <= r["first_step"] <= r["end"] and r["status"] == "done", r
        assert r["last_step"] == 30, r
    assert set(second["slowest"]) == {"process", "imports", "first_step", "end"}, second  # no torch: no rendezvous
    assert second["slowest"]["end"]["rank"] == 1, second["slowest"]
    assert [s["rank"] for s in found["stragglers"] if s["attempt"] == 2] == [1], found["stragglers"]
    lost = found["goodput"]["lost_steps"]
    # No checkpoint: every step of attempt 1 was done again (rank 0 had reached step 30).
    assert [(x["attempt"], x["from_step"], x["to_step"]) for x in lost] == [(1, 0, 30)], found["goodput"]

    with Registry.open(path) as reg:  # the run record keeps them once the file is gone
        row = find_by_ref(reg, "launch-L1")
        assert row is not None and row["info"]["timeline"] == tl
        assert row["info"]["goodput"]["goodput"] > 0 and "stragglers" in row["info"], row["info"]
    code, out, err = run_cli(capsys, "status", "--registry", str(path), "L1")
    assert code == 0 and out.startswith("launch L1 (exp): succeeded, exit code 0, 2x1, 2 attempt(s)"), out + err
    assert "goodput " in out, out
    # The run's page draws the same report: a timeline per attempt, the straggler, goodput.
    from slurmgen.coordinator.web.run_detail import read_run

    page = read_run(path, row["seq"])
    assert page is not None and page["time"] is not None, page
    assert [c["attempt"] for c in page["time"]["charts"]] == [1, 2] and page["time"]["goodput"], page["time"]
    assert any(r["flag"] for r in page["time"]["charts"][1]["rows"]), page["time"]["charts"][1]  # rank 1 straggled


def test_an_unknown_run_id_is_still_one_line_about_the_job(tmp_path, capsys):
    Registry.open(tmp_path / "jobs.sqlite", create=True).close()
    code, out, err = run_cli(capsys, "status", "--registry", str(tmp_path / "jobs.sqlite"), "nosuchrun")
    assert code == 2 and "no registered job has the id, name or output dir 'nosuchrun'" in err, err


def test_the_trainers_straggler_is_the_pages_rule_over_its_windows():
    """Issue 33, item 4: the trainer logged "straggler: rank 1 1.56x" for single windows the page
    did not flag. One rule now: slow against the others' median for MIN_STEPS steps in a row."""
    spells = stragglers.Spells()
    slow = [0.01, 0.05, 0.011, 0.012]
    assert spells.update(slow, 10) is None  # 10 slow steps: not yet a straggler
    assert spells.update(slow, 10) == {"rank": 1, "ratio": 4.55, "steps": 20}
    assert spells.update([0.01, 0.012, 0.011, 0.01], 10) is None  # it recovered: the spell ends
    assert spells.update(slow, 10) is None  # ...and a new one starts from 0
    assert stragglers.Spells().update([0.01], 100) is None and stragglers.Spells().update([0.0, 0.0], 100) is None
    # the page's find() over the same windows names the same rank
    per_rank = {r: [(1, 20, w)] for r, w in enumerate(slow)}
    assert [(s["rank"], s["steps"]) for s in stragglers.find(per_rank)] == [(1, 20)]


def test_a_two_rank_world_never_flags_both_ranks():
    """Against the other rank only the slower can be slow; over an attempt where each was slower
    for a while, the longer spell is the one named (a tie: neither)."""
    assert stragglers.slow_ranks({0: 0.01, 1: 0.016}) == {1: pytest.approx(1.6)}
    assert stragglers.slow_ranks({0: 0.01, 1: 0.014}) == {}
    per_rank = {0: [(1, 30, 0.03), (31, 60, 0.01)], 1: [(1, 30, 0.01), (31, 60, 0.03)]}
    assert stragglers.find(per_rank) == []  # 30 steps each: no majority says which is normal
    per_rank[0].append((61, 80, 0.01))
    per_rank[1].append((61, 80, 0.03))
    assert [(s["rank"], s["steps"]) for s in stragglers.find(per_rank)] == [(1, 50)]
    spells = stragglers.Spells()
    assert [spells.update(w, 20) for w in ([0.03, 0.01], [0.01, 0.03])] == [
        {"rank": 0, "ratio": 3.0, "steps": 20},
        {"rank": 1, "ratio": 3.0, "steps": 20},
    ]  # one at a time, never both in one line
