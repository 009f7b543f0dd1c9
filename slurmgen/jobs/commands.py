"""The job commands' work, apart from flag parsing: submit, wait, look up (cancel: stopping.py).

Each function takes plain values and a `Runner` (here or on a login node) and returns data;
`cli.py` prints it. Slurm is polled with `scontrol show job -o` every quarter second, not with
`sbatch --wait` (which polls at 2, 8, then 32 s: a 10 s job returned after 42 s here).
"""

from __future__ import annotations

import io
import re
import socket
import tarfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from slurmgen.contract import envvars
from slurmgen.contract import grid as sweeps
from slurmgen.contract.attempts import attempt_number
from slurmgen.contract.exitcodes import FAILED
from slurmgen.contract.files import ATTEMPTS_NAME, TIMELINE_NAME
from slurmgen.contract.states import State, from_slurm
from slurmgen.errors import SlurmgenError
from slurmgen.heal.attempts import job_failure, parse_attempts
from slurmgen.jobs.logs import log_path, tasks_on_node
from slurmgen.jobs.query import ask
from slurmgen.jobs.remote_records import by_group
from slurmgen.jobs.resolve import reused_note
from slurmgen.jobs.slurm import QueryResult, SlurmJob, expand_tasks
from slurmgen.jobs.slurm_runner import Runner
from slurmgen.jobs.view import attempt, attempt_start, ended_at, job_view, overall, task_row
from slurmgen.runs.model import get_row, keep_failures
from slurmgen.runs.registry import JobRecord, Registry
from slurmgen.runs.trainer_records import group_of

if TYPE_CHECKING:  # rendering (jinja2, msgspec) is loaded by submit only: status stays quick
    from slurmgen.generate.render import Rendered
    from slurmgen.runs.model import RunRow

POLL = 0.25
UNANSWERED = 30.0  # seconds of failing scontrol calls that `wait` rides out
DEPENDENCY = re.compile(
    r"^([a-z]+(:[0-9]+(_[0-9]+)?(\+[0-9]+)?)+|singleton)([,?]([a-z]+(:[0-9]+(_[0-9]+)?(\+[0-9]+)?)+|singleton))*$"
)
_PARSABLE = re.compile(r"^([1-9][0-9]*)(;\S+)?$")


def sbatch_args(dependency: str | None, hold: bool) -> list[str]:
    if dependency is not None and not DEPENDENCY.match(dependency):
        raise SlurmgenError(
            f"dependency: expected sbatch's form TYPE:ID[:ID...], e.g. afterok:1234 (got {dependency!r})"
        )
    return ["--parsable", *([f"--dependency={dependency}"] if dependency else []), *(["--hold"] if hold else [])]


def job_id_from(result_out: str, result_err: str, code: int) -> str:
    """The id `sbatch --parsable` printed ('123' or '123;cluster'), or its error as one line."""
    line = result_out.strip().splitlines()[-1] if result_out.strip() else ""
    m = _PARSABLE.match(line)
    if code != 0 or not m:
        said = [x.strip() for x in result_err.splitlines() if x.strip()]  # the last line is the verdict
        raise SlurmgenError(
            f"sbatch: {(said[-1].removeprefix('sbatch: ') if said else line) or f'exit code {code}'}", exit_code=FAILED
        )
    return m.group(1)


