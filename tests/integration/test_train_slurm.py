"""The trainer under a real Slurm (the test cluster): plain `srun` detection across two nodes.

The generated scripts export the torchrun variables themselves (issue 3's tests run those);
this checks the trainer's own fallback when a user writes `srun python -m slurmgen.train`
by hand: ranks from SLURM_PROCID/SLURM_NTASKS, the master from the nodelist, the port from
the job id, and that the batch shell itself is not mistaken for an srun task.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmgen.train.logs import read_heartbeats

pytestmark = pytest.mark.integration
pytest.importorskip("torch", reason="torch is not installed: run scripts/setup.sh")

RUN = (
    "--model mlp --mlp-hidden 16 --synthetic-samples 256 --max-steps 6 --log-every 3 --progress lines --init-timeout 30"
)


def test_plain_srun_across_two_nodes(cluster, tmp_path):
    out = tmp_path / "run"
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/bash
set -euo pipefail
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK
# In the batch shell: SLURM_PROCID=0 and SLURM_NTASKS=2 are set, but this is one process.
python -m slurmgen.train {RUN} --max-steps 1 --out-dir {out}/batch
srun --kill-on-bad-exit=1 python -m slurmgen.train {RUN} --out-dir {out}/srun
""")
    job = cluster.submit(
        script,
        cwd=tmp_path,
        args=["-N", "2", "--ntasks-per-node", "1", "-t", "3", "-o", str(tmp_path / "slurm-%j.out")],
    )
    state, code = cluster.wait(job, timeout=120)
    log = (tmp_path / f"slurm-{job}.out").read_text()
    assert (state, code) == ("COMPLETED", 0), log[-4000:]
    assert "launcher=single" in log and "not by srun: running ONE process" in log
    first = cluster.node_names[0]
    assert f"world_size=2 local_world_size=1 master_addr={first} master_port={20000 + int(job) % 10000}" in log
    assert "launcher=srun" in log and log.count("done: step 6") == 1
    beats = [b for _, b in sorted(read_heartbeats(out / "srun" / "heartbeats").items())]
    assert [(b["rank"], b["status"]) for b in beats] == [(0, "done"), (1, "done")]
    assert {b["host"] for b in beats} == set(cluster.node_names[:2])  # -N 2 on an idle cluster: its first two
    assert Path(out / "srun" / "checkpoints" / "latest").read_text().strip() == "ckpt-000000006.pt"
