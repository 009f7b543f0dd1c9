"""Chains (`submit --chain K`, issue 36): the sbatch calls that make one (stand-in `sbatch`,
`scontrol`, `scancel` on PATH, each keeping its arguments), bad input refused before anything is
submitted, `status` and `cancel` of a chain; and the rendered script's chain logic run for real
with bash (a finished link cancels the rest, a link failing beyond a retry stops the chain, a
link after the end does nothing, a sweep's chain ends per task)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import run, write

from slurmgen.contract import exitcodes
from slurmgen.contract.files import ATTEMPTS_NAME, CHAIN_ENDED_NAME, CHAIN_JOBS_NAME
from slurmgen.runs.registry import Registry

# sbatch hands out 101, 102, ...; scontrol answers `show job -o ID` from state-ID (PENDING
# unless written) and keeps every other call; scancel marks its jobs CANCELLED.
SBATCH = """#!/bin/bash
echo "$*" >>"$CALLS/sbatch"
n=$(cat "$CALLS/next" 2>/dev/null || echo 101)
echo $((n + 1)) >"$CALLS/next"
if [[ -n ${REFUSE:-} && $n == "$REFUSE" ]]; then echo "sbatch: error: Batch job submission failed" >&2; exit 1; fi
echo "$n"
"""
SCONTROL = """#!/bin/bash
if [[ $1 == show ]]; then
  id=$4
  state=$(cat "$CALLS/state-$id" 2>/dev/null || echo PENDING)
  echo "JobId=$id JobName=long UserId=u(1) JobState=$state Reason=None Requeue=0 Restarts=0 ExitCode=0:0 \
TimeLimit=00:10:00 SubmitTime=2026-11-23T12:25:42 NodeList=(null) NumNodes=1"
  exit 0
