"""The local run registry: one SQLite file, one row per run (a submitted Slurm job, an SSH
launch, a coordinator group's run: the run model of model.py), plus their attempts.

Lives under the user's state directory ($XDG_STATE_HOME/slurmgen/jobs.sqlite, by default
~/.local/state/slurmgen/jobs.sqlite); `--registry` or SLURMGEN_REGISTRY moves it. Only the
commands that start runs (`submit`, `launch`, `serve`) create it; reading commands open it
read-write but never create it, and a file that is not a SQLite database is refused with one
line, untouched. The last state seen for each job is kept,
so a job the controller has forgotten (and no accounting remembers) still shows how it ended.
Rows are numbered in submission order (`seq`): job ids repeat across clusters and after a
cluster's state is reset, and the newest job with an id is the one that id means. A job is
keyed by its cluster, id and submit time, so a reused id adds a row beside the older job's;
Slurm's answers for that id are about the newest (`superseded`), never about the older rows.
Files of the earlier shapes (one row per job id; no cluster column; Slurm jobs only) are
migrated on opening. The methods below are the Slurm lifecycle's (`status`, `logs`, `cancel`)
and see only rows of kind `slurm`; model.py reads and writes the run model of every kind.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmgen.contract import envvars
from slurmgen.contract.states import ACTIVE_WORDS, STOP_ASKED, State, from_slurm
from slurmgen.errors import SlurmgenError
from slurmgen.runs.trainer_records import record_dir

JOBS_TABLE = """
CREATE TABLE IF NOT EXISTS jobs (
    seq        INTEGER PRIMARY KEY,
    job_id     TEXT NOT NULL,
    name       TEXT NOT NULL,
    output_dir TEXT NOT NULL,
    remote     TEXT,
    submitted  REAL NOT NULL,
    last_state TEXT,
    last_exit  INTEGER,
    info       TEXT NOT NULL,
    cluster    TEXT NOT NULL DEFAULT ''
)
"""
# The run model's columns (model.py), added in place to files of earlier shapes: every row is a
# run of some kind; `state` is a contract/states.py word whatever `last_state` (Slurm's) says.
RUN_COLUMNS = (
    ("kind", "TEXT NOT NULL DEFAULT 'slurm'"),
    ("state", "TEXT"),
    ("nodes", "INTEGER"),
    ("ranks", "INTEGER"),
    ("started", "REAL"),
    ("ended", "REAL"),
    ("run_id", "TEXT"),
    ("record_dir", "TEXT"),
    ("logs", "TEXT NOT NULL DEFAULT '[]'"),
    ("failure", "TEXT"),
    ("attempt", "INTEGER"),
    ("state_seen", "REAL"),  # when Slurm last told a Slurm job's state (the list says how old a stale one is)
    ("attempt_started", "REAL"),  # when a Slurm job's current attempt started (its elapsed is held to the limit)
)
ATTEMPTS_TABLE = """
CREATE TABLE IF NOT EXISTS attempts (
    run     INTEGER NOT NULL REFERENCES jobs (seq) ON DELETE CASCADE,
    number  INTEGER NOT NULL,
    state   TEXT NOT NULL,
    started REAL NOT NULL,
    ended   REAL,
    cause   TEXT,
    rank    INTEGER,
    node    TEXT,
    code    INTEGER,
    PRIMARY KEY (run, number)
)
"""
INDEXES = """
CREATE UNIQUE INDEX IF NOT EXISTS jobs_key ON jobs (cluster, job_id, submitted);
CREATE INDEX IF NOT EXISTS jobs_job_id ON jobs (job_id);
CREATE INDEX IF NOT EXISTS jobs_name ON jobs (name);
CREATE INDEX IF NOT EXISTS jobs_output_dir ON jobs (output_dir);
"""
# What the list of runs filters and sorts by (runs.list_rows): newest first, by kind, by state.
RUN_INDEXES = """
CREATE INDEX IF NOT EXISTS jobs_started ON jobs (started);
CREATE INDEX IF NOT EXISTS jobs_kind_started ON jobs (kind, started);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state);
"""
_COLUMNS = "job_id, name, output_dir, remote, submitted, last_state, last_exit, info"


def default_path() -> Path:
    explicit = os.environ.get(envvars.REGISTRY)
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "slurmgen" / "jobs.sqlite"


@dataclass
class JobRecord:
    """A registered job. `info` holds the rest: cluster, digest, command, sweep, snapshot, ..."""

    job_id: str
    name: str
    output_dir: str
    submitted: float
    remote: str | None = None
    last_state: str | None = None
    last_exit: int | None = None
    info: dict[str, Any] = field(default_factory=dict)
    seq: int | None = None  # set by Registry.add

    @property
    def cluster(self) -> str:
        """Where the id was handed out: the login node it was submitted through, else the submitting host."""
        return self.remote or self.info.get("cluster") or ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "name": self.name,
            "output_dir": self.output_dir,
            "remote": self.remote,
            "submitted": self.submitted,
            "last_state": self.last_state,
            "last_exit": self.last_exit,
            **self.info,
        }


class Registry:
    """Open with `Registry.open(path, create=...)`; every method is one short transaction."""

    def __init__(self, path: Path, db: sqlite3.Connection):
        self.path, self.db = path, db

    @classmethod
    def open(cls, path: Path | None = None, *, create: bool = False) -> Registry:
        path = Path(path) if path is not None else default_path()
        if not path.exists() and not create:
            raise SlurmgenError(
                f"registry: no job registry at {str(path)!r} yet",
                hint="submit a job with `slurmgen submit` first, or pass --registry FILE",
            )
        if path.is_dir():
            raise SlurmgenError(f"registry: {str(path)!r} is a directory, not a registry file")
        try:
            if create:
                path.parent.mkdir(parents=True, exist_ok=True)
            # mode=rw never creates: a missing file is an error above, not a new empty database.
            uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode={'rwc' if create else 'rw'}"
            db = sqlite3.connect(uri, uri=True, timeout=10, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise SlurmgenError(f"registry: cannot open {str(path)!r}: {exc}") from None
        try:
            # Reading the schema fails on a file that is not SQLite, before anything is written.
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if tables and "jobs" not in tables:
                raise SlurmgenError(
                    f"registry: {str(path)!r} is a SQLite database but not a slurmgen registry (no jobs table)"
                )
            if "jobs" not in tables:
                db.executescript(JOBS_TABLE + ";" + INDEXES)
            _migrate(db)
        except sqlite3.DatabaseError as exc:
            db.close()
            raise SlurmgenError(
                f"registry: {str(path)!r} is not a job registry ({exc})",
                hint="pass --registry with another file; this one was left as it is",
            ) from None
        except BaseException:
            db.close()
            raise
        return cls(path, db)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def transaction(self, immediate: bool = False) -> AbstractContextManager[None]:
        """`with reg.transaction():` one atomic change (see `transaction` below)."""
        return transaction(self.db, immediate)

    def add(self, record: JobRecord) -> None:
        """Register a submitted Slurm job: its own columns and the run model's (see model.py)."""
        submitted = record.submitted or time.time()
        cursor = self.db.execute(
            f"INSERT INTO jobs ({_COLUMNS}, cluster, kind, state, nodes, ranks, run_id, record_dir, logs, started) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'slurm', ?, ?, ?, ?, ?, ?, ?)",
            (
                record.job_id,
                record.name,
                record.output_dir,
                record.remote,
                submitted,
                record.last_state,
                record.last_exit,
                json.dumps(record.info, sort_keys=True),
                record.cluster,
                *_slurm_run_columns(record.job_id, record.last_state, record.info, record.last_exit),
                submitted,
            ),
        )
        record.seq = cursor.lastrowid

    def add_many(self, records: Iterable[JobRecord]) -> None:
        with self.transaction():
            for r in records:
                self.add(r)

    @staticmethod
    def _record(row: tuple) -> JobRecord:
        seq, job_id, name, output_dir, remote, submitted, last_state, last_exit, info = row
        return JobRecord(job_id, name, output_dir, submitted, remote, last_state, last_exit, json.loads(info), seq)

    def _select(self, where: str = "", args: tuple = (), limit: int | None = None) -> list[JobRecord]:
        # The Slurm lifecycle's lookups: runs of the other kinds have no Slurm job behind them.
        sql = (
            f"SELECT seq, {_COLUMNS} FROM jobs WHERE kind = 'slurm' {'AND ' + where if where else ''} "
            "ORDER BY seq DESC" + (f" LIMIT {int(limit)}" if limit else "")
        )
        return [self._record(r) for r in self.db.execute(sql, args)]

    def all(self, limit: int | None = None) -> list[JobRecord]:
        return self._select(limit=limit)

    def get(self, job_id: str) -> JobRecord | None:
        """The newest job with this id."""
        found = self._select("job_id = ?", (job_id,), limit=1)
        return found[0] if found else None

    def with_id(self, job_id: str) -> list[JobRecord]:
        """Every job with this id, on any cluster, newest first."""
        return self._select("job_id = ?", (job_id,))

    def by_seq(self, seq: int) -> JobRecord | None:
        found = self._select("seq = ?", (seq,))
        return found[0] if found else None

    def superseded(self) -> dict[int, int]:
        """Rows whose cluster later gave their id to another job: row -> the newest such row.

        Slurm answers for an id with its newest job, so these rows keep their last seen state."""
        return dict(
            self.db.execute(
                "SELECT a.seq, MAX(b.seq) FROM jobs AS a JOIN jobs AS b "
                "ON b.cluster = a.cluster AND b.job_id = a.job_id AND b.seq > a.seq "
                "WHERE a.kind = 'slurm' AND b.kind = 'slurm' GROUP BY a.seq"
            )
        )

    def active(self) -> list[JobRecord]:
        """The Slurm jobs not known to have ended (pending, starting, running, or never told):
        the rows a refresh of the runs list asks Slurm about (jobs/refresh.py)."""
        words = sorted(ACTIVE_WORDS | {State.PENDING.value})
        return self._select(f"(state IS NULL OR state IN ({', '.join('?' * len(words))}))", tuple(words))

    def by_name(self, name: str) -> list[JobRecord]:
        return self._select("name = ?", (name,))

    def by_output_dir(self, output_dir: str) -> list[JobRecord]:
        return self._select("output_dir = ?", (output_dir,))

    def remember_states(
        self,
        states: dict[int, tuple[str, int | None]],
        ended: dict[int, float | None] | None = None,
        attempts: dict[int, int] | None = None,
        now: float | None = None,
        attempt_started: dict[int, float | None] | None = None,
    ) -> None:
        """Keep the last state (and exit code) seen, by row (`JobRecord.seq`), in one transaction,
        and (`now`) that Slurm told it then, changed or not, so a state is known fresh or stale;
        `ended`: when Slurm says a job ended (its EndTime), so an ended job's elapsed time is
        known (None: it runs again, after a requeue); `attempts`: the attempt Slurm says it is at
        (view.attempt), or its attempts record when further (in-job restarts), which the list of
        runs shows without asking Slurm: a run's attempt only ever rises, so Slurm's count, which
        knows no in-job restart, never takes back what the record said; `attempt_started`: when
        that attempt started (None: it has not, e.g. pending again after a requeue), whose elapsed
        time the list holds against the job's time limit, which is per attempt."""
        if not states and not ended and not attempts and not attempt_started:
            return
        with self.transaction():
            self.db.executemany(  # the second word: after a person's "checkpoint and stop" (STOP_ASKED)
                "UPDATE jobs SET last_state = ?, last_exit = ?, "
                f"state = CASE WHEN json_extract(info, '$.{STOP_ASKED}') IS NULL THEN ? ELSE ? END "
                "WHERE seq = ? AND (last_state IS NOT ? OR last_exit IS NOT ?)",
                [(s, c, _state_word(s, c), _state_word(s, c, True), seq, s, c) for seq, (s, c) in states.items()],
            )
            self.db.executemany(
                "UPDATE jobs SET ended = ? WHERE seq = ? AND ended IS NOT ?",
                [(t, seq, t) for seq, t in (ended or {}).items()],
            )
            self.db.executemany(
                "UPDATE jobs SET attempt = ? WHERE seq = ? AND (attempt IS NULL OR attempt < ?)",
                [(n, seq, n) for seq, n in (attempts or {}).items()],
            )
            self.db.executemany(
                "UPDATE jobs SET attempt_started = ? WHERE seq = ? AND attempt_started IS NOT ?",
                [(t, seq, t) for seq, t in (attempt_started or {}).items()],
            )
            if now is not None:
                self.db.executemany("UPDATE jobs SET state_seen = ? WHERE seq = ?", [(now, seq) for seq in states])

    def update_info(self, record: JobRecord) -> None:
        """Write back `record.info` (e.g. the signals `cancel --signal` sent, which `status` explains)."""
        self.db.execute("UPDATE jobs SET info = ? WHERE seq = ?", (json.dumps(record.info, sort_keys=True), record.seq))


