"""Worker processes that parse and check large submissions off the event loop.

Parsing and checking a group of 8 x 1,024 tokens takes about 1.4 ms of CPU that holds
the GIL: a single-process server spends most of its submission time there. The pool
runs `inspect_group_body` in separate processes (all run state stays in the server
process). The event loop talks to each worker over a socket with asyncio streams, so
no thread has to win the GIL back to hand a reply over, and requests are pipelined: a
worker always has the next body waiting. Bodies smaller than `POOL_MIN_BYTES` are
checked inline, where a round trip would cost more than it saves.

Workers start with the first large body, not with the server: a run whose groups are all
small (tests, toy environments) starts no processes, and a server is ready to accept
connections as soon as it has opened its state. Until a worker has finished importing
(about half a second) bodies are checked inline. A worker that dies is replaced, and the
requests it held are checked inline; if one dies before it is ready, the pool stops using
workers.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import struct
import subprocess
import sys
from multiprocessing.connection import Connection
from typing import Optional

import orjson

from atroposlib.api.group_checks import Problem
from atroposlib.api.validation import (
    BodyInvalid,
    InvalidGzip,
    PayloadTooLarge,
    Submission,
    inspect_group_body,
)

log = logging.getLogger("atroposlib.api")

POOL_MIN_BYTES = 16 * 1024
_GZIP_FLAG, _PLAIN_FLAG = b"\x01", b"\x00"
_READY = b"ready"
# multiprocessing.connection's framing: a 4-byte big-endian signed length, then the bytes.
_FRAME_HEADER = struct.Struct("!i")
_LARGEST_FRAME = 2**31 - 1


def _encode_outcome(body: bytes, level: str, cap: int) -> bytes:
    try:
        s = inspect_group_body(body[1:], body[:1] == _GZIP_FLAG, level, cap)
        problems = [list(p) for p in s.problems]
        return orjson.dumps({"ok": [s.size, s.env_id, s.submission_id, s.longest, problems, s.policy_version]})
    except BodyInvalid as exc:
        return orjson.dumps({"invalid": exc.detail}, default=str)
    except InvalidGzip:
        return b'{"gzip":1}'
    except PayloadTooLarge:
        return b'{"large":1}'


def _decode_outcome(reply: bytes) -> Submission:
    outcome = orjson.loads(reply)
    if "ok" in outcome:
        size, env_id, submission_id, longest, problems, version = outcome["ok"]
        return Submission(size, env_id, submission_id, longest, [Problem(*p) for p in problems], version)
    if "invalid" in outcome:
        raise BodyInvalid(outcome["invalid"])
    if "gzip" in outcome:
        raise InvalidGzip
    raise PayloadTooLarge


def serve_validation(conn: Connection, level: str, cap: int) -> None:
    """A worker's loop: say it is ready, then answer each body received on `conn` in
    order until the server goes away."""
    try:
        conn.send_bytes(_READY)
        while True:
            request = conn.recv_bytes()
            conn.send_bytes(_encode_outcome(request, level, cap))
    except (EOFError, OSError):  # the server went away
        return


class _WorkerGone(Exception):
    """The worker process died with this request in flight."""


class _Worker:
    """One worker process and the event loop's stream to it."""

    def __init__(self, level: str, cap: int, loop: asyncio.AbstractEventLoop) -> None:
        # A plain interpreter, not multiprocessing: it must not re-run the user's main script.
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "atroposlib.cli.validator_worker", str(theirs.fileno()), level, str(cap)],
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        self.loop = loop
        self.ready = False
        self.alive = True
        self.in_flight: collections.deque[asyncio.Future[bytes]] = collections.deque()
        self._socket = ours
        self._writer: Optional[asyncio.StreamWriter] = None
        self._reader_task = loop.create_task(self._read_replies())

    async def _read_replies(self) -> None:
        try:
            reader, self._writer = await asyncio.open_connection(sock=self._socket)
            if await _read_frame(reader) != _READY:
                raise ConnectionError("the worker did not start")
            self.ready = True
            while True:
                reply = await _read_frame(reader)
                future = self.in_flight.popleft()
                if not future.done():
                    future.set_result(reply)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, IndexError) as exc:
            if self.alive:
                log.warning("a validator process stopped (%s); starting another when needed", exc or type(exc).__name__)
            self._fail_in_flight()

    def _fail_in_flight(self) -> None:
        self.alive = False
        while self.in_flight:
            future = self.in_flight.popleft()
            if not future.done():
                future.set_exception(_WorkerGone())

    async def check(self, body: bytes, gzipped: bool) -> bytes:
        assert self._writer is not None
        future: asyncio.Future[bytes] = self.loop.create_future()
        self.in_flight.append(future)
        flag = _GZIP_FLAG if gzipped else _PLAIN_FLAG
        self._writer.writelines((_FRAME_HEADER.pack(1 + len(body)), flag, body))
        try:
            await self._writer.drain()
        except ConnectionError:
            future.cancel()  # the caller checks the body itself
            raise
        return await future

    def stop(self) -> None:
        """Tell the worker to exit (it reads the end of its socket); callable from any thread."""
        self.alive = False
        with contextlib.suppress(OSError):
            # At once: closing the stream happens on a later turn of the event loop.
            self._socket.shutdown(socket.SHUT_RDWR)
        if self.loop.is_closed():
            self._socket.close()
        elif _running_loop() is self.loop:
            self._close_streams()
        else:
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._close_streams)

    def wait(self) -> None:
        """Wait for the stopped worker to exit (killing it after 5 seconds)."""
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    def _close_streams(self) -> None:
        self._reader_task.cancel()
        if self._writer is not None:
            self._writer.close()
        else:
            self._socket.close()
        self._fail_in_flight()


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = _FRAME_HEADER.unpack(await reader.readexactly(_FRAME_HEADER.size))
    return await reader.readexactly(size)


