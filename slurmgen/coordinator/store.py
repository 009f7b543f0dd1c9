"""The coordinator's state in one SQLite file (WAL): the only module that speaks SQL.

Workers, groups with their config, every attempt (start, end, reason, per-rank exit codes,
the rank plan) and the recent output lines survive a server restart. What does not need to
survive stays out: when each agent was last heard is kept in memory by the service, so a
heartbeat that changes nothing writes nothing. Callers serialise access (one lock in the
service); the connection is shared across the server's threads for that reason.

Every heartbeat reads the active attempts, so the store keeps them decoded between the changes
of any attempt (this object is the file's only writer); and it trims a group's output lines on
the server's tick, not at every heartbeat that brings some: a heartbeat's work does not grow
with the history (attempts, runs, lines) or the size of the plans.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypedDict, cast

from slurmgen.contract.states import State

SCHEMA = """
CREATE TABLE IF NOT EXISTS workers (
    name TEXT PRIMARY KEY, host TEXT NOT NULL, idx INTEGER NOT NULL, grp TEXT,
    state TEXT NOT NULL DEFAULT 'idle', pid INTEGER, exit_code INTEGER,
    run_group TEXT, run_attempt INTEGER
);
CREATE INDEX IF NOT EXISTS workers_host ON workers(host);
CREATE TABLE IF NOT EXISTS groups (
    name TEXT PRIMARY KEY, state TEXT NOT NULL DEFAULT 'idle', config TEXT NOT NULL,
    attempt INTEGER, restarts INTEGER NOT NULL DEFAULT 0, reason TEXT, exit_code INTEGER
);
CREATE TABLE IF NOT EXISTS attempts (
    grp TEXT NOT NULL, number INTEGER NOT NULL, state TEXT NOT NULL, started REAL NOT NULL,
    ended REAL, reason TEXT, exit_code INTEGER, plan TEXT NOT NULL,
    exit_codes TEXT NOT NULL DEFAULT '{}', runs TEXT NOT NULL DEFAULT '[]', blamed TEXT,
    stopped_workers TEXT NOT NULL DEFAULT '[]', PRIMARY KEY (grp, number)
);
CREATE TABLE IF NOT EXISTS logs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, grp TEXT NOT NULL, attempt INTEGER NOT NULL,
    rank INTEGER NOT NULL, worker TEXT NOT NULL, time REAL NOT NULL, line TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS logs_grp ON logs(grp, id);
"""


class _Plan(TypedDict):
    """What an attempt runs, fixed when it starts (a later config change does not touch it)."""

    ranks: dict[str, int]  # worker name -> its rank
    env: dict[str, dict[str, str]]  # worker name -> its rank's environment
    argv: list[str]
    cwd: str | None
    stop_grace: float
    heartbeat_timeout: float


class _Warm(TypedDict):
    generation: int  # the world its ranks are in now: 0 until its first warm restart
    at: float | None  # when the last warm restart was ordered
    workers: dict[str, int]  # worker name -> the generation its rank was last started in (0: absent)
    told: list[str]  # each warm restart in words, in order


class Warm(_Warm, total=False):
    """An attempt's warm restarts so far (GroupConfig.restart_mode warm, contract/warm.py), and
    where each one's rank went on, once its agent said (absent until then)."""

    took: dict[str, str]  # generation -> "HOST's warm spare (pid N)"


class Plan(_Plan, total=False):
    """An attempt's plan with its spare nodes (GroupConfig.spare_nodes), absent from plans stored
    before them, and its warm restarts (present when its group restarts warm)."""

    moved: dict[str, str]  # node -> the spare its node rank runs on now
    spares: list[str]  # the nodes free to take a failed node's ranks, in the order they are taken
    moves: list[str]  # the moves made before it started, in words
    dropped: list[str]  # the nodes a smaller world left out (GroupConfig.min_nodes), absent before it
    warm: Warm


# One row of each table as `Store` returns it: the columns (a test keeps them equal to SCHEMA's),
# the JSON columns decoded.
class WorkerRow(TypedDict):
    name: str  # <host>-<idx>
    host: str
    idx: int
    grp: str | None
    state: str
    pid: int | None
    exit_code: int | None
    run_group: str | None
    run_attempt: int | None


class GroupRow(TypedDict):
    name: str
    state: str
    config: dict[str, Any]  # models.GroupConfig's fields, as saved
    attempt: int | None
    restarts: int
    reason: str | None
    exit_code: int | None


class AttemptRow(TypedDict):
    grp: str
    number: int
    state: str
    started: float
    ended: float | None
    reason: str | None
    exit_code: int | None
    plan: Plan
    exit_codes: dict[str, int]  # worker name -> its exit code, in the order they came
    runs: list[str]  # the run records its ranks announced
    blamed: str | None  # the worker whose rank it failed on (the verdict's: exit, hang or loss)
    stopped_workers: list[str]  # the other workers still running when it ended: stopped by its end, not failed


