"""The weighted semaphore lets about weight x capacity holders in."""

from __future__ import annotations

import asyncio

from atroposlib.envs.server_handling.semaphore import AsyncSemWithAdaptiveWeight


def test_weight_limits_concurrent_holders() -> None:
    async def scenario() -> tuple[int, int]:
        sem = AsyncSemWithAdaptiveWeight(10)
        sem.update_weight(0.3)
        held = 0
        for _ in range(10):
            if sem.locked():
                break
            await sem.acquire()
            held += 1
        waiter = asyncio.create_task(sem.acquire())
        await asyncio.sleep(0)
        sem.update_weight(1.0)  # raising the weight admits waiters at once
        await asyncio.wait_for(waiter, 1)
        return held, sem.free

    held, free = asyncio.run(scenario())
    assert held == 3 and free == 6


def test_weights_are_clamped() -> None:
    sem = AsyncSemWithAdaptiveWeight(4)
    sem.update_weight(7.0)
    assert sem.min_val() == 0
    sem.update_weight(-1)
    assert sem.weight == 0.01


def test_cancelled_waiter_does_not_leak_a_slot() -> None:
    async def scenario() -> int:
        sem = AsyncSemWithAdaptiveWeight(1)
        await sem.acquire()
        waiter = asyncio.create_task(sem.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        sem.release()
        await asyncio.sleep(0)
        return sem.free

    assert asyncio.run(scenario()) == 1
