"""`slurmgen train`: hands every argument to the bundled trainer's own command line (`cli.py`).

Apart from `cli.py` because that module imports the trainer's config and environment tables
(about 27 ms) on import: `slurmgen --help` and `create` register this command without paying
for them, and without torch.
"""

from __future__ import annotations

import typer


def train(ctx: typer.Context) -> None:
    """Run the bundled DDP trainer: the same flags as `python -m slurmgen.train` (see `slurmgen train --help`)."""
    from slurmgen.train.cli import main as train_main

    raise typer.Exit(train_main(list(ctx.args)))


def register(app: typer.Typer) -> None:
    """Add `train` to the `slurmgen` app; its flags and --help are the trainer's, not Typer's."""
    app.command(
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
    )(train)
