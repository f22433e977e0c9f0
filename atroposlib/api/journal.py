"""Durable storage of the trajectory API's state in one SQLite database.

The server keeps its working state in memory and records every transition here. A
request's changes form one *unit*; a single writer thread commits units in the order
they were made, many per transaction when requests arrive together (group commit).
`DurableResponses` holds every response until all units made before it are committed,
so nothing is acknowledged before it is on disk, and the database always holds an
exact prefix of the server's history: ``kill -9`` loses nothing acknowledged, and a
restart restores a consistent state. With WAL and ``synchronous=NORMAL`` a commit
reaches the operating system before the response leaves; ``--fsync always`` also
survives power loss. WAL checkpoints run on a thread of their own
(`atroposlib.api.wal_checkpoints`), not inside commits.

Group payloads (the JSON of each stored item) live only here, not in Python memory,
except between their insertion and its commit. ``--ephemeral`` puts the database in a
private temporary folder (on ``/dev/shm`` where it exists) that is removed on close,
so both modes run the same code.

Item states: ``buffered`` (waiting in an env's mixed-size buffer), ``queued``,
``leased`` (in an unacknowledged batch), ``served`` (kept for the served log until
retention ends), ``dead`` (dead-lettered after too many expired leases) and ``dropped``
(taken out of the queue unserved; ``reason`` says why, ``step`` names the step it would
have been trained at). Each item also keeps its ``policy_version`` (NULL: unknown).

A database written before a column existed gains it when opened (`_migrate`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import queue
import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

import orjson

from atroposlib.api.items import stored_policy_version
from atroposlib.api.wal_checkpoints import WalCheckpointer

log = logging.getLogger("atroposlib.api")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    seq INTEGER PRIMARY KEY,
    pos INTEGER,
    state TEXT NOT NULL,
    env_id INTEGER,
    size INTEGER NOT NULL,
    t REAL NOT NULL,
    batch_id TEXT,
    step INTEGER,
    expirations INTEGER NOT NULL DEFAULT 0,
    data BLOB NOT NULL,
    policy_version INTEGER,
    reason TEXT
);
CREATE INDEX IF NOT EXISTS items_by_state ON items (state, pos);
CREATE INDEX IF NOT EXISTS items_by_batch ON items (batch_id);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS envs (env_id INTEGER PRIMARY KEY, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS leases (batch_id TEXT PRIMARY KEY, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS idempotency (key TEXT PRIMARY KEY, t REAL NOT NULL, response BLOB NOT NULL);
"""

_SYNCHRONOUS = {"always": "FULL", "batch": "NORMAL", "off": "OFF"}
_STOP = object()
# What a statement writes to the WAL besides the payloads it carries: about a page.
_STATEMENT_BYTES = 4096
Statement = tuple[str, Any, bool]  # (sql, parameters, executemany)


class StateDirLocked(RuntimeError):
    """Another server process already owns the state directory."""


class StorageFailed(RuntimeError):
    """A unit of changes could not be committed; the server state is no longer durable."""


