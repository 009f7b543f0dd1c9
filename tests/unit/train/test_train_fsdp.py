"""FSDP2 (slurmgen/train/fsdp.py) and sharded checkpoints (checkpoint/sharded.py) on real gloo ranks.

A small training loop stands in for the trainer: batches are a pure function of (step, rank,
world size), a global batch of 12 sequences split evenly, so runs on 2, 3 and 4 ranks compute
the same mean loss and may be compared.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from helpers import GPT_SIZE, run_ranks
from helpers import run as cli

from slurmgen.train import dist, fsdp
from slurmgen.train.checkpoint import files as ckpt
from slurmgen.train.checkpoint import sharded
from slurmgen.train.checkpoint.writer import is_dtensor
from slurmgen.train.models import GPT
from slurmgen.train.optim import build_optimizer

GLOBAL_BATCH, ACCUM = 12, 2


def build(rank: int, strategy: str, dropout: float = 0.0, dtype: str = "float32"):
    """A GPT seeded differently on every rank (sharding must make them agree), wrapped."""
    torch.manual_seed(1234 + 7 * rank)
    model = GPT(**GPT_SIZE, dropout=dropout)
    if strategy == "fsdp":
        wrapped = fsdp.shard(model, dtype)
    else:
        fsdp.broadcast_from_rank0(model)
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    return wrapped, build_optimizer(model, 1e-2, 0.1, (0.9, 0.95))


def batch(step: int, micro: int, rank: int, world: int):
    g = torch.Generator().manual_seed(10_000 * step + micro)
    data = torch.randint(0, GPT_SIZE["vocab_size"], (GLOBAL_BATCH, GPT_SIZE["block_size"] + 1), generator=g)
    share = data.chunk(world)[rank]
    return share[:, :-1], share[:, 1:]


def train_step(model, opt, step: int, rank: int, world: int) -> float:
    """Accumulate ACCUM micro-batches (gradients synchronised on the last only), clip, step;
    the global mean loss."""
    total = 0.0
    for micro in range(ACCUM):
        sync = micro == ACCUM - 1
        ctx = (
            fsdp.no_sync(model, sync)
            if fsdp.is_sharded(model)
            else (model.no_sync() if not sync else torch.enable_grad())
        )
        with ctx:
            loss = model(*batch(step, micro, rank, world)) / ACCUM
            loss.backward()
        total += loss.item()
    fsdp.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return dist.all_reduce([total])[0] / world


def full_weights(model) -> dict[str, torch.Tensor]:
    if fsdp.is_sharded(model):
        return {k: v.clone() for k, v in fsdp.full_state_dict(model).items()}
    return {k: v.clone() for k, v in model.module.state_dict().items()}


def run(rank, world, strategy, ckpt_dir, steps, save_at=None, resume=False, dropout=0.0, background=True):
    """Train to `steps` (or stop after checkpointing `save_at`); (weights, losses, first step, warnings)."""
    warnings: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: warnings.append(r.getMessage()) if r.levelno >= logging.WARNING else None
    logging.getLogger("slurmgen.train").addHandler(handler)
    model, opt = build(rank, strategy, dropout)
    torch.manual_seed(100 + rank)
    start = 0
    if resume:
        found = sharded.resume(ckpt_dir, model, opt, world)
        start = found[1]["step"]
        if found[1]["world_size"] == world:
            ckpt.restore_rng(found[1]["rng"][rank])
    writer = sharded.ShardedWriter(ckpt_dir, keep_last=2, background=background)
    losses = []
    for step in range(start, steps):
        losses.append(train_step(model, opt, step, rank, world))
        if step + 1 == save_at:
            rngs = dist.gather_to_main(ckpt.capture_rng(), rank)
            meta = {"world_size": world, "strategy": strategy, "rng": rngs} if rank == 0 else None
            writer.submit(step + 1, model, opt, meta)
            break
    writer.close()
    return full_weights(model), losses, start, warnings


def write_while_training(rank, world, ckpt_dir):
    """Checkpoint step 1 in the background and go on training at once; the checkpoint must
    still hold step 1's weights. The copy goes into the same kept buffers each time."""
    from slurmgen.train.checkpoint.writer import buffers_for, snapshot

    model, opt = build(rank, "fsdp")
    train_step(model, opt, 0, rank, world)
    state = sharded.app_state(model, opt)
    kept = buffers_for(state)
    again = snapshot(state, snapshot(state, kept))
    reused = all(again["model"][k] is kept["model"][k] for k in kept["model"])
    exact = all(torch.equal(again["model"][k].to_local(), v.to_local()) for k, v in state["model"].items())
    writer = sharded.ShardedWriter(ckpt_dir, keep_last=3)
    writer.prepare(model, opt)
    at_submit = full_weights(model)
    writer.submit(1, model, opt, {"world_size": world} if rank == 0 else None)
    for step in (1, 2):  # changes every live shard while the write may still run
        train_step(model, opt, step, rank, world)
    writer.close()
    return reused, exact, at_submit, full_weights(model)