def job_tar(rendered: Rendered, extra: dict[str, bytes]) -> bytes:
    """The rendered files under OUTPUT_DIR plus `extra`, as a tar for the remote job dir."""
    out = PurePosixPath(rendered.spec.output_dir)
    if out.is_absolute() or ".." in out.parts or (rendered.spec.log_dir or "").startswith("/"):
        raise SlurmgenError(
            f"output_dir: with --remote give a path inside the job's directory (got {rendered.spec.output_dir!r})"
        )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        files = {str(out / name): text.encode() for name, text in rendered.files.items()} | extra
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def record_for(job_id: str, rendered: Rendered, workdir: str, remote: str | None, extra: dict[str, Any]) -> JobRecord:
    """What the registry keeps of a new job; paths absolute on the machine that runs it."""
    spec = rendered.spec
    base = PurePosixPath(workdir)
    n_points = len(sweeps.points(spec.sweep))
    info = {
        "cluster": remote or socket.gethostname(),
        "digest": spec.digest(),
        "command": list(spec.command),
        "nodes": spec.nodes,
        "gpus": spec.gpus,
        "launcher": spec.launcher,
        "workdir": workdir,
        "log_dir": str(base / spec.logs),
        "array": n_points or (spec.array or None),
        "time_limit": spec.time,
        "sweep_file": str(base / spec.output_dir / sweeps.SWEEP_FILE) if n_points else None,
        "preempt_signal": spec.preempt_signal,
        "preempt_contract": spec.env.get(envvars.PREEMPT_CONTRACT) == "1",
        # In-job restarts, which Slurm's restart count never sees: the list reads their attempt
        # from the attempts record (refresh.attempt_here).
        "restarts": spec.restarts or None,
        **extra,
    }
    return JobRecord(job_id, spec.job_name, str(base / spec.output_dir), time.time(), remote, "PENDING", None, info)


def submit(
    runner: Runner,
    registry: Registry,
    rendered: Rendered,
    workdir: str,
    args: list[str],
    remote: str | None,
    extra: dict[str, Any],
) -> JobRecord:
    """sbatch the rendered script from `workdir` and register the job."""
    from slurmgen.generate.render import SLURM_SCRIPT

    script = str(PurePosixPath(rendered.spec.output_dir) / SLURM_SCRIPT)
    res = runner.run(["sbatch", *args, script], cwd=workdir, timeout=60)
    record = record_for(job_id_from(res.out, res.err, res.code), rendered, workdir, remote, extra)
    registry.add(record)
    return record


