"""Worker processes that parse and check large submissions off the event loop.

Parsing a group of 8 x 1,024 tokens takes about half a millisecond of CPU that holds
the GIL, so a single-process server spends most of its submission time there. The pool
runs `inspect_group_body` in separate processes (all run state stays in the server
process): bodies travel as raw bytes over pipes, and one pump thread per worker waits
on its pipe without holding the GIL. Bodies smaller than `POOL_MIN_BYTES` are checked
inline, where a process round trip would cost more than it saves. A worker that dies
is replaced, and the request it was handling is checked inline. Workers start with the
first large body, so a server that never sees one never starts them.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import socket
import subprocess
import sys
import threading
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
    """A worker's loop: answer each body received on `conn` until the server goes away."""
    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):  # the server went away
            return
        conn.send_bytes(_encode_outcome(request, level, cap))


class ValidatorPool:
    """Checks submitted group bodies, in worker processes when that pays off."""

    def __init__(self, workers: int, level: str, max_decompressed: int) -> None:
        self.level = level
        self.max_decompressed = max_decompressed
        self._jobs: "queue.SimpleQueue[Optional[tuple[bytes, asyncio.AbstractEventLoop, asyncio.Future[bytes]]]]" = queue.SimpleQueue()
        self._pumps: list[threading.Thread] = []
        self._processes: list[subprocess.Popen[bytes]] = []
        for _ in range(workers):
            thread = threading.Thread(target=self._pump, name="atropos-validator", daemon=True)
            thread.start()
            self._pumps.append(thread)

    @property
    def workers(self) -> int:
        return len(self._pumps)

    def live_workers(self) -> list[int]:
        """Process ids of the worker processes currently running."""
        return [p.pid for p in self._processes if p.poll() is None]

    async def inspect(self, body: bytes, gzipped: bool) -> Submission:
        """Parse and check one group body; raises `BodyInvalid`, `InvalidGzip` or
        `PayloadTooLarge` for a bad one."""
        if not self._pumps or len(body) < POOL_MIN_BYTES:
            return inspect_group_body(body, gzipped, self.level, self.max_decompressed)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        self._jobs.put(((_GZIP_FLAG if gzipped else _PLAIN_FLAG) + body, loop, future))
        return _decode_outcome(await future)

    def _start_worker(self) -> Connection:
        # A plain interpreter, not multiprocessing: it must not re-run the user's main script.
        ours, theirs = socket.socketpair()
        process = subprocess.Popen(
            [sys.executable, "-m", "atroposlib.cli.validator_worker", str(theirs.fileno()),
             self.level, str(self.max_decompressed)],
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        self._processes.append(process)
        return Connection(ours.detach())

    def _pump(self) -> None:
        conn: Optional[Connection] = None  # the worker starts with the first large body
        while True:
            job = self._jobs.get()
            if job is None:
                if conn is not None:
                    conn.close()
                return
            request, loop, future = job
            if conn is None:
                conn = self._start_worker()
            try:
                conn.send_bytes(request)
                reply = conn.recv_bytes()
            except (EOFError, OSError):
                log.warning("a validator process died; starting another")
                reply = _encode_outcome(request, self.level, self.max_decompressed)
                conn = self._start_worker()
            loop.call_soon_threadsafe(_settle, future, reply)

    def close(self) -> None:
        for _ in self._pumps:
            self._jobs.put(None)
        for thread in self._pumps:
            thread.join(10)
        for process in self._processes:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def _settle(future: "asyncio.Future[bytes]", reply: bytes) -> None:
    if not future.done():
        future.set_result(reply)
