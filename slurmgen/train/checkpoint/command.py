"""`slurmgen ckpt info` and `slurmgen ckpt consolidate`: a run's checkpoints seen from outside.

Apart from the trainer's modules so that `slurmgen --help` registers the commands without
importing torch: the checkpoint readers (`sharded.py`, `files.py`) are imported inside the
commands, when they run.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from slurmgen.errors import SlurmgenError

ckpt_app = typer.Typer(
    help="Look at a training run's checkpoints: what they hold, one full state dict from shards.", no_args_is_help=True
)


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _run_dir(run_dir: Path) -> Path:
    if not run_dir.is_dir():
        raise SlurmgenError(
            f"ckpt: RUN_DIR {str(run_dir)!r} is not a directory",
            hint="pass the trainer's --out-dir (it holds checkpoints/) or its checkpoints/ directory",
        )
    return run_dir


@ckpt_app.command()
def info(
    run_dir: Path = typer.Argument(..., help="The run's directory (the trainer's --out-dir) or its checkpoints/."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
) -> None:
    """Every checkpoint of a run: step, world size, format, size per shard, complete or not."""
    from slurmgen.train.checkpoint import sharded

    directory, paths, latest = sharded.all_checkpoints(_run_dir(run_dir))
    rows = [sharded.describe(p) for p in paths]
    if as_json:
        typer.echo(json.dumps({"directory": str(directory), "latest": latest, "checkpoints": rows}, indent=2))
        return
    if not rows:
        typer.echo(f"no checkpoints in {directory}")
        return
    typer.echo(f"{directory}  (latest: {latest or '-'})")
    for row in rows:
        if not row["complete"]:
            typer.echo(f"  {row['name']}  INCOMPLETE: {row['problem']}")
        else:
            typer.echo(
                f"  {row['name']}  step {row['step']}  {row['format']}  {row['world_size']} processes  "
                f"{row['strategy']}  complete"
            )
        for name, size in row["files"].items():
            typer.echo(f"      {name}  {_size(size)}")


@ckpt_app.command()
def consolidate(
    run_dir: Path = typer.Argument(..., help="The run's directory (the trainer's --out-dir) or its checkpoints/."),
    out: Path | None = typer.Option(
        None, "--out", help="Where to write the state dict [default: RUN_DIR/model-STEP.pt]."
    ),
) -> None:
    """One full model state dict file (torch.save) from the newest good checkpoint, sharded or not.

    Load it with `model.load_state_dict(torch.load(FILE))`, on any number of processes."""
    import torch

    from slurmgen.train.checkpoint import sharded

    found = sharded.newest_good(_run_dir(run_dir))
    if found is None:
        raise SlurmgenError(f"ckpt consolidate: no loadable checkpoint in {str(sharded.checkpoints_dir(run_dir))!r}")
    path, meta = found
    target = out or Path(run_dir) / f"model-{int(meta['step']):09d}.pt"
    state = sharded.full_model_state(path)
    tmp = target.with_name(f".{target.name}.tmp")
    torch.save(state, str(tmp))
    tmp.replace(target)
    typer.echo(f"wrote {target}: {len(state)} tensors, step {meta['step']}, from {path}")


def register(app: typer.Typer) -> None:
    """Add `ckpt info` and `ckpt consolidate` to the `slurmgen` app."""
    app.add_typer(ckpt_app, name="ckpt")
