"""A chain (`slurmgen submit --chain K`): a run longer than the time limit as K Slurm jobs, its
links, each resuming the checkpoint of the one before it.

Each link is an ordinary job of the registry (its own id, log, attempts and state: `logs`,
`status --timeline` and requeue work on it as on any job), its row marked with `info["chain"]`:
the chain's id (its first link's), every link's id in order, and which link it is. So `jobs` and
the runs page list the links as rows of their own, side by side, each saying which link of which
chain it is; `status` of any link shows every link and why the chain ended; `cancel` of any link
cancels them all. One row for the whole chain would need a state, a log and attempts made up of
K jobs', which no other command knows how to show.

The links follow one another with `--dependency=afterany:PREV`, not `singleton`: singleton keys
on the job name and user, so two chains of one name (a spec submitted twice) would wait on each
other, and any job of that name would hold a chain up. With a sweep each link is the whole array
and the next one waits for every task of it (`afterany` on an array; Slurm has no dependency on
one task that also holds after a failure, and singleton cannot tell the tasks of an array apart),
while each task's chain still ends on its own: its later tasks are cancelled one by one.
What a link does at its end (go on, or end the chain and cancel the links after it) is
run_slurm.sh's (templates/run_slurm_chain.sh.j2), which reads the links' ids from the file
`submit` writes beside the logs (contract/files.py's CHAIN_JOBS_NAME) before the first link is
released.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from slurmgen.contract import envvars
from slurmgen.contract.exitcodes import FAILED
from slurmgen.contract.files import CHAIN_ENDED_NAME, CHAIN_JOBS_NAME
from slurmgen.errors import SlurmgenError
from slurmgen.jobs.commands import all_tasks, job_id_from, record_for
from slurmgen.jobs.query import ask
from slurmgen.jobs.slurm_runner import Runner
from slurmgen.jobs.view import overall
from slurmgen.runs.registry import JobRecord, Registry

if TYPE_CHECKING:
    from slurmgen.generate.render import Rendered


def links_of(record: JobRecord) -> list[str]:
    """The job ids of the chain `record` is a link of, in order ([]: not a chain)."""
    chain = record.info.get("chain") or {}
    return [str(job) for job in chain.get("links") or []]


def submit_job(
    runner: Runner,
    registry: Registry,
    rendered: Rendered,
    workdir: str,
    args: list[str],
    remote: str | None,
    extra: dict[str, Any],
) -> JobRecord:
    """One job, or the links of a chain: the record by which every command finds it (a chain's
    first link). What `slurmgen submit` (here and --remote) and `Job.submit()` all call."""
    from slurmgen.jobs import commands

    if rendered.spec.chain == 1:
        return commands.submit(runner, registry, rendered, workdir, args, remote, extra)
    return submit(runner, registry, rendered, workdir, args, remote, extra)[0]


def submit(
    runner: Runner,
    registry: Registry,
    rendered: Rendered,
    workdir: str,
    args: list[str],
    remote: str | None,
    extra: dict[str, Any],
) -> list[JobRecord]:
    """sbatch the spec's `chain` links from `workdir` and register each. The first is submitted
    held (unless `args` holds it already) and released once every link is submitted and their ids
    written where the links read them: no link can end before it knows the ones after it. A link
    sbatch refuses cancels the ones already submitted, so that no half chain is left."""
    from slurmgen.generate.render import SLURM_SCRIPT

    spec = rendered.spec
    script = str(PurePosixPath(spec.output_dir) / SLURM_SCRIPT)
    held = "--hold" in args
    ids: list[str] = []
    try:
        for _ in range(spec.chain):
            argv = (
                [*args, *([] if held else ["--hold"])]
                if not ids
                else ["--parsable", f"--dependency=afterany:{ids[-1]}", f"--export=ALL,{envvars.CHAIN}={ids[0]}"]
            )
            res = runner.run(["sbatch", *argv, script], cwd=workdir, timeout=60)
            ids.append(job_id_from(res.out, res.err, res.code))
        _write_links(runner, workdir, spec.logs, ids)
        if not held:
            res = runner.run(["scontrol", "release", ids[0]], timeout=30)
            if res.code != 0:
                raise SlurmgenError(
                    f"scontrol release {ids[0]}: {' '.join(res.err.split()) or res.code}", exit_code=FAILED
                )
    except SlurmgenError as exc:
        if ids:
            runner.run(["scancel", *ids], timeout=30)
            raise SlurmgenError(
                f"{exc} (the chain's links {' '.join(ids)} were cancelled)", exit_code=exc.exit_code
            ) from None
        raise
    records = [
        record_for(job, rendered, workdir, remote, {**extra, "chain": {"id": ids[0], "links": ids, "link": n}})
        for n, job in enumerate(ids, 1)
    ]
    registry.add_many(records)
    return records


def _link(registry: Registry, record: JobRecord, job: str) -> JobRecord | None:
    """Link `job` of `record`'s chain, as the registry keeps it (an id reused later is another job)."""
    chain = record.info["chain"]["id"]
    return next((r for r in registry.with_id(job) if (r.info.get("chain") or {}).get("id") == chain), None)


