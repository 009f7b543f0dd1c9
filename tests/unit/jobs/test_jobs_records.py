"""The sh program that finds a job's run records on a login node (templates/remote_find.sh.j2):
linted like every generated script, and carrying awkward directory names literally."""

from __future__ import annotations

import itertools
import subprocess

from helpers import ODD_ARGUMENTS

from slurmgen import tracking
from slurmgen.generate.render import render_template
from slurmgen.jobs.remote_records import (
    REMOTE_FIND_TEMPLATE,
    TAIL_LINES,
    parse_found,
    remote_find_argv,
    remote_find_script,
)


def test_the_login_node_find_lints_as_sh_whatever_it_prunes(tmp_path, shellcheck):
    # The names it prunes are constants today; rendered with hostile ones, the quoting still holds.
    scripts = [tmp_path / "remote_find.sh", tmp_path / "hostile.sh"]
    scripts[0].write_text(remote_find_script())
    scripts[1].write_text(render_template(REMOTE_FIND_TEMPLATE, skip_dirs=ODD_ARGUMENTS, tail_lines=TAIL_LINES))
    for script, shell in itertools.product(scripts, ("sh", "bash")):
        done = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, f"{shell} -n {script.name}: {done.stderr}"
    lint = subprocess.run(
        [shellcheck, "--shell=sh", "--severity=style", *map(str, scripts)], capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout


def test_the_login_node_find_takes_awkward_directory_names_literally(tmp_path):
    odd = 'it\'s "$x" \\ *; $(false)'
    work = tmp_path / odd
    for group, root in (("slurm-7", odd), ("slurm-7_1", "runs"), ("slurm-7", f"{odd}/checkpoints")):
        run = tracking.init(str(work / root / "tracking"), group=group)
        run.log(type="train", metrics={"loss": 0.5}, step=10)
        run.finish()
    argv = remote_find_argv(str(work), ["python", "--out-dir", odd], "7")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found = sorted((str(run.dir.relative_to(work)), run.get("group"), run.steps) for run, _ in parse_found(done.stdout))
    # Under a pruned directory (checkpoints/) nothing is looked for.
    assert found == [(f"{odd}/tracking/slurm-7/main", "slurm-7", 10), ("runs/tracking/slurm-7_1/main", "slurm-7_1", 10)]
