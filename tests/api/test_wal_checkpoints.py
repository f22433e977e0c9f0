"""The state journal's WAL is checkpointed by its own thread, never inside a commit."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from atroposlib.api.journal import Journal
from atroposlib.api.wal_checkpoints import WalCheckpointer

MiB = 1024 * 1024


def wal_database(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("CREATE TABLE blobs (data BLOB)")
    return db


def wait_for(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_enough_written_bytes_start_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    db = wal_database(path)
    db.execute("INSERT INTO blobs VALUES (?)", (os.urandom(2 * MiB),))
    checkpointer = WalCheckpointer(str(path), "NORMAL", every_bytes=4 * MiB)
    try:
        checkpointer.wrote(2 * MiB)
        time.sleep(0.3)
        assert path.stat().st_size < MiB  # below the threshold: still only in the WAL
        checkpointer.wrote(2 * MiB)
        assert wait_for(lambda: path.stat().st_size > 2 * MiB)
    finally:
        checkpointer.close()
        db.close()


def test_commits_leave_checkpoints_to_the_thread(tmp_path: Path) -> None:
    journal = Journal(tmp_path, "batch")
    payload = os.urandom(MiB)
    try:
        for seq in range(1, 7):  # 6 MiB: SQLite alone would have checkpointed at 4 MiB
            with journal.transaction():
                journal.insert_item(seq, seq, "queued", 0, 8, 0.0, payload)
            journal.flush()
        assert (tmp_path / "state.sqlite3").stat().st_size < MiB
        for seq in range(7, 10):  # past 8 MiB: the thread copies the WAL into the database
            with journal.transaction():
                journal.insert_item(seq, seq, "queued", 0, 8, 0.0, payload)
        journal.flush()
        assert wait_for(lambda: (tmp_path / "state.sqlite3").stat().st_size > 8 * MiB)
        assert journal.item_payloads(list(range(1, 10))) == [payload] * 9
    finally:
        journal.close()
    reopened = Journal(tmp_path, "batch")
    try:
        assert len(reopened.item_payloads(list(range(1, 10)))) == 9
    finally:
        reopened.close()


def largest_wal(path: Path, writes: int, slow_checkpoints_s: float = 0.0) -> int:
    """The WAL's largest size while `writes` blobs of 256 KiB are committed without a pause, the
    checkpointer told of each; its statements delayed by `slow_checkpoints_s` (a starved thread)."""
    db = wal_database(path)
    checkpointer = WalCheckpointer(str(path), "NORMAL", every_bytes=MiB, restart_bytes=4 * MiB)
    if slow_checkpoints_s:
        checkpointer._db = SlowCheckpoints(checkpointer._db, slow_checkpoints_s)  # type: ignore[assignment]
    wal = Path(str(path) + "-wal")
    largest = 0
    try:
        for _ in range(writes):
            db.execute("INSERT INTO blobs VALUES (?)", (os.urandom(256 * 1024),))
            checkpointer.wrote(256 * 1024)
            largest = max(largest, wal.stat().st_size)
    finally:
        checkpointer.close()
        db.close()
    return largest


def test_the_wal_stays_bounded_under_steady_writes(tmp_path: Path) -> None:
    assert largest_wal(tmp_path / "state.sqlite3", 160) < 16 * MiB  # 40 MiB written


class SlowCheckpoints:
    """The checkpoint thread's connection, each statement delayed: a thread starved of CPU."""

    def __init__(self, db: sqlite3.Connection, delay: float) -> None:
        self.db, self.delay = db, delay

    def execute(self, sql: str) -> sqlite3.Cursor:
        time.sleep(self.delay)
        return self.db.execute(sql)

    def close(self) -> None:
        self.db.close()


def test_a_writer_waits_for_checkpoints_that_fall_behind_so_the_wal_stays_bounded(tmp_path: Path) -> None:
    # 30 MiB, far faster than the checkpoints run
    assert largest_wal(tmp_path / "state.sqlite3", 120, slow_checkpoints_s=0.3) < 12 * MiB
