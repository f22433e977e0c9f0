"""StopRequest: the first signal asks for an orderly stop, the second for an immediate one."""

from __future__ import annotations

import asyncio
import os
import signal

from atroposlib.envs.stopping import StopRequest


def test_first_signal_is_orderly_second_is_immediate_then_handlers_are_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)

    async def scenario() -> tuple[bool, bool, str]:
        stop = StopRequest()
        with stop.installed():
            finished, _ = await stop.unless(stop.orderly, asyncio.sleep(0.2, "done"))
            assert finished and not stop.orderly.is_set()
            os.kill(os.getpid(), signal.SIGTERM)
            finished, _ = await stop.unless(stop.orderly, asyncio.sleep(30))
            assert stop.next_level() is stop.immediate
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(stop.immediate.wait(), 5)
            return finished, stop.immediate.is_set(), str(stop.signal_name)

    assert asyncio.run(scenario()) == (False, True, "SIGTERM")
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_ignored_by_the_parent_stays_ignored() -> None:
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        async def scenario() -> object:
            with StopRequest().installed():
                return signal.getsignal(signal.SIGTERM)

        assert asyncio.run(scenario()) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)