def _migrate(db: sqlite3.Connection) -> None:
    """Bring a registry of an earlier shape to this one in one transaction, keeping every row.

    The first shape kept one row per job id (a reused id replaced the older job); the second
    numbered rows but had no cluster column; the third held Slurm jobs only, without the run
    model's columns and attempts; the fourth had no `attempt` column (a Slurm job's attempt,
    left NULL until Slurm is next asked); the fifth no `state_seen` (NULL: never told, as old as
    its submission). Rows are renumbered in submission order. A new file takes the
    same path from an empty table of the third shape, so there is one way to the current shape."""
    if _current(db):
        return
    with transaction(db, immediate=True):
        if not _current(db):  # another process may have migrated it while this one waited for the lock
            _add_cluster(db)
            _add_run_model(db)


@contextmanager
def transaction(db: sqlite3.Connection, immediate: bool = False) -> Iterator[None]:
    """One atomic change on `db` (opened with isolation_level=None): committed at the end, rolled
    back on any error. `immediate` takes the write lock at once (BEGIN IMMEDIATE), so that a
    read-then-write cannot lose to another writer. The one place the registry's transactions
    are spelt: the migration, the job commands' batch writes and the run recorder use it."""
    db.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _columns(db: sqlite3.Connection) -> set[str]:
    return {row[1] for row in db.execute("PRAGMA table_info(jobs)")}


