"""Checkpoints of the state journal's write-ahead log, kept off the commit path.

By default SQLite checkpoints (copies the committed WAL pages into the database file
and, with ``synchronous=NORMAL``, fsyncs both) inside whichever commit makes the WAL
pass 1,000 pages: every few dozen groups one commit, and every response waiting for it,
stalls for the copy and the fsyncs. The journal turns that off and asks
`WalCheckpointer`'s thread instead, whose PASSIVE checkpoints never block the writer.
Durability does not change: a commit is complete once it is in the WAL.

Under steady traffic a PASSIVE checkpoint never finds the WAL fully copied, so SQLite
never starts it over and the file would grow without end; once it passes
`WAL_RESTART_BYTES` the thread follows the PASSIVE checkpoint (which copied nearly
everything) with a RESTART one, which holds the writer back only for the last few
frames and makes the next commit write the WAL from its start.

The thread must keep up for that to bound the file: on a machine whose cores are all
busy it may not run for seconds while the writer goes on committing. So once the writer
is `restart_bytes` ahead of the last finished checkpoint it waits for the thread (at most
`CATCH_UP_WAIT_S`): the WAL stays under about twice `restart_bytes` however the threads
are scheduled, and commits only wait when the checkpoints have fallen behind.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading

log = logging.getLogger("atroposlib.api")

# About SQLite's own threshold (1,000 pages of 4 KiB) twice over.
CHECKPOINT_EVERY_BYTES = 8 * 1024 * 1024
WAL_RESTART_BYTES = 32 * 1024 * 1024
# Longest a commit waits for a checkpoint that has fallen behind; then it goes on (a stuck
# checkpoint, e.g. a long reader, must not stop the journal).
CATCH_UP_WAIT_S = 30.0


class WalCheckpointer:
    """A thread that checkpoints the database at `path` once enough has been written."""

    def __init__(
        self, path: str, synchronous: str,
        every_bytes: int = CHECKPOINT_EVERY_BYTES, restart_bytes: int = WAL_RESTART_BYTES,
    ) -> None:
        self._wal_path = path + "-wal"
        self._restart_bytes = restart_bytes
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        # A checkpoint fsyncs (or not) by the synchronous level of the connection running it.
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._db.execute("PRAGMA busy_timeout=10000")
        self._every_bytes = every_bytes
        self._written = 0
        self._committed_bytes = 0  # all bytes counted by wrote(), and how many of them a finished
        self._checkpointed_bytes = 0  # checkpoint has dealt with
        self._caught_up = threading.Condition()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="atropos-checkpoint", daemon=True)
        self._thread.start()

    def wrote(self, size: int) -> None:
        """Count `size` more bytes committed (called by the journal's writer thread)."""
        self._written += size
        self._committed_bytes += size
        if self._written >= self._every_bytes:
            self._written = 0
            self._wake.set()
        if self._committed_bytes - self._checkpointed_bytes > self._restart_bytes:
            self._wake.set()
            with self._caught_up:
                self._caught_up.wait_for(
                    lambda: self._stopping or self._committed_bytes - self._checkpointed_bytes <= self._restart_bytes,
                    CATCH_UP_WAIT_S)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            committed = self._committed_bytes
            try:
                self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
                if _size(self._wal_path) > self._restart_bytes:
                    self._db.execute("PRAGMA wal_checkpoint(RESTART)")
            except sqlite3.Error as exc:  # the next one catches up; the WAL only grows meanwhile
                log.warning("could not checkpoint the state journal: %s", exc)
                continue
            with self._caught_up:
                self._checkpointed_bytes = committed
                self._caught_up.notify_all()

    def close(self) -> None:
        self._stopping = True
        self._wake.set()
        with self._caught_up:
            self._caught_up.notify_all()
        self._thread.join(60)
        self._db.close()


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