def wait(
    runner: Runner,
    record: JobRecord,
    timeout: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    registry: Registry | None = None,
) -> tuple[str, int]:
    """Poll until the job (every task of an array) has ended; its state and exit code, also kept
    in `registry` (with its end time and attempt, see `remember`)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    unanswered_since = None
    while True:
        snap = ask(runner, [record.job_id], accounting=False)
        jobs = all_tasks(snap, record)
        if jobs and all(j.ended for j in jobs):
            state, code = overall(jobs)
            if registry is not None:
                remember(registry, record, jobs, state, code)
            return state, code if code is not None else FAILED
        if not jobs and not snap.notes:
            raise SlurmgenError(f"wait: Slurm no longer knows job {record.job_id}", exit_code=FAILED)
        # scontrol itself failed (a busy controller times out now and then): ask again, for a while.
        unanswered_since = (unanswered_since or time.monotonic()) if not jobs else None
        if unanswered_since is not None and time.monotonic() - unanswered_since > UNANSWERED:
            raise SlurmgenError(f"wait: job {record.job_id}: {snap.notes[0]}", exit_code=FAILED)
        if deadline is not None and time.monotonic() > deadline:
            raise SlurmgenError(
                f"wait: job {record.job_id} still {overall(jobs)[0]} after {timeout:g}s", exit_code=FAILED
            )
        sleep(POLL)


def all_tasks(snap: QueryResult, record: JobRecord) -> list[SlurmJob]:
    """The job's lines in `snap`, with an array's not-yet-started range split into single tasks."""
    if not record.info.get("array"):
        job = snap.jobs.get(record.job_id)
        return [job] if job else []
    out: list[SlurmJob] = []
    for job in snap.tasks_of(record.job_id):
        if job.array_task and not job.array_task.isdigit():
            out += [
                SlurmJob(
                    job_id=job.job_id,
                    name=job.name,
                    state=job.state,
                    reason=job.reason,
                    array_job_id=record.job_id,
                    array_task=t,
                    limit=job.limit,
                )
                for t in expand_tasks(job.array_task)
            ]
        else:
            out.append(job)
    return out


def _read_text(runner: Runner, path: str) -> str | None:
    data = runner.read(path)
    return None if data is None else data.decode(errors="replace")


def _sweep_params(runner: Runner, record: JobRecord) -> dict[str, dict[str, Any]]:
    path = record.info.get("sweep_file")
    text = _read_text(runner, path) if path else None
    return {str(task): params for task, params in sweeps.parse_grid(text or "").items()}


def _attempts(runner: Runner, record: JobRecord, own_id: str) -> list[dict[str, Any]]:
    """The attempts record of a job or array task, named by its own SLURM_JOB_ID (heal/attempts.py).

    An array task has an id of its own besides ARRAY_TASK, and keeps it when requeued, as a
    job does; so each task's attempts are in their own file, found through the id Slurm gives
    a task once it has started (the not yet started ones share the array's id and have none)."""
    text = _read_text(runner, str(PurePosixPath(record.info["log_dir"]) / ATTEMPTS_NAME.format(job_id=own_id)))
    return parse_attempts(text) if text else []


def _time_report(
    runner: Runner, record: JobRecord, attempts: list[dict[str, Any]], ended: float | None, unknown: bool = False
) -> dict[str, Any]:
    """Stragglers and goodput (and the per-rank timeline when asked) from the ranks' timeline
    file beside the logs (contract/phases.py) and the attempts record, up to the job's end
    (`ended`, Slurm's) or, while it runs, now: a cancelled job's last attempt records no end, and
    counted to now its goodput fell with every later look. `unknown`: Slurm did not answer and
    nothing kept says when the job ended, so the records' last line does: counted to now, a job
    looked at after its cluster was gone read 20% where it had trained 84% of its time."""
    from slurmgen.observe.report import analyse

    text = _read_text(runner, str(PurePosixPath(record.info["log_dir"]) / TIMELINE_NAME.format(job_id=record.job_id)))
    return analyse(text or "", attempts, record.submitted, ended or (None if unknown else time.time()))


def _kept_time_report(
    runner: Runner,
    registry: Registry,
    record: JobRecord,
    attempts: list[dict[str, Any]],
    with_timeline: bool,
    ended: float | None,
    unknown: bool = False,
) -> dict[str, Any]:
    """The time report, its stragglers and goodput also written into the job's registry row (the
    run record keeps them after the log directory is gone)."""
    from slurmgen.runs.model import keep_time_report

    found = _time_report(runner, record, attempts, ended, unknown)
    if record.seq is not None and (found.get("stragglers") or found.get("goodput")):
        keep_time_report(registry, record.seq, found)
    if not with_timeline:
        found.pop("timeline", None)
    return found


def status(
    runner: Runner, registry: Registry, record: JobRecord, task: str | None, with_timeline: bool = False
) -> dict[str, Any]:
    """Everything `slurmgen status JOB` shows, as one dict."""
    reused = reused_note(registry, record)
    snap = QueryResult(notes=[reused]) if reused else ask(runner, [record.job_id], steps=True)
    jobs = {j.key: j for j in all_tasks(snap, record)}
    is_array = bool(record.info.get("array"))
    keys: list[str | None]  # array task ids; [None]: the job itself
    if is_array:
        params = _sweep_params(runner, record)
        ids = sorted({*(k.split("_", 1)[1] for k in jobs), *params}, key=lambda t: int(t) if t.isdigit() else -1)
        keys = [task] if task is not None else [*ids]
    else:
        params, keys = {}, [None]
    groups = {group_of(record.job_id, t) for t in keys}
    runs = by_group(runner, record.info["workdir"], record.info.get("command") or [], record.job_id, groups)
    rows, dropped = [], []
    for t in keys:
        key = f"{record.job_id}_{t}" if t is not None else record.job_id
        job = jobs.get(key)
        gone = _dropped(runner, record, t) if job is None and t is not None and jobs and not snap.notes else None
        job = job or gone
        # A log is read only where it can explain something: a task that failed.
        failed = job is not None and job.ended and job.state != "COMPLETED"
        log = _read_text(runner, log_path(record, t)) if failed or not is_array else None
        rows.append(
            task_row(
                key, job, record, params.get(t) if t is not None else None, log, runs.get(group_of(record.job_id, t))
            )
        )
        if gone is not None:  # it never ran: no exit code, and said so
            rows[-1]["exit_code"] = None
            dropped.append(f"{key}: {gone.source.removeprefix('slurm: ')}")
        if is_array and job is not None and job.job_id.isdigit() and (job.state != "PENDING" or job.restarts):
            rows[-1]["attempts"] = _attempts(runner, record, job.job_id)
    attempts = [] if is_array else _attempts(runner, record, record.job_id)
    view = job_view(record, snap, rows, attempts)
    view["notes"] += dropped
    if not is_array and record.info.get("log_dir"):
        ended = _ended(registry, record, jobs)
        unknown = not jobs and bool(snap.notes) and ended is None  # Slurm did not answer for it
        view.update(_kept_time_report(runner, registry, record, attempts, with_timeline, ended, unknown))
        if unknown and view.get("goodput"):
            view["notes"].append("goodput is counted to the job's last record: nothing says when it ended")
    if task is not None and is_array:
        view.update({k: v for k, v in rows[0].items() if k != "job"}, job=rows[0]["job"])
    remember(registry, record, list(jobs.values()), view["state"], view.get("exit_code"), attempts)
    return view


def _ended(registry: Registry, record: JobRecord, jobs: Mapping[str, SlurmJob]) -> float | None:
    """When the job ended: Slurm's word now, else (Slurm out of reach, or giving no end time) what
    it said last, kept in the registry; None while it runs or when nothing is known."""
    known, end = ended_at(list(jobs.values()))
    if known:
        return end
    row = get_row(registry, record.seq) if record.seq is not None else None
    return row["ended"] if row else None


def _dropped(runner: Runner, record: JobRecord, task: str) -> SlurmJob | None:
    """An array task Slurm no longer lists while it answers for the array, and whose log was
    never written: cancelled while pending (Slurm drops a pending task that scancel names, as a
    chain's later links are when the run ended), so it never ran. Not the registry's last state
    of the array (PENDING), which it will never leave."""
    if runner.read(log_path(record, task)) is not None:
        return None  # it ran: only its record is gone (MinJobAge, no accounting)
    return SlurmJob(
        job_id=f"{record.job_id}_{task}",
        state="CANCELLED",
        array_job_id=record.job_id,
        array_task=task,
        source="slurm: no longer listed and no log: cancelled before it started, it never ran",
    )


def remember(
    registry: Registry,
    record: JobRecord,
    jobs: list[SlurmJob],
    state: str,
    code: int | None,
    attempts: list[dict[str, Any]] | None = None,
) -> None:
    """Keep what Slurm just said of the job in its row: state, exit code, end time, attempt and
    when it started, which the list of runs shows without asking Slurm (`jobs` keeps them for many
    jobs at once), and, given its attempts record, its first failure (the failed rank the list names).
    The attempt is the attempts record's when it is further, as after in-job restarts."""
    if not jobs or record.seq is None:
        return
    known, end = ended_at(jobs)
    numbers = [attempt(jobs), *(attempt_number(r) for r in attempts or [])]
    number = max([n for n in numbers if n is not None], default=None)
    now = time.time()
    began, start = attempt_start(jobs, now)
    registry.remember_states(
        {record.seq: (state, code)},
        {record.seq: end} if known else None,
        {record.seq: number} if number is not None else None,
        now,  # Slurm told it just now: not stale, as a refresh would keep it
        attempt_started={record.seq: start} if began else None,
    )
    if attempts is not None and not record.info.get("array"):  # an array's: each task's, on its page
        failed = from_slurm(state, code) is State.FAILED
        keep_failures(registry, {record.seq: job_failure(attempts) if failed else None})


def file_status(path: Path) -> dict[str, Any]:
    """`slurmgen status FILE --timeline`: a timeline file read as it is, for a run no registry
    row names (launch_multi_node.sh run by hand registers nothing: it runs on the nodes, each
    node on its own, where the registry is out of reach; its ranks append to the file that
    SLURMGEN_TIMELINE_FILE names). Goodput spans the file's first line to its last: nothing else
    is known of the run (no submission, no end but what the ranks and launchers wrote)."""
    from slurmgen.observe.report import analyse

    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise SlurmgenError(f"status: cannot read the timeline file {str(path)!r}: {e.strerror or e}") from None
    return {"job": str(path), **analyse(text, [], None, None)}


def run_status(reg: Registry, row: RunRow, with_timeline: bool) -> dict[str, Any]:
    """`slurmgen status` of a launch or group run: its row, and where its time went from the
    timeline file its row names (read on this machine; else what the launcher kept at its end)."""
    from slurmgen.runs.model import attempts_of, recoveries_of, time_report
    from slurmgen.runs.outcome import failure_of, stop_of

    view = {
        "job": row["job_id"],
        **{k: row[k] for k in ("kind", "name", "state", "run_id", "nodes", "ranks", "started", "ended")},
        # a person's stop is no failure: it is said as such, with its raw code (runs/outcome.py)
        "failure": failure_of(row["state"], row["failure"]),
        "stopped": stop_of(row["state"], row["last_exit"], row["failure"]),
        "exit_code": row["last_exit"],
        "attempts": attempts_of(reg, row["seq"]),
        # a launch's warm restarts and nodes moved to spare hosts, by attempt
        "recoveries": {str(n): whats for n, whats in sorted(recoveries_of(row["info"]).items())},
    }
    timeline = row["info"].get("timeline")
    found = time_report(reg, row["seq"], timeline, time.time()) if timeline else {}
    view.update({k: row["info"][k] for k in ("stragglers", "goodput") if k in row["info"]}, timeline_file=timeline)
    view.update(found)
    if not with_timeline:
        view.pop("timeline", None)
    return view


def run_lines(view: dict[str, Any]) -> list[str]:
    """The text of `slurmgen status` for a launch or group run."""
    from slurmgen.observe.report import lines
    from slurmgen.runs.model import size

    code = "" if view["exit_code"] is None else f", exit code {view['exit_code']}"
    shape = size(view["nodes"], view["ranks"])
    out = [
        f"{view['kind']} {view['job']} ({view['name']}): {view['state']}{code}, {shape or 'size unknown'}, "
        f"{len(view['attempts'])} attempt(s), run id {view['run_id']}"
    ]
    if view.get("failure"):
        out.append(f"  first failure: {view['failure'].get('cause')}")
    elif view.get("stopped"):
        out.append(f"  {State.STOPPED}: {view['stopped']['what']}")
    out += [f"  attempt {n}: {what}" for n, whats in (view.get("recoveries") or {}).items() for what in whats]
    return out + lines(view)


def node_tasks(runner: Runner, record: JobRecord, task: str | None, node: str) -> set[int]:
    """The srun task ids of the job's (or array task's) node given by index (0, 1, ...) or by name."""
    from slurmgen.generate.hostlist import expand

    count, per_node = int(record.info.get("nodes", 1)), int(record.info.get("gpus", 1))
    if node.isdigit():
        index = int(node)
    else:
        job = ask(runner, [record.job_id]).jobs.get(f"{record.job_id}_{task}" if task is not None else record.job_id)
        names = expand(job.nodes) if job and job.nodes else []
        if node not in names:
            raise SlurmgenError(
                f"node: {node!r} is not a node of job {record.job_id} (its nodes: {', '.join(names) or 'unknown'})"
            )
        index = names.index(node)
    if not 0 <= index < count:
        raise SlurmgenError(f"node: job {record.job_id} has nodes 0-{count - 1} (got {node})")
    return tasks_on_node(index, per_node, record.info.get("launcher", "srun"))