def _current(db: sqlite3.Connection) -> bool:
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    return "attempts" in tables and {name for name, _ in RUN_COLUMNS} <= _columns(db)


def _add_cluster(db: sqlite3.Connection) -> None:
    """The first and second shapes: rows numbered in submission order, each with its cluster."""
    if "cluster" in _columns(db):
        return
    if "seq" not in _columns(db):
        db.execute("ALTER TABLE jobs RENAME TO jobs_by_id")
        for index in ("jobs_name", "jobs_output_dir"):  # they moved with the table; the new one gets its own
            db.execute(f"DROP INDEX IF EXISTS {index}")
        db.execute(JOBS_TABLE)
        db.execute(
            f"INSERT INTO jobs ({_COLUMNS}) SELECT {_COLUMNS} FROM jobs_by_id "
            "ORDER BY submitted, CAST(job_id AS INTEGER)"
        )
        db.execute("DROP TABLE jobs_by_id")
    else:
        db.execute("ALTER TABLE jobs ADD COLUMN cluster TEXT NOT NULL DEFAULT ''")
    rows = db.execute("SELECT seq, remote, info FROM jobs").fetchall()
    db.executemany(
        "UPDATE jobs SET cluster = ? WHERE seq = ?",
        [(remote or json.loads(info).get("cluster") or "", seq) for seq, remote, info in rows],
    )
    for statement in filter(str.strip, INDEXES.split(";")):
        db.execute(statement)


