"""`slurmgen submit`: render exactly as `create` does, sbatch it, register the job.

`submit` takes every flag of `create` (its signature is create's plus its own), so the two can
never drift apart: same files, same validation, same notes; and `Job.submit()` of the Python API sbatches through
the same function (api/job.py's `sbatch_here`). With `--remote LOGIN` the code is shipped to
the login node and the job remembers it, so later commands find it without the flag.
"""

from __future__ import annotations

import inspect
import json
import os
import typing
from pathlib import Path
from typing import Any

import typer

from slurmgen.errors import SlurmgenError
from slurmgen.generate.cli import create, echo_notes, spec_from_create_flags, write_rendered
from slurmgen.jobs.cli_shared import JsonOpt, RegistryOpt, RemoteOpt, Runners, SetupOpt, SshConfigOpt, echo_json, style


def submit(**kw: Any) -> None:
    """Render exactly as `create` does, sbatch it, register the job and print its id."""
    from slurmgen.generate.render import render
    from slurmgen.jobs import commands, shapes

    create_flags = {k: kw.pop(k) for k in list(kw) if k in _CREATE_PARAMS}
    dry_run, force = create_flags.pop("dry_run"), create_flags.pop("force")
    candidates = _shapes_asked(kw["shapes"], kw["earliest"], dry_run)
    rendered = render(spec_from_create_flags(**create_flags))
    args = commands.sbatch_args(kw["dependency"], kw["hold"])
    if rendered.spec.chain > 1 and kw["wait"]:
        raise SlurmgenError(
            f"wait: --wait follows one job, and a chain is {rendered.spec.chain} of them: "
            "follow it with `slurmgen status ID` (any link's id)"
        )
    if candidates:
        for note in shapes.batch_notes(rendered.spec.command, candidates):
            typer.echo(f"slurmgen: note: {note}", err=True)
    elif dry_run:
        write_rendered(rendered, dry_run=True, force=force)
        return
    runners = Runners(kw["ssh_config"], list(kw["remote_setup"]))
    try:
        if candidates:
            rendered = _soonest(runners(kw["remote"]), create_flags, candidates, dry_run)
            if dry_run:
                return
        if not kw["no_check"]:
            _check(runners(kw["remote"]), rendered)
        _submit_rendered(runners, rendered, args, kw, force)
    finally:
        runners.close()


def _shapes_asked(text: str | None, earliest: bool, dry_run: bool) -> list[Any]:
    """The shapes of --shapes, which need --earliest (submit the soonest) or --dry-run (the table only)."""
    from slurmgen.jobs import shapes

    if text is None:
        if earliest:
            raise SlurmgenError("earliest: --earliest picks among shapes: give them, e.g. --shapes 2x4,1x8,4x2")
        return []
    found = shapes.parse(text)
    if not (earliest or dry_run):
        raise SlurmgenError(
            f"shapes: --shapes {text} needs --earliest (submit the soonest) or --dry-run (print the table)"
        )
    return found


def _soonest(runner: Any, create_flags: dict[str, Any], candidates: list[Any], dry_run: bool) -> Any:
    """Each shape rendered as `create` would and asked of `sbatch --test-only`; the table on
    stderr (stdout with --dry-run, where it is the answer), and the soonest shape's render."""
    from slurmgen.generate.render import SLURM_SCRIPT, render
    from slurmgen.jobs import shapes, test_only

    renders, rows = [], []
    for shape in candidates:  # every shape validated before Slurm is asked about any
        renders.append(
            render(spec_from_create_flags(**{**create_flags, "nodes": str(shape.nodes), "gpus": str(shape.gpus)}))
        )
    now = test_only.clock(runner)
    cwd = None if runner.where != "local" else os.getcwd()
    for shape, each in zip(candidates, renders, strict=True):
        rows.append(shapes.Row(shape, test_only.ask(runner, each.files[SLURM_SCRIPT], cwd)))
    chosen = shapes.soonest(rows)
    for line in shapes.table(rows, now, chosen):
        typer.echo(line, err=not dry_run)
    if chosen is None:
        raise shapes.never(rows)
    verb = "would submit" if dry_run else "submitting"
    typer.echo(f"slurmgen: {verb} {chosen.shape}, the shape Slurm expects to start first", err=not dry_run)
    return renders[rows.index(chosen)]


def _check(runner: Any, rendered: Any) -> None:
    """Refuse a request the cluster can never meet, each reason on its line (jobs/request_check.py,
    as `Job.submit()` does); say when Slurm expects one that has to wait to start."""
    from slurmgen.jobs import request_check

    if said := request_check.before_submit(runner, rendered, "--no-check"):
        typer.echo(f"slurmgen: note: {said}", err=True)


def _submit_rendered(runners: Runners, rendered: Any, args: list[str], kw: dict[str, Any], force: bool) -> None:
    """sbatch the rendered job (here, or on the login node of --remote), register it, and follow
    it with --wait."""
    from slurmgen.api.job import sbatch_here
    from slurmgen.jobs import commands
    from slurmgen.runs.registry import Registry

    remote, as_json = kw["remote"], kw["as_json"]
    with Registry.open(kw["registry"], create=True) as reg:  # a bad registry stops us before sbatch
        if remote:
            record = _submit_remote(runners(remote), reg, rendered, args, kw)
        else:  # create's notes look at this machine: with --remote it is neither the login node nor a node
            echo_notes(rendered.spec)
            record = sbatch_here(runners(None), reg, rendered, args, force=force)  # as Job.submit()
        if not kw["wait"]:
            _say_submitted(record, as_json)
            return
        if not as_json:
            typer.echo(record.job_id)
        state, code = commands.wait(runners(remote), record, registry=reg)
    if as_json:
        echo_json({**record.as_dict(), "last_state": state, "last_exit": code})
    else:
        typer.echo(f"job {record.job_id}: {style(state, state)}, exit code {code}", err=True)
    raise typer.Exit(code)