def _write_links(runner: Runner, workdir: str, logs: str, ids: list[str]) -> None:
    path = str(PurePosixPath(workdir) / logs / CHAIN_JOBS_NAME.format(job_id=ids[0]))
    text = "".join(f"{job}\n" for job in ids).encode()
    res = runner.run(["sh", "-c", 'mkdir -p -- "${1%/*}" && cat >"$1"', "sh", path], stdin=text, timeout=30)
    if res.code != 0:
        raise SlurmgenError(f"chain: cannot write {path}: {' '.join(res.err.split()) or res.code}", exit_code=FAILED)


def view(runner: Runner, registry: Registry, record: JobRecord) -> dict[str, Any]:
    """The chain of a link as `status` shows it: every link's state and exit code (Slurm's, else
    the registry's last word) and why the chain ended, as the link that ended it wrote (None:
    it has not, or it is a sweep's, which ends per task: each task's own status says)."""
    ids = links_of(record)
    snap = ask(runner, ids)
    links = []
    for n, job in enumerate(ids, 1):
        link = _link(registry, record, job)
        tasks = all_tasks(snap, link) if link is not None else []
        state, code = overall(tasks) if tasks else ((link.last_state, link.last_exit) if link else (None, None))
        seq = link.seq if link is not None else None
        links.append({"link": n, "job": job, "seq": seq, "state": state or "UNKNOWN", "exit_code": code})
    ended = None
    if not record.info.get("array") and record.info.get("log_dir"):
        data = runner.read(str(PurePosixPath(record.info["log_dir"]) / CHAIN_ENDED_NAME.format(job_id=ids[0])))
        ended = data.decode(errors="replace").strip() or None if data is not None else None
    return {"id": ids[0], "link": record.info["chain"]["link"], "links": links, "ended": ended}


def lines(chain: dict[str, Any]) -> list[str]:
    """The text of a chain's view."""
    states = ", ".join(
        f"{link['job']} {link['state']}" + (f" (exit {link['exit_code']})" if link["exit_code"] else "")
        for link in chain["links"]
    )
    out = [f"chain {chain['id']}: link {chain['link']} of {len(chain['links'])}; links: {states}"]
    return out + ([f"  chain ended: {chain['ended']}"] if chain["ended"] else [])


def live_link(runner: Runner, registry: Registry, record: JobRecord) -> JobRecord:
    """The link of `record`'s chain that a cancel or a signal is for: the first one Slurm does not
    say has ended (the running one, or the next to start); `record` itself when all have."""
    ids = links_of(record)
    snap = ask(runner, ids, accounting=False)
    for job in ids:
        link = _link(registry, record, job)
        tasks = all_tasks(snap, link) if link is not None else []
        if link is not None and tasks and not all(t.ended for t in tasks):
            return link
    return record


def cancel_others(runner: Runner, live: JobRecord) -> list[str]:
    """scancel every link of the chain but `live` (which the caller cancels and waits for); the
    ids sent. A link that has ended already is no error: Slurm says so and nothing changes."""
    others = [job for job in links_of(live) if job != live.job_id]
    if others:
        runner.run(["scancel", *others], timeout=30)
    return others
