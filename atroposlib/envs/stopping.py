"""`StopRequest`: Ctrl-C and SIGTERM for serve mode, whatever it is doing.

The first signal asks for an orderly stop (no new rollouts; those in flight get a short
grace; the spool is kept; the API is told the env leaves). The second asks for an
immediate one (in-flight rollouts are cancelled). Python-level handlers are used, not
``loop.add_signal_handler``, so that a second signal also breaks out of synchronous code
that blocks the event loop (a long ``setup()``), by raising KeyboardInterrupt there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from types import FrameType
from typing import Awaitable, Iterator, Optional, TypeVar

log = logging.getLogger("atroposlib.envs")

SIGNALS = (signal.SIGINT, signal.SIGTERM)
T = TypeVar("T")


class StopRequest:
    """Whether, and how urgently, the person running the env asked it to stop."""

    def __init__(self) -> None:
        self.orderly = asyncio.Event()
        self.immediate = asyncio.Event()
        self.signal_name: Optional[str] = None
        self._received = 0
        self._handled = 0
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    @contextlib.contextmanager
    def installed(self) -> Iterator["StopRequest"]:
        """Handle SIGINT and SIGTERM inside the block (main thread only), then restore."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        self._loop = asyncio.get_running_loop()
        # A signal ignored by whoever started us (nohup, `cmd &` in a script) stays ignored.
        previous = {signum: signal.signal(signum, self._on_signal)
                    for signum in SIGNALS if signal.getsignal(signum) is not signal.SIG_IGN}
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        self._received += 1
        if self._received > self._handled + 1 or self._received > 2:
            # The event loop is blocked (it never saw the previous signal) or the stop hangs.
            raise KeyboardInterrupt
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._handle, signal.Signals(signum).name)

    def _handle(self, name: str) -> None:
        self._handled += 1
        if not self.orderly.is_set():
            self.signal_name = name
            log.warning("%s received: stopping; a second Ctrl-C or SIGTERM stops at once", name)
            self.orderly.set()
        elif not self.immediate.is_set():
            log.warning("%s received again: stopping at once", name)
            self.immediate.set()

    def next_level(self) -> asyncio.Event:
        """The event that would cut short what is running now: the first signal while
        nothing was asked yet, the second once an orderly stop was asked."""
        return self.immediate if self.orderly.is_set() else self.orderly

    async def unless(self, event: asyncio.Event, awaitable: Awaitable[T]) -> tuple[bool, Optional[T]]:
        """Await `awaitable` unless `event` is set first (then cancel it).
        Returns (finished, its result)."""
        task = asyncio.ensure_future(awaitable)
        waiter = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            if task.done() and not task.cancelled():
                task.exception()  # retrieved (it is raised below, or already propagated as KeyboardInterrupt)
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if task.cancelled():
            return False, None
        return True, task.result()
