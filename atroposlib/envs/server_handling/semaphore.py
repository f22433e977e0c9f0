"""`AsyncSemWithAdaptiveWeight`: a semaphore whose usable capacity follows a weight.

The trajectory API tells each environment its share of inference (``env_weight``); an
env with weight 0.25 may hold about a quarter of a server's request slots. Acquiring
succeeds only while more than ``min_val() = max_val x (1 - weight)`` slots are free.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Optional

MIN_WEIGHT = 0.01


class AsyncSemWithAdaptiveWeight:
    """An asyncio semaphore of `value` slots, of which about ``weight x value`` are usable."""

    def __init__(self, value: int) -> None:
        self.max_val = value
        self._value = value
        self.weight = 1.0
        self._waiters: deque[asyncio.Future[bool]] = deque()

    def min_val(self) -> float:
        return self.max_val * (1 - self.weight)

    @property
    def free(self) -> int:
        return self._value

    def locked(self) -> bool:
        return self._value <= self.min_val() or any(not w.done() for w in self._waiters)

    def update_weight(self, weight: float) -> None:
        """Set the share of slots this holder may use (clamped to [0.01, 1])."""
        self.weight = min(1.0, max(MIN_WEIGHT, weight))
        self._wake()

    async def acquire(self) -> bool:
        if not self.locked():
            self._value -= 1
            return True
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # the slot was granted as we were cancelled: hand it on
            raise
        return True

    def release(self) -> None:
        self._value += 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._value > self.min_val():
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._value -= 1
                waiter.set_result(True)

    async def __aenter__(self) -> "AsyncSemWithAdaptiveWeight":
        await self.acquire()
        return self

    async def __aexit__(self, *exc: Optional[Any]) -> None:
        self.release()