def test_a_background_sharded_write_holds_the_state_of_its_step_while_training_goes_on(tmp_path):
    results = run_ranks(2, tmp_path / "ranks", write_while_training, str(tmp_path / "ck"))
    saved = sharded.full_model_state(tmp_path / "ck" / sharded.checkpoint_name(1))
    for reused, exact, at_submit, after in results:
        assert reused and exact
        assert saved.keys() == at_submit.keys() and all(torch.equal(saved[k], at_submit[k]) for k in saved)
        assert not all(torch.equal(after[k], at_submit[k]) for k in saved)  # training did go on
    assert (tmp_path / "ck" / "latest").read_text().strip() == sharded.checkpoint_name(1)


def leaves(state, path=""):
    """{path: value} of every leaf of a state dict; a DTensor by its local shard, cloned."""
    if is_dtensor(state):
        return {path: state.to_local().clone()}
    if isinstance(state, torch.Tensor):
        return {path: state.clone()}
    if isinstance(state, dict):
        return {k: v for key, value in state.items() for k, v in leaves(value, f"{path}/{key}").items()}
    if isinstance(state, (list, tuple)):
        return {k: v for i, value in enumerate(state) for k, v in leaves(value, f"{path}/{i}").items()}
    return {path: state}


def refilled_checkpoints(rank, world, ckpt_dir):
    """Three background checkpoints after `prepare` (the kept copy refilled, no state dict taken),
    the lr halved between them; each one's state as read back, and the state at its submit."""
    import torch.distributed.checkpoint as dcp

    model, opt = build(rank, "fsdp")
    train_step(model, opt, 0, rank, world)
    writer = sharded.ShardedWriter(ckpt_dir, keep_last=3)
    writer.prepare(model, opt)
    at_submit = []
    for step in (1, 2, 3):
        at_submit.append(leaves(sharded.app_state(model, opt)))
        writer.submit(step, model, opt, {"world_size": world} if rank == 0 else None)
        train_step(model, opt, step, rank, world)  # in place, while the write may still run
        for group in opt.param_groups:
            group["lr"] *= 0.5
    writer.close()
    saved = []
    for step in (1, 2, 3):
        state = sharded.app_state(model, opt)
        dcp.load(state, checkpoint_id=str(Path(ckpt_dir) / sharded.checkpoint_name(step)))
        saved.append(leaves(state))
    return at_submit, saved


def test_background_sharded_checkpoints_from_the_kept_copy_hold_the_whole_state_of_their_step(tmp_path):
    """Model, optimizer moments and step, and the lr of the moment: the kept copy is refilled
    in place and its parameter groups taken anew, never a stale value."""
    for at_submit, saved in run_ranks(2, tmp_path / "ranks", refilled_checkpoints, str(tmp_path / "ck")):
        assert at_submit[0]["/optimizer/param_groups/0/lr"] != at_submit[1]["/optimizer/param_groups/0/lr"]
        for expected, got in zip(at_submit, saved, strict=True):
            assert got.keys() == expected.keys()
            for k, v in expected.items():
                assert torch.equal(got[k], v) if isinstance(v, torch.Tensor) else got[k] == v, k


