"""Durable storage of the trajectory API's state in one SQLite database.

The server keeps its working state in memory and writes every transition here, in one
transaction per request, before it answers. With WAL and ``synchronous=NORMAL`` a commit
reaches the operating system before the response leaves, so ``kill -9`` of the server
loses nothing it acknowledged; ``--fsync always`` also survives power loss.

Group payloads (the JSON of each stored item) live only here, not in Python memory:
the server reads them back when it serves a batch. ``--ephemeral`` uses an in-memory
database, so both modes run the same code.

Item states: ``buffered`` (waiting in an env's mixed-size buffer), ``queued``,
``leased`` (in an unacknowledged batch), ``served`` (kept for the served log until
retention ends) and ``dead`` (dead-lettered after too many expired leases).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

import orjson

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
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS items_by_state ON items (state, pos);
CREATE INDEX IF NOT EXISTS items_by_batch ON items (batch_id);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS envs (env_id INTEGER PRIMARY KEY, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS leases (batch_id TEXT PRIMARY KEY, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS idempotency (key TEXT PRIMARY KEY, t REAL NOT NULL, response BLOB NOT NULL);
"""

_SYNCHRONOUS = {"always": "FULL", "batch": "NORMAL", "off": "OFF"}


class StateDirLocked(RuntimeError):
    """Another server process already owns the state directory."""


class Journal:
    """Write-through persistence; every public method runs inside `transaction()`."""

    def __init__(self, state_dir: Optional[Path], fsync: str = "batch") -> None:
        self.state_dir = state_dir
        self._lock_file: Optional[int] = None
        if state_dir is None:
            target = ":memory:"
        else:
            state_dir.mkdir(parents=True, exist_ok=True)
            self._lock_file = _lock_exclusively(state_dir / "lock")
            target = str(state_dir / "state.sqlite3")
        self._db = sqlite3.connect(target, isolation_level=None, check_same_thread=False)
        if state_dir is not None:
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={_SYNCHRONOUS[fsync]}")
        self._db.executescript(_SCHEMA)

    @property
    def durable(self) -> bool:
        return self.state_dir is not None

    def close(self) -> None:
        self._db.close()
        if self._lock_file is not None:
            os.close(self._lock_file)
            self._lock_file = None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One atomic unit of change; nested uses join the outer transaction."""
        if self._db.in_transaction:
            yield
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # -- meta ---------------------------------------------------------------------
    def set_meta(self, key: str, value: Any) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
            (key, orjson.dumps(value)),
        )

    def load_meta(self) -> dict[str, Any]:
        return {k: orjson.loads(v) for k, v in self._db.execute("SELECT key, value FROM meta")}

    # -- items --------------------------------------------------------------------
    def insert_item(
        self, seq: int, pos: Optional[int], state: str, env_id: Optional[int],
        size: int, t: float, data: bytes,
    ) -> None:
        self._db.execute(
            "INSERT INTO items (seq, pos, state, env_id, size, t, data) VALUES (?,?,?,?,?,?,?)",
            (seq, pos, state, env_id, size, t, data),
        )

    def move_items(
        self, seqs_and_pos: Iterable[tuple[int, Optional[int]]], state: str,
        batch_id: Optional[str] = None, step: Optional[int] = None,
        t: Optional[float] = None,
    ) -> None:
        """Change the state of items; `t` (when given) restamps them, e.g. when served."""
        self._db.executemany(
            "UPDATE items SET state = ?, pos = ?, batch_id = ?, step = ?, t = COALESCE(?, t) "
            "WHERE seq = ?",
            [(state, pos, batch_id, step, t, seq) for seq, pos in seqs_and_pos],
        )

    def count_expirations(self, seqs: Iterable[int]) -> None:
        self._db.executemany(
            "UPDATE items SET expirations = expirations + 1 WHERE seq = ?",
            [(seq,) for seq in seqs],
        )

    def item_payloads(self, seqs: list[int]) -> list[bytes]:
        """The stored JSON of `seqs`, in the order given (items no longer kept are skipped)."""
        found: dict[int, bytes] = {}
        for start in range(0, len(seqs), 500):
            chunk = seqs[start : start + 500]
            marks = ",".join("?" * len(chunk))
            found.update(
                self._db.execute(f"SELECT seq, data FROM items WHERE seq IN ({marks})", chunk)
            )
        return [found[seq] for seq in seqs if seq in found]

    def live_items(self) -> list[tuple[int, Optional[int], str, Optional[int], int, float, Optional[str], int]]:
        """(seq, pos, state, env_id, size, t, batch_id, expirations) of unserved items."""
        return self._db.execute(
            "SELECT seq, pos, state, env_id, size, t, batch_id, expirations FROM items "
            "WHERE state IN ('buffered', 'queued', 'leased') ORDER BY pos, seq"
        ).fetchall()

    def served_batches(self, since_step: int, limit: int) -> list[tuple[str, int, bytes]]:
        return self._db.execute(
            "SELECT batch_id, step, data FROM items WHERE state = 'served' AND step >= ? "
            "ORDER BY step, pos LIMIT ?",
            (since_step, limit),
        ).fetchall()

    def dead_letters(self) -> list[tuple[str, int]]:
        return self._db.execute(
            "SELECT batch_id, COUNT(*) FROM items WHERE state = 'dead' GROUP BY batch_id"
        ).fetchall()

    def forget_served_before(self, cutoff: float, keep_seq: Optional[int]) -> None:
        self._db.execute(
            "DELETE FROM items WHERE state = 'served' AND t < ? AND seq IS NOT ?",
            (cutoff, keep_seq),
        )

    def max_seq(self) -> int:
        return self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM items").fetchone()[0]

    # -- envs, leases, idempotency ---------------------------------------------------
    def save_env(self, env_id: int, record: bytes) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO envs (env_id, record) VALUES (?, ?)", (env_id, record)
        )

    def load_envs(self) -> list[bytes]:
        return [r for (r,) in self._db.execute("SELECT record FROM envs ORDER BY env_id")]

    def save_lease(self, batch_id: str, record: bytes) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO leases (batch_id, record) VALUES (?, ?)", (batch_id, record)
        )

    def drop_lease(self, batch_id: str) -> None:
        self._db.execute("DELETE FROM leases WHERE batch_id = ?", (batch_id,))

    def load_leases(self) -> list[bytes]:
        return [r for (r,) in self._db.execute("SELECT record FROM leases")]

    def remember_response(self, key: str, t: float, response: bytes) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO idempotency (key, t, response) VALUES (?, ?, ?)",
            (key, t, response),
        )

    def forget_responses(self, keys: Iterable[str]) -> None:
        self._db.executemany("DELETE FROM idempotency WHERE key = ?", [(k,) for k in keys])

    def load_responses(self) -> list[tuple[str, float, bytes]]:
        return self._db.execute("SELECT key, t, response FROM idempotency ORDER BY t").fetchall()

    def wipe(self) -> None:
        for table in ("items", "meta", "envs", "leases", "idempotency"):
            self._db.execute(f"DELETE FROM {table}")


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
