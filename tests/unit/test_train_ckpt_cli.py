"""`slurmgen ckpt info` and `slurmgen ckpt consolidate` on real checkpoints of both formats."""

from __future__ import annotations

import json

import torch

from cli_helpers import run
from slurmgen.train import checkpoint as ckpt
from slurmgen.train import sharded
from slurmgen.train.models import GPT
from test_train_fsdp import GPT_SIZE, run_ranks
from test_train_fsdp import run as train_run


def test_info_lists_both_formats_with_step_world_size_shards_and_completeness(tmp_path, capsys):
    d = tmp_path / "checkpoints"
    ckpt.save(d, 1, {"format": ckpt.FORMAT, "step": 1, "world_size": 2, "model": {"w": torch.ones(2)}}, keep_last=5)
    writer = sharded.ShardedWriter(d, keep_last=5, background=False)
    model = torch.nn.Linear(3, 2)
    done = writer.submit(2, model, torch.optim.AdamW(model.parameters()), {"world_size": 1, "strategy": "fsdp"})
    (d / "ckpt-000000003.dcp").mkdir()  # named like a checkpoint but empty: not complete
    code, out, err = run(capsys, "ckpt", "info", str(tmp_path))
    assert code == 0, err
    assert f"(latest: {done.path.name})" in out
    assert "ckpt-000000001.pt  step 1  single file (1)  2 processes  ddp  complete" in out
    assert "ckpt-000000002.dcp  step 2  sharded (dcp-1)  1 processes  fsdp  complete" in out
    assert "__0_0.distcp" in out and ".metadata" in out
    assert "ckpt-000000003.dcp  INCOMPLETE" in out
    code, out, _ = run(capsys, "ckpt", "info", str(d), "--json")
    rows = json.loads(out)["checkpoints"]
    assert [(r["name"], r["complete"]) for r in rows] == [
        ("ckpt-000000001.pt", True), ("ckpt-000000002.dcp", True), ("ckpt-000000003.dcp", False)]


def test_consolidate_writes_the_full_model_of_a_4_rank_fsdp_checkpoint(tmp_path, capsys):
    saved = run_ranks(4, tmp_path, train_run, "fsdp", str(tmp_path / "run" / "checkpoints"), 6, 2)
    code, out, err = run(capsys, "ckpt", "consolidate", str(tmp_path / "run"), "--out", str(tmp_path / "model.pt"))
    assert code == 0, err
    assert "step 2" in out
    full = torch.load(tmp_path / "model.pt", weights_only=True)
    model = GPT(**GPT_SIZE)
    model.load_state_dict(full)
    weights = saved[0][0]
    assert all(torch.equal(model.state_dict()[k], weights[k]) for k in weights)


def test_bad_run_dir_is_one_line_and_exit_2(tmp_path, capsys):
    code, out, err = run(capsys, "ckpt", "info", str(tmp_path / "nope"))
    assert code == 2 and "RUN_DIR" in err and "Traceback" not in err
    code, out, err = run(capsys, "ckpt", "consolidate", str(tmp_path))
    assert code == 2 and "no loadable checkpoint" in err