def check_sharding(rank, world):
    ddp, _ = build(rank, "ddp")
    sharded_model, _ = build(rank, "fsdp")
    local_ok = all(torch.isfinite(p.to_local()).all() for p in sharded_model.parameters())
    return local_ok, full_weights(ddp), full_weights(sharded_model)


def test_sharding_starts_every_world_size_from_rank0s_exact_weights_without_nan(tmp_path):
    torch.manual_seed(1234)
    reference = GPT(**GPT_SIZE).state_dict()
    for world in (2, 3):
        for local_ok, ddp_weights, fsdp_weights in run_ranks(world, tmp_path / str(world), check_sharding):
            assert local_ok
            assert ddp_weights.keys() == fsdp_weights.keys() == reference.keys()
            for k in reference:
                assert torch.equal(fsdp_weights[k], reference[k]), k
                assert torch.equal(ddp_weights[k], reference[k]), k


def fsdp_and_ddp_steps(rank, world):
    results = {}
    for strategy in ("ddp", "fsdp"):
        model, opt = build(rank, strategy)
        losses = [train_step(model, opt, s, rank, world) for s in range(3)]
        results[strategy] = (losses, full_weights(model))
    return results


def test_fsdp_steps_like_ddp_with_accumulation_and_clipping(tmp_path):
    """Same data, same start: FSDP's sharded clip and no-sync accumulation give DDP's updates
    (to rounding: reduce-scatter and all-reduce add in different orders)."""
    results = run_ranks(2, tmp_path, fsdp_and_ddp_steps)[0]
    (ddp_losses, ddp_w), (fsdp_losses, fsdp_w) = results["ddp"], results["fsdp"]
    assert fsdp_losses == pytest.approx(ddp_losses, rel=1e-5)
    start = GPT(**GPT_SIZE).state_dict()
    for k in ddp_w:
        assert torch.allclose(fsdp_w[k], ddp_w[k], atol=1e-5), k
    assert any(not torch.equal(ddp_w[k], start[k]) for k in ddp_w)


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp_run_resumed_after_a_stop_is_bit_identical(tmp_path, world):
    whole = run_ranks(world, tmp_path / "a", run, "fsdp", str(tmp_path / "a" / "ck"), 6, None, False, 0.1)
    run_ranks(world, tmp_path / "b", run, "fsdp", str(tmp_path / "b" / "ck"), 6, 3, False, 0.1)
    resumed = run_ranks(world, tmp_path / "b", run, "fsdp", str(tmp_path / "b" / "ck"), 6, None, True, 0.1)
    for (w_whole, l_whole, _, _), (w_res, l_res, start, warnings) in zip(whole, resumed):
        assert start == 3 and not warnings
        assert l_res == l_whole[3:]
        assert all(torch.equal(w_whole[k], w_res[k]) for k in w_whole)


@pytest.mark.parametrize("before,after", [(4, 2), (2, 3)])
def test_resume_on_another_world_size_reshards_and_continues_from_the_same_step(tmp_path, before, after):
    whole = run_ranks(before, tmp_path / "a", run, "fsdp", str(tmp_path / "a" / "ck"), 6)
    run_ranks(before, tmp_path / "b", run, "fsdp", str(tmp_path / "b" / "ck"), 6, 3)
    resumed = run_ranks(after, tmp_path / "b", run, "fsdp", str(tmp_path / "b" / "ck"), 6, None, True)
    _, l_whole, _, _ = whole[0]
    w_res, l_res, start, warnings = resumed[0]
    assert start == 3
    assert l_res == pytest.approx(l_whole[3:], rel=1e-4)
    assert any(f"written by {before} processes, now {after}: resharding" in w for w in warnings)
    for k, v in whole[0][0].items():
        assert torch.allclose(v, w_res[k], atol=1e-4), k


@pytest.mark.parametrize("first,second", [("ddp", "fsdp"), ("fsdp", "ddp")])
def test_a_run_switches_between_ddp_and_fsdp(tmp_path, first, second):
    saved = run_ranks(2, tmp_path, run, first, str(tmp_path / "ck"), 6, 3)
    resumed = run_ranks(2, tmp_path, run, second, str(tmp_path / "ck"), 3, None, True)
    for (w_saved, _, _, _), (w_res, losses, start, _) in zip(saved, resumed):
        assert start == 3 and losses == []
        assert all(torch.equal(w_saved[k], w_res[k]) for k in w_saved)