def _running_loop() -> Optional[asyncio.AbstractEventLoop]:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class ValidatorPool:
    """Checks submitted group bodies, in worker processes when that pays off."""

    def __init__(self, workers: int, level: str, max_decompressed: int) -> None:
        self.level = level
        self.max_decompressed = max_decompressed
        self._size = workers
        self._workers: list[_Worker] = []

    @property
    def workers(self) -> int:
        """Worker processes the pool keeps (0 after workers failed to start)."""
        return self._size

    def live_workers(self) -> list[int]:
        """Process ids of the worker processes currently running."""
        return [w.process.pid for w in self._workers if w.process.poll() is None]

    async def inspect(self, body: bytes, gzipped: bool) -> Submission:
        """Parse and check one group body; raises `BodyInvalid`, `InvalidGzip` or
        `PayloadTooLarge` for a bad one."""
        worker = self._pick_worker() if self._size and POOL_MIN_BYTES <= len(body) < _LARGEST_FRAME else None
        if worker is not None:
            try:
                return _decode_outcome(await worker.check(body, gzipped))
            except (_WorkerGone, ConnectionError):
                pass
        return inspect_group_body(body, gzipped, self.level, self.max_decompressed)

    def _pick_worker(self) -> Optional[_Worker]:
        """The least busy ready worker, starting missing workers; None (all starting): check inline."""
        self._replace_missing(asyncio.get_running_loop())
        ready = [w for w in self._workers if w.ready]
        return min(ready, key=lambda w: len(w.in_flight), default=None)

    def _replace_missing(self, loop: asyncio.AbstractEventLoop) -> None:
        for worker in [w for w in self._workers if not w.alive or w.loop is not loop]:
            # Dead, or started by an event loop that is gone (a test client's).
            self._workers.remove(worker)
            worker.stop()
            worker.wait()
            if not worker.ready and worker.loop is loop:
                log.warning("validator processes cannot start (exit status %s): checking every body "
                            "in the server process", worker.process.returncode)
                self._size = 0
        while len(self._workers) < self._size:
            self._workers.append(_Worker(self.level, self.max_decompressed, loop))

    def close(self) -> None:
        for worker in self._workers:
            worker.stop()
        for worker in self._workers:
            worker.wait()
        self._workers.clear()
