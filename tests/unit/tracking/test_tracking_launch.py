"""The launchers name the group of every rank's run record: run_slurm.sh after the Slurm job,
`slurmgen launch` after its launch id (the same on every node and every restart)."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

from slurmgen.cli import main
from slurmgen.generate.output import write_files
from slurmgen.generate.render import SLURM_SCRIPT, render
from slurmgen.generate.specfile import build_spec

REPORT = ["python3", "-c", "import os; print('GROUP', os.environ.get('SLURMGEN_GROUP'))"]
# srun stand-in: every task of every node runs the command, with srun's variables.
FAKE_SRUN = """#!/usr/bin/env bash
while [[ $1 == -* ]]; do shift; done
for ((t = 0; t < SLURM_JOB_NUM_NODES * 2; t++)); do
  SLURM_PROCID=$t SLURM_LOCALID=$((t % 2)) SLURM_NODEID=$((t / 2)) SLURM_NTASKS=$((SLURM_JOB_NUM_NODES * 2)) "$@"
done
"""


@pytest.fixture
def slurm_script(tmp_path):
    spec = build_spec({"output_dir": str(tmp_path / "out"), "nodes": 2, "gpus": 2, "command": REPORT})
    write_files(Path(spec.output_dir), render(spec).files, force=True, extra_dirs=[Path(spec.logs)])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "scontrol").write_text("#!/usr/bin/env bash\necho localhost\n")
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IEXEC)

    def run(**extra):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SLURMGEN_"))}
        env.update(
            {
                "PATH": f"{bin_dir}:{os.environ['PATH']}",
                "SLURM_JOB_ID": "4242",
                "SLURM_JOB_NODELIST": "x",
                "SLURM_JOB_NUM_NODES": "2",
                **extra,
            }
        )
        done = subprocess.run(
            ["bash", str(Path(spec.output_dir) / SLURM_SCRIPT)], capture_output=True, text=True, timeout=60, env=env
        )
        assert done.returncode == 0, done.stderr
        return [line.split()[1] for line in done.stdout.splitlines() if line.startswith("GROUP ")]

    return run


def test_run_slurm_gives_every_task_the_job_group(slurm_script):
    assert slurm_script() == ["slurm-4242"] * 4
    # Each run is another job: a job id that already finished would not run again.
    assert slurm_script(SLURM_JOB_ID="4243", SLURM_ARRAY_JOB_ID="4240", SLURM_ARRAY_TASK_ID="2") == ["slurm-4240_2"] * 4
    assert (
        slurm_script(SLURM_JOB_ID="4244", SLURMGEN_GROUP="sweep-3") == ["sweep-3"] * 4
    )  # a group set by the user wins


def dry_run(capsys, *args):
    with pytest.raises(SystemExit) as info:
        main(["launch", "--dry-run", "--hosts", "node-a,node-b", *args, "--", "true"])
    out, err = capsys.readouterr()
    assert info.value.code == 0, err
    return out


def test_ssh_launch_sends_one_group_to_every_node(capsys, monkeypatch):
    for key in ("SLURMGEN_GROUP", "SLURMGEN_LAUNCH_ID"):
        monkeypatch.delenv(key, raising=False)
    out = dry_run(capsys)
    groups = [line for line in out.splitlines() if line.startswith("export SLURMGEN_GROUP=")]
    ids = [line for line in out.splitlines() if line.startswith("export SLURMGEN_LAUNCH_ID=")]
    assert len(groups) == 2 and len(set(groups)) == 1 and len(set(ids)) == 1
    assert groups[0] == ids[0].replace("SLURMGEN_LAUNCH_ID=", "SLURMGEN_GROUP=launch-")
    monkeypatch.setenv("SLURMGEN_GROUP", "ablation-7")
    monkeypatch.setenv("SLURMGEN_TRACKERS", "tensorboard")
    out = dry_run(capsys)
    assert out.count("export SLURMGEN_GROUP=ablation-7") == 2 and out.count("export SLURMGEN_TRACKERS=tensorboard") == 2