def test_fsdp_under_mixed_precision_trains_without_nan(tmp_path):
    for losses, finite in run_ranks(2, tmp_path, bf16_steps):
        assert finite and all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


def bf16_steps(rank, world):
    model, opt = build(rank, "fsdp", dtype="bfloat16")
    losses = [train_step(model, opt, 0, rank, world) for _ in range(4)]  # the same batch: loss falls
    return losses, all(torch.isfinite(p.to_local()).all() for p in model.parameters())


# --- the checkpoint directory protocol, in one process ------------------------------------------


def one_process_state(value: float):
    model = torch.nn.Linear(4, 3)
    torch.nn.init.constant_(model.weight, value)
    return model, torch.optim.AdamW(model.parameters())


def write(directory, step, value, keep_last=5, background=False):
    model, opt = one_process_state(value)
    writer = sharded.ShardedWriter(directory, keep_last, background=background)
    done = writer.submit(step, model, opt, {"world_size": 1, "rng": [ckpt.capture_rng()]})
    return done or writer.wait()


def test_sharded_checkpoints_are_directories_behind_latest_and_old_ones_are_pruned(tmp_path):
    for step in (1, 2, 3):
        written = write(tmp_path, step, float(step), keep_last=2, background=step == 3)
        assert written.path == tmp_path / sharded.checkpoint_name(step)
    assert [s for s, _ in sharded.list_checkpoints(tmp_path)] == [2, 3]
    assert (tmp_path / "latest").read_text().strip() == sharded.checkpoint_name(3)
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]
    path, meta = sharded.find_latest(tmp_path)
    assert meta["step"] == 3 and meta["format"] == sharded.FORMAT
    model, opt = one_process_state(0.0)
    sharded.load_into(path, model, opt)
    assert torch.equal(model.weight, torch.full((3, 4), 3.0))


def test_a_damaged_newest_checkpoint_is_skipped_with_a_message_naming_it(tmp_path, caplog):
    write(tmp_path, 1, 1.0)
    newest = write(tmp_path, 2, 2.0).path
    shard = next(newest.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:10])
    with caplog.at_level(logging.WARNING, logger="slurmgen.train"):
        path, meta = sharded.find_latest(tmp_path)
    assert meta["step"] == 1
    assert str(newest) in caplog.text and "damaged" in caplog.text