class Journal:
    """Write-behind, group-committed persistence of the server's transitions."""

    def __init__(self, state_dir: Optional[Path], fsync: str = "batch") -> None:
        self.state_dir = state_dir
        self._scratch: Optional[Path] = None
        if state_dir is None:
            shm = Path("/dev/shm")
            self._scratch = Path(tempfile.mkdtemp(prefix="atropos-api-", dir=shm if shm.is_dir() else None))
            folder = self._scratch
        else:
            state_dir.mkdir(parents=True, exist_ok=True)
            folder = state_dir
        self._lock_file: Optional[int] = _lock_exclusively(folder / "lock")
        path = str(folder / "state.sqlite3")
        self._writer_db = _connect(path, fsync)
        self._writer_db.executescript(_SCHEMA)
        _migrate(self._writer_db)
        self._writer_db.execute("PRAGMA wal_autocheckpoint=0")
        self._checkpointer = WalCheckpointer(path, _SYNCHRONOUS[fsync])
        self._reader_db = _connect(path, fsync)
        self._unit: Optional[list[Statement]] = None
        self._uncommitted: dict[int, bytes] = {}
        self._queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._enqueued = 0
        self._committed = 0
        self._failure: Optional[BaseException] = None
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._waiters_lock = threading.Lock()
        self._committed_event = threading.Condition()
        self._writer = threading.Thread(target=self._write_loop, name="atropos-journal", daemon=True)
        self._writer.start()

    @property
    def durable(self) -> bool:
        return self.state_dir is not None

    # -- units and commits ----------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Collect the statements of one atomic unit; nested uses join the outer unit.
        On an exception nothing of the unit is written."""
        if self._unit is not None:
            yield
            return
        self._unit = []
        try:
            yield
            unit, self._unit = self._unit, None
        except BaseException:
            self._unit = None
            raise
        if unit:
            self._enqueued += 1
            self._queue.put(unit)

    def _add(self, sql: str, parameters: Any = (), many: bool = False) -> None:
        if self._unit is None:
            raise RuntimeError("journal writes must happen inside Journal.transaction()")
        self._unit.append((sql, parameters, many))

    async def barrier(self) -> None:
        """Wait until every unit enqueued so far is committed."""
        target = self._enqueued
        if self._failure is not None:
            raise StorageFailed(str(self._failure))
        if self._committed >= target:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._waiters_lock:
            if self._committed >= target:
                return
            self._waiters.append((target, loop, future))
        await future

    def flush(self, timeout: float = 60.0) -> None:
        """Block until every unit enqueued so far is committed (for non-async callers)."""
        target = self._enqueued
        with self._committed_event:
            self._committed_event.wait_for(lambda: self._committed >= target or self._failure is not None, timeout)
        if self._failure is not None:
            raise StorageFailed(str(self._failure))

    def _write_loop(self) -> None:
        while True:
            units = [self._queue.get()]
            while True:
                try:
                    units.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stopping = any(unit is _STOP for unit in units)
            units = [unit for unit in units if unit is not _STOP]
            if units:
                self._commit(units)
            if stopping:
                return

    def _commit(self, units: list[list[Statement]]) -> None:
        db = self._writer_db
        try:
            db.execute("BEGIN IMMEDIATE")
            for unit in units:
                for sql, parameters, many in unit:
                    (db.executemany if many else db.execute)(sql, parameters)
            db.execute("COMMIT")
        except BaseException as exc:  # the server can no longer promise durability
            log.critical("could not commit the state journal: %s", exc)
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            self._failure = exc
        inserted = [p[0] for unit in units for sql, p, many in unit if sql.startswith("INSERT INTO items")]
        statements = sum(len(unit) for unit in units)
        with self._committed_event:
            self._committed += len(units)
            self._committed_event.notify_all()
        with self._waiters_lock:
            ready = [w for w in self._waiters if w[0] <= self._committed]
            self._waiters = [w for w in self._waiters if w[0] > self._committed]
        for _, loop, future in ready:
            loop.call_soon_threadsafe(_resolve, future, self._failure)
        payload_bytes = sum(len(self._uncommitted.pop(seq, b"")) for seq in inserted)
        self._checkpointer.wrote(payload_bytes + statements * _STATEMENT_BYTES)

    def close(self) -> None:
        self._queue.put(_STOP)
        self._writer.join(60)
        self._checkpointer.close()
        self._writer_db.close()
        self._reader_db.close()
        if self._lock_file is not None:
            os.close(self._lock_file)
            self._lock_file = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    # -- meta ---------------------------------------------------------------------
    def set_meta(self, key: str, value: Any) -> None:
        self._add("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, orjson.dumps(value)))

    def load_meta(self) -> dict[str, Any]:
        return {k: orjson.loads(v) for k, v in self._read("SELECT key, value FROM meta")}

    # -- items --------------------------------------------------------------------
    def insert_item(
        self, seq: int, pos: Optional[int], state: str, env_id: Optional[int],
        size: int, t: float, data: bytes, policy_version: Optional[int] = None,
    ) -> None:
        self._uncommitted[seq] = data
        self._add(
            "INSERT INTO items (seq, pos, state, env_id, size, t, data, policy_version) "
            "VALUES (?,?,?,?,?,?,?,?)",
            (seq, pos, state, env_id, size, t, data, policy_version),
        )

    def move_items(
        self, seqs_and_pos: Iterable[tuple[int, Optional[int]]], state: str,
        batch_id: Optional[str] = None, step: Optional[int] = None,
        t: Optional[float] = None,
    ) -> None:
        """Change the state of items; `t` (when given) restamps them, e.g. when served."""
        self._add(
            "UPDATE items SET state = ?, pos = ?, batch_id = ?, step = ?, t = COALESCE(?, t) "
            "WHERE seq = ?",
            [(state, pos, batch_id, step, t, seq) for seq, pos in seqs_and_pos],
            many=True,
        )

    def drop_items(self, seqs: Iterable[int], reason: str, step: int) -> None:
        """Take items out of the queue for good, unserved, for `reason`."""
        self._add(
            "UPDATE items SET state = 'dropped', pos = NULL, reason = ?, step = ? WHERE seq = ?",
            [(reason, step, seq) for seq in seqs],
            many=True,
        )

    def count_expirations(self, seqs: Iterable[int]) -> None:
        self._add(
            "UPDATE items SET expirations = expirations + 1 WHERE seq = ?",
            [(seq,) for seq in seqs],
            many=True,
        )

    def item_payloads(self, seqs: list[int]) -> list[bytes]:
        """The stored JSON of `seqs`, in the order given (items no longer kept are skipped)."""
        found: dict[int, bytes] = {}
        for seq in seqs:
            # The writer thread drops an entry only after its commit: a miss here is on disk.
            data = self._uncommitted.get(seq)
            if data is not None:
                found[seq] = data
        missing = [seq for seq in seqs if seq not in found]
        for start in range(0, len(missing), 500):
            chunk = missing[start : start + 500]
            marks = ",".join("?" * len(chunk))
            found.update(self._read(f"SELECT seq, data FROM items WHERE seq IN ({marks})", chunk))
        return [found[seq] for seq in seqs if seq in found]

    def live_items(
        self,
    ) -> list[tuple[int, Optional[int], str, Optional[int], int, float, Optional[str], int, Optional[int]]]:
        """(seq, pos, state, env_id, size, t, batch_id, expirations, policy_version) of
        unserved items."""
        return self._read(
            "SELECT seq, pos, state, env_id, size, t, batch_id, expirations, policy_version FROM items "
            "WHERE state IN ('buffered', 'queued', 'leased') ORDER BY pos, seq"
        )

    def served_batches(self, since_step: int, limit: int) -> list[tuple[str, int, bytes]]:
        return self._read(
            "SELECT batch_id, step, data FROM items WHERE state = 'served' AND step >= ? "
            "ORDER BY step, pos LIMIT ?",
            (since_step, limit),
        )

    def dead_letters(self) -> list[tuple[str, int]]:
        return self._read("SELECT batch_id, COUNT(*) FROM items WHERE state = 'dead' GROUP BY batch_id")

    def dropped_counts(self) -> list[tuple[str, int]]:
        """(reason, groups) of the dropped items."""
        return self._read("SELECT reason, COUNT(*) FROM items WHERE state = 'dropped' GROUP BY reason")

    def forget_served_before(self, cutoff: float, keep_seq: Optional[int]) -> None:
        self._add("DELETE FROM items WHERE state = 'served' AND t < ? AND seq IS NOT ?", (cutoff, keep_seq))

    def max_seq(self) -> int:
        return self._read("SELECT COALESCE(MAX(seq), 0) FROM items")[0][0]

    # -- envs, leases, idempotency ---------------------------------------------------
    def save_env(self, env_id: int, record: bytes) -> None:
        self._add("INSERT OR REPLACE INTO envs (env_id, record) VALUES (?, ?)", (env_id, record))

    def load_envs(self) -> list[bytes]:
        return [r for (r,) in self._read("SELECT record FROM envs ORDER BY env_id")]

    def save_lease(self, batch_id: str, record: bytes) -> None:
        self._add("INSERT OR REPLACE INTO leases (batch_id, record) VALUES (?, ?)", (batch_id, record))

    def drop_lease(self, batch_id: str) -> None:
        self._add("DELETE FROM leases WHERE batch_id = ?", (batch_id,))

    def load_leases(self) -> list[bytes]:
        return [r for (r,) in self._read("SELECT record FROM leases")]

    def remember_response(self, key: str, t: float, response: bytes) -> None:
        self._add("INSERT OR REPLACE INTO idempotency (key, t, response) VALUES (?, ?, ?)", (key, t, response))

    def forget_responses(self, keys: Iterable[str]) -> None:
        self._add("DELETE FROM idempotency WHERE key = ?", [(k,) for k in keys], many=True)

    def load_responses(self) -> list[tuple[str, float, bytes]]:
        return self._read("SELECT key, t, response FROM idempotency ORDER BY t")

    def wipe(self) -> None:
        for table in ("items", "meta", "envs", "leases", "idempotency"):
            self._add(f"DELETE FROM {table}")
        self._uncommitted.clear()

    def _read(self, sql: str, parameters: Any = ()) -> list[Any]:
        """Read committed rows (reads never wait for the writer)."""
        return self._reader_db.execute(sql, parameters).fetchall()


def _resolve(future: "asyncio.Future[None]", failure: Optional[BaseException]) -> None:
    if future.done():
        return
    if failure is None:
        future.set_result(None)
    else:
        future.set_exception(StorageFailed(str(failure)))


def _migrate(db: sqlite3.Connection) -> None:
    """Add the item columns a database from an earlier version lacks. Policy versions of
    the groups still to be served are read back from their payloads; served and dead
    groups keep NULL (unknown), which nothing reads."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(items)")}
    if {"policy_version", "reason"} <= columns:
        return
    with db:  # one transaction: a crash midway leaves the old schema, migrated next time
        db.execute("BEGIN IMMEDIATE")
        if "reason" not in columns:
            db.execute("ALTER TABLE items ADD COLUMN reason TEXT")
        if "policy_version" not in columns:
            db.execute("ALTER TABLE items ADD COLUMN policy_version INTEGER")
            live = db.execute(
                "SELECT seq, data FROM items WHERE state IN ('buffered', 'queued', 'leased')"
            ).fetchall()
            known = [(v, seq) for seq, data in live if (v := stored_policy_version(data)) is not None]
            db.executemany("UPDATE items SET policy_version = ? WHERE seq = ?", known)
            log.info("state journal: policy versions of %d stored group(s) read back", len(known))


def _connect(path: str, fsync: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={_SYNCHRONOUS[fsync]}")
    db.execute("PRAGMA busy_timeout=10000")
    return db


def _lock_exclusively(path: Path) -> int:
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise StateDirLocked(
            f"another run-api process is using the state directory {path.parent}"
        ) from None
    return descriptor