fi
echo "$*" >>"$CALLS/scontrol"
"""
SCANCEL = """#!/bin/bash
echo "$*" >>"$CALLS/scancel"
for id in "$@"; do echo CANCELLED >"$CALLS/state-$id"; done
"""


@pytest.fixture
def calls(tmp_path: Path, monkeypatch) -> Path:
    bin_dir, kept = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    kept.mkdir()
    for name, body in (
        ("sbatch", SBATCH),
        ("scontrol", SCONTROL),
        ("scancel", SCANCEL),
        ("sacct", "#!/bin/sh\nexit 1\n"),
    ):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(kept))
    monkeypatch.chdir(tmp_path)
    return kept


def said(kept: Path, name: str) -> list[str]:
    path = kept / name
    return path.read_text().splitlines() if path.exists() else []


def submit(capsys, *flags: str) -> tuple[int, str, str]:
    return run(capsys, "submit", "--registry", "r.sqlite", "-o", "out", *flags, "--", "python", "train.py")


def test_a_chain_is_k_links_each_after_the_one_before(calls, capsys, tmp_path):
    code, out, err = submit(capsys, "--chain", "3", "-t", "10")
    assert (code, out) == (0, "101\n"), err
    assert "chain 101: links 101 102 103" in err
    first, second, third = said(calls, "sbatch")
    assert first.split() == ["--parsable", "--hold", "out/run_slurm.sh"]
    assert second.split() == [
        "--parsable",
        "--dependency=afterany:101",
        "--export=ALL,SLURMGEN_CHAIN=101",
        "out/run_slurm.sh",
    ]
    assert third.split()[1:3] == ["--dependency=afterany:102", "--export=ALL,SLURMGEN_CHAIN=101"]
    # the links' ids are where the links read them before the first one is released
    assert (tmp_path / "out" / "logs" / CHAIN_JOBS_NAME.format(job_id="101")).read_text() == "101\n102\n103\n"
    assert said(calls, "scontrol") == ["release 101"]
    with Registry.open(tmp_path / "r.sqlite") as reg:
        links = [reg.get(job).info["chain"] for job in ("101", "102", "103")]
    assert [c["link"] for c in links] == [1, 2, 3] and all(c["links"] == ["101", "102", "103"] for c in links)
    script = (tmp_path / "out" / "run_slurm.sh").read_text()
    assert "#SBATCH --signal=USR2@120\n" in script and "export SLURMGEN_REQUEUE=0\n" in script


def test_a_held_chain_stays_held_and_a_dependency_holds_its_first_link(calls, capsys):
    code, _, err = submit(capsys, "--chain", "2", "-t", "10", "--hold", "-d", "afterok:7")
    assert code == 0, err
    assert said(calls, "sbatch")[0].split() == ["--parsable", "--dependency=afterok:7", "--hold", "out/run_slurm.sh"]
    assert said(calls, "scontrol") == []  # released by the user, as `--hold` says


def test_a_sweeps_chain_is_the_array_k_times(calls, capsys, tmp_path):
    code, _, err = submit(capsys, "--chain", "2", "-t", "10", "--sweep", "lr=1,2")
    assert code == 0, err
    assert said(calls, "sbatch")[1].split()[1] == "--dependency=afterany:101"  # every task of array 101
    assert "#SBATCH --array=0-1\n" in (tmp_path / "out" / "run_slurm.sh").read_text()


def test_a_link_sbatch_refuses_cancels_the_links_before_it(calls, capsys, monkeypatch):
    monkeypatch.setenv("REFUSE", "103")
    code, _, err = submit(capsys, "--chain", "3", "-t", "10")
    assert code == exitcodes.FAILED
    assert "Batch job submission failed (the chain's links 101 102 were cancelled)" in err
    assert said(calls, "scancel") == ["101 102"] and said(calls, "scontrol") == []


@pytest.mark.parametrize(
    "flags, field",
    [
        (("--chain", "0", "-t", "10"), "chain: expected a number greater than or equal to 1"),
        (("--chain", "3"), "chain: 3 links need a time limit (time)"),
        (("--chain", "2", "-t", "10", "--requeue"), "chain: the next link resumes the run; requeue: true"),
        (("--chain", "2", "-t", "1"), "chain: signal_lead (120s) must be shorter than the time limit (60s)"),
        (("--chain", "2", "-t", "10", "--wait"), "wait: --wait follows one job, and a chain is 2 of them"),
    ],
)
def test_a_bad_chain_is_one_line_and_nothing_is_submitted(calls, capsys, flags, field):
    code, out, err = submit(capsys, *flags)
    assert code == exitcodes.BAD_INPUT and out == ""
    assert len(err.strip().splitlines()) == 1 and field in err, err
    assert said(calls, "sbatch") == []


def test_status_shows_every_link_and_cancel_cancels_them_all(calls, capsys):
    assert submit(capsys, "--chain", "3", "-t", "10")[0] == 0
    (calls / "state-101").write_text("COMPLETED")
    (calls / "state-102").write_text("RUNNING")
    code, out, err = run(capsys, "status", "101", "--registry", "r.sqlite")
    assert code == 0, err
    assert "chain 101: link 1 of 3; links: 101 COMPLETED, 102 RUNNING, 103 PENDING\n" in out, out
    code, out, err = run(capsys, "status", "103", "--registry", "r.sqlite", "--json")
    assert [link["state"] for link in json.loads(out)["chain"]["links"]] == ["COMPLETED", "RUNNING", "PENDING"]
    # cancel by the chain's id: the running link is waited for, every other link is cancelled too
    code, out, err = run(capsys, "cancel", "101", "--registry", "r.sqlite")
    assert code == 0, err
    assert said(calls, "scancel") == ["101 103", "102"]
    assert out == "job 102: CANCELLED\nand the chain's other links: 101 103\n"


# ---- the rendered script's chain logic, run with bash (stand-in srun, scontrol, scancel) -----
def chain_link(tmp_path: Path, fake_slurm, link: str, code: int, env: dict | None = None, **spec):
    """Run link `link` of chain 101 (links 101 102 103), its program exiting with `code`; `env`
    may make it an array task (its own SLURM_JOB_ID then differs from the link's id)."""
    out = write(
        tmp_path, chain=3, time="10", command=["bash", "-c", f'echo "ran $SLURMGEN_GROUP"; exit {code}'], **spec
    )
    logs = out / "logs"
    (logs / CHAIN_JOBS_NAME.format(job_id="101")).write_text("101\n102\n103\n")
    scancel = tmp_path / "bin" / "scancel"
    scancel.write_text(f'#!/bin/sh\necho "$*" >>{tmp_path / "scancel.txt"}\n')
    scancel.chmod(0o755)
    chained = {} if link == "101" else {"SLURMGEN_CHAIN": "101"}
    result = fake_slurm(out, nodes=1, job_id=link, env={**chained, **(env or {})})
    cancelled = (tmp_path / "scancel.txt").read_text().splitlines() if (tmp_path / "scancel.txt").exists() else []
    return result, logs, cancelled


def last_record(logs: Path, job_id: str) -> dict:
    return json.loads((logs / ATTEMPTS_NAME.format(job_id=job_id)).read_text().splitlines()[-1])


def test_a_link_whose_run_finished_cancels_the_rest_and_a_later_link_does_nothing(tmp_path, fake_slurm):
    result, logs, cancelled = chain_link(tmp_path, fake_slurm, "101", 0)
    assert result.returncode == 0, result.stderr
    assert cancelled == ["102 103"]
    assert (
        last_record(logs, "101").items() >= {"chain": "finished", "chain_why": "the run finished in link 101"}.items()
    )
    assert (logs / CHAIN_ENDED_NAME.format(job_id="101")).read_text() == "the run finished in link 101\n"
    # link 103 started anyway (a cancel that came too late): it runs nothing and exits 0
    result, logs, cancelled = chain_link(tmp_path, fake_slurm, "103", 1)
    assert result.returncode == 0 and "ran " not in result.stdout, result.stderr
    assert "chain 101 already ended (the run finished in link 101)" in result.stderr
    assert last_record(logs, "103")["event"] == "skipped"


def test_a_link_failing_beyond_a_retry_stops_the_chain_and_says_why(tmp_path, fake_slurm):
    result, logs, cancelled = chain_link(tmp_path, fake_slurm, "102", exitcodes.BAD_INPUT)
    assert result.returncode == exitcodes.BAD_INPUT
    assert cancelled == ["103"]
    why = "link 102 failed with exit code 2, which another attempt would not fix: the chain stops"
    assert last_record(logs, "102").items() >= {"chain": "stopped", "chain_why": why}.items()
    assert f"slurmgen: chain 101: {why}; cancelling its later links 103" in result.stderr


@pytest.mark.parametrize("code", [1, exitcodes.PREEMPTED])
def test_a_link_ending_at_its_time_limit_or_worth_a_retry_hands_on_to_the_next(tmp_path, fake_slurm, code):
    result, logs, cancelled = chain_link(tmp_path, fake_slurm, "102", code)
    assert result.returncode == code and cancelled == []
    assert last_record(logs, "102")["chain"] == "next"
    assert "ran slurm-101\n" in result.stdout  # the chain's group: one run record for every link
    assert not (logs / CHAIN_ENDED_NAME.format(job_id="101")).exists()


def test_retry_on_narrows_the_codes_a_chain_goes_on_after(tmp_path, fake_slurm):
    result, logs, cancelled = chain_link(tmp_path, fake_slurm, "101", 3, retries=1, retry_on=[1])
    assert cancelled == ["102 103"] and last_record(logs, "101")["chain"] == "stopped"


def test_a_sweeps_chain_ends_per_array_task(tmp_path, fake_slurm):
    env = {"SLURM_ARRAY_JOB_ID": "101", "SLURM_ARRAY_TASK_ID": "1", "SLURM_JOB_ID": "107"}
    result, logs, cancelled = chain_link(tmp_path, fake_slurm, "101", 0, env=env, sweep={"lr": [1, 2]})
    assert result.returncode == 0, result.stderr
    assert cancelled == ["102_1 103_1"]
    assert (logs / CHAIN_ENDED_NAME.format(job_id="101_1")).exists()
    assert last_record(logs, "107")["chain"] == "finished"  # the task's own attempts record


def test_the_lists_and_the_run_page_say_which_link_of_which_chain(calls, capsys, tmp_path):
    from slurmgen.coordinator.web.run_detail import read_run
    from slurmgen.coordinator.web.runs_page import run_view
    from slurmgen.runs.model import get_row

    assert submit(capsys, "--chain", "3", "-t", "10")[0] == 0
    code, out, err = run(capsys, "jobs", "--registry", "r.sqlite")
    assert code == 0, err
    assert all(f"slurmgen (link {n}/3 of chain 101)" in out for n in (1, 2, 3)), out
    with Registry.open(tmp_path / "r.sqlite") as reg:
        row = get_row(reg, reg.get("102").seq)
    assert run_view(row, 0.0)["name"] == "slurmgen (link 2/3 of chain 101)"
    page = read_run(tmp_path / "r.sqlite", row["seq"])
    assert [(link["job"], link["seq"]) for link in page["slurm"]["chain"]["links"]] == [
        ("101", 1),
        ("102", 2),
        ("103", 3),
    ]


class LoginShell:
    """Runs argv with real processes, stdin included, as the SSH runner does on a login node."""

    where = "login1"

    def run(self, argv, *, cwd=None, stdin=b"", timeout=60):
        import subprocess

        from slurmgen.jobs.slurm_runner import Result

        done = subprocess.run(argv, cwd=cwd, input=stdin, capture_output=True, timeout=timeout)
        return Result(done.returncode, done.stdout.decode(), done.stderr.decode())


def test_a_remote_chain_is_submitted_and_written_on_the_login_node(calls, tmp_path):
    """`submit --remote` hands its runner and the shipped job directory to the same chain.submit."""
    from slurmgen.generate.render import render
    from slurmgen.generate.specfile import spec_from_sources
    from slurmgen.jobs import chain

    rendered = render(spec_from_sources(None, {"chain": 2, "time": "10", "command": ["python", "t.py"]}))
    job_dir = tmp_path / "jobdir"
    job_dir.mkdir()
    with Registry.open(tmp_path / "r.sqlite", create=True) as reg:
        records = chain.submit(LoginShell(), reg, rendered, str(job_dir), ["--parsable"], "login1", {"snapshot": {}})
    assert [(r.job_id, r.remote, r.info["chain"]["link"]) for r in records] == [
        ("101", "login1", 1),
        ("102", "login1", 2),
    ]
    assert (job_dir / "out" / "logs" / CHAIN_JOBS_NAME.format(job_id="101")).read_text() == "101\n102\n"
    assert said(calls, "scontrol") == ["release 101"]