def _add_run_model(db: sqlite3.Connection) -> None:
    """The third shape (Slurm jobs only): the run columns, filled in from what each job kept."""
    have = _columns(db)
    for name, declaration in RUN_COLUMNS:
        if name not in have:
            db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {declaration}")
    db.execute(ATTEMPTS_TABLE)
    rows = db.execute("SELECT seq, job_id, last_state, info, last_exit FROM jobs WHERE started IS NULL").fetchall()
    db.executemany(
        "UPDATE jobs SET started = submitted, state = ?, nodes = ?, ranks = ?, run_id = ?, "
        "record_dir = ?, logs = ? WHERE seq = ?",
        [
            (*_slurm_run_columns(job_id, last_state, json.loads(info), code), seq)
            for seq, job_id, last_state, info, code in rows
        ],
    )
    for statement in filter(str.strip, RUN_INDEXES.split(";")):
        db.execute(statement)


def _state_word(slurm_state: str | None, exit_code: int | None = None, stop_asked: bool = False) -> str | None:
    state = from_slurm(slurm_state, exit_code, stop_asked)
    return state.value if state else None


def _slurm_run_columns(
    job_id: str, last_state: str | None, info: dict[str, Any], last_exit: int | None = None
) -> tuple:
    """(state, nodes, ranks, run_id, record_dir, logs) of a Slurm job: the run model's view of
    what it kept. run_id is the group run_slurm.sh gives the trainer's run records (slurm-<id>;
    each task of an array adds _N to it, so an array has no one record directory)."""
    nodes = info.get("nodes")
    ranks = nodes * (info.get("gpus") or 1) if isinstance(nodes, int) else None
    logs = [{"node": info.get("cluster") or "", "path": info["log_dir"]}] if info.get("log_dir") else []
    run_id = f"slurm-{job_id}"
    records = (
        record_dir(info["workdir"], info.get("command") or [], run_id, f"runs/job-{job_id}")
        if info.get("workdir") and not info.get("array")
        else None
    )
    return _state_word(last_state, last_exit, STOP_ASKED in info), nodes, ranks, run_id, records, json.dumps(logs)