def _submit_remote(runner: Any, reg: Any, rendered: Any, args: list[str], kw: dict[str, Any]) -> Any:
    from slurmgen.jobs import commands
    from slurmgen.jobs.chain import submit_job
    from slurmgen.jobs.remote import DEFAULT_REMOTE_DIR, ship
    from slurmgen.jobs.snapshot import take

    snap = take(Path(kw["code"] or "."), whole_dir=kw["code"] is not None)
    facts = {"dir": None, "digest": snap.digest, "files": snap.files, "commit": snap.commit, "dirty": snap.dirty}
    extra = {
        ".slurmgen/snapshot.json": json.dumps(facts, indent=2).encode(),
        ".slurmgen/diff.patch": snap.diff.encode(),
    }
    job_dir, uploaded = ship(runner, snap, kw["remote_dir"] or DEFAULT_REMOTE_DIR, commands.job_tar(rendered, extra))
    runner.run(["mkdir", "-p", rendered.spec.logs], cwd=job_dir)
    facts.update(dir=job_dir, uploaded=uploaded, diff=snap.diff)
    return submit_job(
        runner,
        reg,
        rendered,
        job_dir,
        args,
        runner.where,
        {
            "snapshot": facts,
            "remote_setup": list(kw["remote_setup"]),
            "ssh_config": os.path.abspath(kw["ssh_config"]) if kw["ssh_config"] else None,
        },
    )


def _say_submitted(record: Any, as_json: bool) -> None:
    """The job id on stdout (a chain's: its first link's, by which every command finds it), and
    a chain's links on stderr."""
    links = record.info.get("chain", {}).get("links")
    if as_json:
        echo_json(record.as_dict())
        return
    typer.echo(record.job_id)
    if links:
        typer.echo(
            f"chain {record.job_id}: links {' '.join(links)}, each starting once the one before it ended", err=True
        )


def _signature() -> inspect.Signature:
    """create's parameters followed by submit's own: one definition of the shared flags."""
    own = [
        ("registry", Path | None, RegistryOpt),
        (
            "dependency",
            str | None,
            typer.Option(None, "--dependency", "-d", help="sbatch --dependency, e.g. afterok:1234."),
        ),
        ("hold", bool, typer.Option(False, "--hold", help="Submit held; `scontrol release ID` starts it.")),
        ("wait", bool, typer.Option(False, "--wait", "-W", help="Block until the job ends; exit with its code.")),
        ("remote", str | None, RemoteOpt),
        (
            "remote_dir",
            str | None,
            typer.Option(
                None, "--remote-dir", help="Where snapshots and job dirs live on the login node [default: ~/.slurmgen]."
            ),
        ),
        (
            "code",
            Path | None,
            typer.Option(None, "--code", help="Ship this directory instead of the working tree (with --remote)."),
        ),
        ("ssh_config", str | None, SshConfigOpt),
        ("remote_setup", list[str], SetupOpt),
        ("as_json", bool, JsonOpt),
        # Which shape, and whether the cluster can run it at all (issue 36): kept together.
        (
            "shapes",
            str | None,
            typer.Option(
                None,
                "--shapes",
                metavar="NxG,...",
                help="Shapes to ask Slurm about (sbatch --test-only), e.g. 2x4,1x8,4x2: with --earliest the one "
                "expected to start first is submitted, with --dry-run the table is printed.",
            ),
        ),
        (
            "earliest",
            bool,
            typer.Option(False, "--earliest", help="Submit the shape of --shapes that Slurm expects to start first."),
        ),
        (
            "no_check",
            bool,
            typer.Option(
                False,
                "--no-check",
                help="Submit without first comparing the request with what the cluster has (partitions, nodes, "
                "GPUs, memory, features, time limit, accounts).",
            ),
        ),
    ]
    hints = typing.get_type_hints(create)
    params = [p.replace(annotation=hints[p.name]) for p in inspect.signature(create).parameters.values()]
    return inspect.Signature(
        [*params, *(inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=a) for n, a, d in own)]
    )


_CREATE_PARAMS: set[str] = set()


def register(app: typer.Typer) -> None:
    """Add `submit` to the `slurmgen` app, with create's flags followed by its own."""
    signature = _signature()
    _CREATE_PARAMS.update(
        name
        for name in signature.parameters
        if name
        not in {
            "registry",
            "dependency",
            "hold",
            "wait",
            "remote",
            "remote_dir",
            "code",
            "ssh_config",
            "remote_setup",
            "as_json",
            "shapes",
            "earliest",
            "no_check",
        }
    )
    submit.__signature__ = signature  # type: ignore[attr-defined]
    submit.__annotations__ = {name: p.annotation for name, p in signature.parameters.items()}
    app.command(context_settings={"allow_interspersed_args": False})(submit)