class LineRow(TypedDict):
    id: int
    grp: str
    attempt: int
    rank: int
    worker: str
    time: float
    line: str


# Output lines kept per group (older ones are dropped; the agents keep full per-rank files).
LOG_LINES_KEPT = 5000
JSON_COLUMNS = {"config", "plan", "exit_codes", "runs", "stopped_workers"}
# Columns added since the first release: (table, column, definition), added to an older file.
ADDED_COLUMNS = [
    ("attempts", "runs", "TEXT NOT NULL DEFAULT '[]'"),
    ("attempts", "blamed", "TEXT"),
    ("attempts", "stopped_workers", "TEXT NOT NULL DEFAULT '[]'"),
]


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        for table, column, definition in ADDED_COLUMNS:
            if column not in {r["name"] for r in self.db.execute(f"PRAGMA table_info({table})")}:
                self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
        self.path.chmod(0o600)
        self._active: list[AttemptRow] | None = None  # active_attempts(), until an attempt changes
        self._untrimmed: set[str] = set()  # groups given lines since the last trim_lines()
        self._trimmed_to: dict[str, int] = {}  # group -> the newest id trim_lines() let go (this process)

    def close(self) -> None:
        self.db.close()

    def transaction(self) -> _Transaction:
        return _Transaction(self)

    def forget_cached(self) -> None:
        """Read the active attempts from the file again next time (an attempt changed, or a
        transaction that may have changed one was rolled back)."""
        self._active = None

    # --- rows -----------------------------------------------------------------------------
    def _rows(self, sql: str, args: Iterable[Any] = ()) -> list[dict[str, Any]]:
        """The rows as dicts, the JSON columns decoded: the public methods give them their table's shape."""
        rows = []
        for r in self.db.execute(sql, tuple(args)):
            row = dict(r)
            for k in JSON_COLUMNS & row.keys():
                row[k] = json.loads(row[k])
            rows.append(row)
        return rows

    def _one(self, sql: str, args: Iterable[Any] = ()) -> dict[str, Any] | None:
        rows = self._rows(sql, args)
        return rows[0] if rows else None

    def _update(self, table: str, keys: dict[str, Any], **values: Any) -> None:
        sets = ", ".join(f"{k} = ?" for k in values)
        where = " AND ".join(f"{k} = ?" for k in keys)
        args = [json.dumps(v) if k in JSON_COLUMNS else v for k, v in values.items()]
        self.db.execute(f"UPDATE {table} SET {sets} WHERE {where}", (*args, *keys.values()))

    # --- workers ----------------------------------------------------------------------------
    def workers(self, host: str | None = None, group: str | None = None) -> list[WorkerRow]:
        if host is not None:
            rows = self._rows("SELECT * FROM workers WHERE host = ? ORDER BY idx", (host,))
        elif group is not None:
            rows = self._rows("SELECT * FROM workers WHERE grp = ? ORDER BY host, idx", (group,))
        else:
            rows = self._rows("SELECT * FROM workers ORDER BY host, idx")
        return cast("list[WorkerRow]", rows)

    def worker(self, name: str) -> WorkerRow | None:
        return cast("WorkerRow | None", self._one("SELECT * FROM workers WHERE name = ?", (name,)))

    def add_worker(self, host: str, idx: int) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO workers (name, host, idx) VALUES (?, ?, ?)", (f"{host}-{idx}", host, idx)
        )

    def update_worker(self, name: str, **values: Any) -> None:
        self._update("workers", {"name": name}, **values)

    def delete_worker(self, name: str) -> None:
        self.db.execute("DELETE FROM workers WHERE name = ?", (name,))

    # --- groups -----------------------------------------------------------------------------
    def groups(self) -> list[GroupRow]:
        return cast("list[GroupRow]", self._rows("SELECT * FROM groups ORDER BY name"))

    def group(self, name: str) -> GroupRow | None:
        return cast("GroupRow | None", self._one("SELECT * FROM groups WHERE name = ?", (name,)))

    def add_group(self, name: str, config: dict[str, Any]) -> None:
        self.db.execute("INSERT INTO groups (name, config) VALUES (?, ?)", (name, json.dumps(config)))

    def update_group(self, name: str, **values: Any) -> None:
        self._update("groups", {"name": name}, **values)

    def delete_group(self, name: str) -> None:
        self.db.execute("UPDATE workers SET grp = NULL WHERE grp = ?", (name,))
        for table, column in (("attempts", "grp"), ("logs", "grp"), ("groups", "name")):
            self.db.execute(f"DELETE FROM {table} WHERE {column} = ?", (name,))
        self.forget_cached()

    def member_counts(self) -> dict[str, int]:
        return {
            r["grp"]: r["n"]
            for r in self._rows("SELECT grp, COUNT(*) AS n FROM workers WHERE grp IS NOT NULL GROUP BY grp")
        }

    # --- attempts ---------------------------------------------------------------------------
    def attempts(self, group: str) -> list[AttemptRow]:
        return cast("list[AttemptRow]", self._rows("SELECT * FROM attempts WHERE grp = ? ORDER BY number", (group,)))

    def attempt(self, group: str, number: int) -> AttemptRow | None:
        row = self._one("SELECT * FROM attempts WHERE grp = ? AND number = ?", (group, number))
        return cast("AttemptRow | None", row)

    def active_attempts(self) -> list[AttemptRow]:
        """The attempts starting or running: decoded once per change of any attempt, not at
        every heartbeat (each a copy: a caller's change stays its own)."""
        if self._active is None:
            rows = self._rows("SELECT * FROM attempts WHERE state IN ('starting', 'running')")
            self._active = cast("list[AttemptRow]", rows)
        return [cast("AttemptRow", dict(a)) for a in self._active]

    def add_attempt(self, group: str, number: int, started: float, plan: Plan) -> None:
        self.db.execute(
            "INSERT INTO attempts (grp, number, state, started, plan) VALUES (?, ?, ?, ?, ?)",
            (group, number, State.STARTING.value, started, json.dumps(plan)),
        )
        self.forget_cached()

    def update_attempt(self, group: str, number: int, **values: Any) -> None:
        self._update("attempts", {"grp": group, "number": number}, **values)
        self.forget_cached()

    # --- output lines -----------------------------------------------------------------------
    def add_lines(self, rows: list[tuple[str, int, int, str, float, str]]) -> None:
        """rows: (group, attempt, rank, worker, time, line); `trim_lines` drops the oldest later."""
        self.db.executemany("INSERT INTO logs (grp, attempt, rank, worker, time, line) VALUES (?, ?, ?, ?, ?, ?)", rows)
        self._untrimmed.update(r[0] for r in rows)

    def trim_lines(self) -> None:
        """Keep LOG_LINES_KEPT lines of each group given lines since the last call (the server's
        tick calls it: one trim per group and tick instead of one per heartbeat with lines; the
        newest lines, all that anyone reads, are the same)."""
        groups, self._untrimmed = self._untrimmed, set()
        for group in groups:
            row = self.db.execute(
                "SELECT id FROM logs WHERE grp = ? ORDER BY id DESC LIMIT 1 OFFSET ?", (group, LOG_LINES_KEPT)
            ).fetchone()
            if row is not None:
                self.db.execute("DELETE FROM logs WHERE grp = ? AND id <= ?", (group, row[0]))
                self._trimmed_to[group] = row[0]

    def trimmed_after(self, group: str, after: int) -> bool:
        """Whether lines after id `after` were let go before anyone read them (a flood outran a
        reader): then `count_lines` counts only the kept ones, a lower bound."""
        return self._trimmed_to.get(group, 0) > after

    @staticmethod
    def _lines_where(group: str, rank: int | None, attempt: int | None, after: int) -> tuple[str, list[Any]]:
        sql, args = "FROM logs WHERE grp = ? AND id > ?", [group, after]
        if rank is not None:
            sql, args = sql + " AND rank = ?", [*args, rank]
        if attempt is not None:
            sql, args = sql + " AND attempt = ?", [*args, attempt]
        return sql, args

    def count_lines(self, group: str, rank: int | None, attempt: int | None, after: int) -> int:
        """How many lines `lines` could give after id `after` (at most LOG_LINES_KEPT plus a tick's)."""
        where, args = self._lines_where(group, rank, attempt, after)
        return int(self.db.execute("SELECT COUNT(*) " + where, args).fetchone()[0])

    def lines(
        self, group: str, rank: int | None, attempt: int | None, after: int, limit: int, tail: bool = False
    ) -> list[LineRow]:
        """Lines after id `after`, oldest first: the first `limit` of them, or with `tail`
        the last `limit`."""
        where, args = self._lines_where(group, rank, attempt, after)
        sql = "SELECT * " + where
        if tail:
            rows = self._rows(sql + " ORDER BY id DESC LIMIT ?", [*args, limit])[::-1]
        else:
            rows = self._rows(sql + " ORDER BY id LIMIT ?", [*args, limit])
        return cast("list[LineRow]", rows)


class _Transaction:
    """`with store.transaction():` one atomic change (BEGIN IMMEDIATE ... COMMIT/ROLLBACK)."""

    def __init__(self, store: Store):
        self.store = store

    def __enter__(self) -> None:
        self.store.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind, value, tb) -> None:
        if kind:
            self.store.forget_cached()  # what it cached may be what the rollback undid
        self.store.db.execute("ROLLBACK" if kind else "COMMIT")
