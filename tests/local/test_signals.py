"""Stop signals raised as `StopSignal` inside `stop_signals_raise`: once, and never lost to a
finalizer that happened to be running when the signal came (the interpreter drops exceptions
raised there, and the program would have gone on with every stop signal ignored)."""

from __future__ import annotations

import os
import signal
import time
import weakref
from typing import Callable

import pytest

from atroposlib.local.signals import StopSignal, stop_signals_raise


class Resource:
    """Something with a finalizer, run when the last reference goes."""

    def __init__(self, on_finalize: Callable[[], None]) -> None:
        self.on_finalize = on_finalize

    def __del__(self) -> None:
        self.on_finalize()


def signal_myself_and_wait(signum: int = signal.SIGTERM) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.3)  # the signal's handler runs in here


def test_a_stop_signal_raises_once_and_the_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(StopSignal, match="stopped by SIGTERM"):
        with stop_signals_raise():
            signal_myself_and_wait()
            time.sleep(5)
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("finalizer", ["weakref.finalize", "__del__"])
def test_a_stop_signal_that_lands_in_a_finalizer_is_not_lost(finalizer: str) -> None:
    started = time.monotonic()
    with pytest.raises(StopSignal, match="stopped by SIGTERM"):
        with stop_signals_raise():
            if finalizer == "__del__":
                resource = Resource(signal_myself_and_wait)
            else:
                resource = Resource(lambda: None)
                weakref.finalize(resource, signal_myself_and_wait)
            del resource  # its finalizer runs now, and the signal comes while it does
            time.sleep(5)
    assert time.monotonic() - started < 4