@pytest.mark.parametrize("point", ["before-rename", "before-pointer"])
def test_a_kill_inside_the_protocol_leaves_latest_on_a_complete_checkpoint(tmp_path, point):
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import sys; sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[2])!r}]
        from test_train_fsdp import write
        write({str(tmp_path)!r}, 1, 1.0)
        write({str(tmp_path)!r}, 2, 2.0)
    """)
    proc = subprocess.run(
        [sys.executable, "-c", code], env={**__import__("os").environ, "SLURMGEN_TRAIN_FAULT": f"{point}@2"}
    )
    assert proc.returncode == -9
    path, meta = sharded.find_latest(tmp_path)
    assert meta["step"] == 1  # `latest` is believed first; the complete step 2 stays for inspection
    assert [s for s, _ in sharded.list_checkpoints(tmp_path)] == ([1, 2] if point == "before-pointer" else [1])
    assert (tmp_path / "latest").read_text().strip() == sharded.checkpoint_name(1)
    assert sharded.remove_stale_temporaries(tmp_path) == (1 if point == "before-rename" else 0)


def save_forever(rank, world, ckpt_dir):
    """Train and checkpoint (asynchronously, every step) until killed."""
    model, opt = build(rank, "fsdp")
    writer = sharded.ShardedWriter(ckpt_dir, keep_last=2)
    for step in range(10_000):
        train_step(model, opt, step, rank, world)
        writer.submit(step + 1, model, opt, {"world_size": world, "rng": []} if rank == 0 else None)


@pytest.mark.parametrize("delay", [0.0, 0.13, 0.37])
def test_kill_9_of_every_rank_during_sharded_writes_leaves_latest_loadable(tmp_path, delay):
    import os
    import signal
    import subprocess
    import sys
    import textwrap
    import time

    ck = tmp_path / "ck"
    code = textwrap.dedent(f"""
        import sys; sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[2])!r}]
        from helpers import run_ranks
        from test_train_fsdp import save_forever
        run_ranks(2, {str(tmp_path)!r}, save_forever, {str(ck)!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (ck / "latest").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert (ck / "latest").exists()
    path, meta = sharded.find_latest(ck)
    assert path.name == (ck / "latest").read_text().strip()
    model = GPT(**GPT_SIZE)
    sharded.load_into(path, model, build_optimizer(model, 1e-2, 0.1, (0.9, 0.95)))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_latest_naming_a_sharded_checkpoint_is_no_warning_for_the_single_file_listing(tmp_path, caplog):
    ckpt.save(tmp_path, 1, {"format": ckpt.FORMAT, "step": 1, "model": {"w": torch.ones(2)}}, keep_last=5)
    write(tmp_path, 2, 2.0)
    with caplog.at_level(logging.WARNING, logger="slurmgen.train"):
        path, state = ckpt.find_latest(tmp_path)
        newest, meta = sharded.newest_good(tmp_path)
    assert state["step"] == 1 and meta["step"] == 2 and newest.name == sharded.checkpoint_name(2)
    assert "does not exist" not in caplog.text


# --- slurmgen ckpt info / consolidate ------------------------------------------------------
def test_info_lists_both_formats_with_step_world_size_shards_and_completeness(tmp_path, capsys):
    d = tmp_path / "checkpoints"
    ckpt.save(d, 1, {"format": ckpt.FORMAT, "step": 1, "world_size": 2, "model": {"w": torch.ones(2)}}, keep_last=5)
    writer = sharded.ShardedWriter(d, keep_last=5, background=False)
    model = torch.nn.Linear(3, 2)
    done = writer.submit(2, model, torch.optim.AdamW(model.parameters()), {"world_size": 1, "strategy": "fsdp"})
    (d / "ckpt-000000003.dcp").mkdir()  # named like a checkpoint but empty: not complete
    code, out, err = cli(capsys, "ckpt", "info", str(tmp_path))
    assert code == 0, err
    assert f"(latest: {done.path.name})" in out
    assert "ckpt-000000001.pt  step 1  single file (1)  2 processes  ddp  complete" in out
    assert "ckpt-000000002.dcp  step 2  sharded (dcp-1)  1 processes  fsdp  complete" in out
    assert "__0_0.distcp" in out and ".metadata" in out
    assert "ckpt-000000003.dcp  INCOMPLETE" in out
    code, out, _ = cli(capsys, "ckpt", "info", str(d), "--json")
    rows = json.loads(out)["checkpoints"]
    assert [(r["name"], r["complete"]) for r in rows] == [
        ("ckpt-000000001.pt", True),
        ("ckpt-000000002.dcp", True),
        ("ckpt-000000003.dcp", False),
    ]


def test_consolidate_writes_the_full_model_of_a_4_rank_fsdp_checkpoint(tmp_path, capsys):
    saved = run_ranks(4, tmp_path, run, "fsdp", str(tmp_path / "run" / "checkpoints"), 6, 2)
    code, out, err = cli(capsys, "ckpt", "consolidate", str(tmp_path / "run"), "--out", str(tmp_path / "model.pt"))
    assert code == 0, err
    assert "step 2" in out
    full = torch.load(tmp_path / "model.pt", weights_only=True)
    model = GPT(**GPT_SIZE)
    model.load_state_dict(full)
    weights = saved[0][0]
    assert all(torch.equal(model.state_dict()[k], weights[k]) for k in weights)


def test_bad_run_dir_is_one_line_and_exit_2(tmp_path, capsys):
    code, out, err = cli(capsys, "ckpt", "info", str(tmp_path / "nope"))
    assert code == 2 and "RUN_DIR" in err and "Traceback" not in err
    code, out, err = cli(capsys, "ckpt", "consolidate", str(tmp_path))
    assert code == 2 and "no loadable checkpoint" in err
