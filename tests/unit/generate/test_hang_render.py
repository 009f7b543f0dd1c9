"""What the generated scripts hand the ranks for hang detection that learns and for NCCL's flight
recorder (issue 23, item 5): rendered from the spec, checked in bash where it computes."""

from __future__ import annotations

import subprocess

from slurmgen.generate.render import LAUNCH_SCRIPT, SLURM_SCRIPT, render, render_template
from slurmgen.generate.specfile import build_spec


def test_nccl_jobs_keep_the_flight_recorders_dump_beside_their_logs():
    files = render(build_spec({"backend": "nccl", "log_dir": "L"})).files
    assert 'nccl_trace "$log_dir/slurmgen-$SLURM_JOB_ID.nccl-trace-rank"' in files[SLURM_SCRIPT]
    assert 'nccl_trace "$log_dir/nccl-trace-rank"' in files[LAUNCH_SCRIPT]
    for text in render(build_spec({"backend": "gloo"})).files.values():
        assert "TORCH_NCCL" not in text


def test_the_flight_recorder_prefix_is_absolute_and_a_users_setting_wins(tmp_path):
    script = (
        render_template("nccl_trace.sh.j2")
        + """
nccl_trace logs/slurmgen-7.nccl-trace-rank
echo "$TORCH_NCCL_TRACE_BUFFER_SIZE $TORCH_NCCL_DUMP_ON_TIMEOUT $TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
"""
    )
    run = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"}
    )
    assert run.stdout.split() == ["2000", "1", f"{tmp_path}/logs/slurmgen-7.nccl-trace-rank"]
    run = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/mine/x"},
    )
    assert run.stdout.split()[2] == "/mine/x"


def test_the_learned_timeouts_settings_reach_every_rank_when_hangs_are_watched():
    spec = build_spec({"heartbeat_timeout": 60, "hang_factor": 4, "hang_floor": 0.5})
    for text in render(spec).files.values():
        if text.startswith("#!"):
            assert "export SLURMGEN_HANG_FACTOR=4.0 SLURMGEN_HANG_FLOOR=0.5\n" in text
    for text in render(build_spec({})).files.values():
        assert "SLURMGEN_HANG_FACTOR" not in text
