"""Stop signals as exceptions, so the local tools clean up whatever signal stops them.

Python turns SIGINT into `KeyboardInterrupt`, which runs ``finally`` blocks and context
managers' exits; SIGTERM and SIGHUP kill it without either, which once left a vLLM server
running with its port and memory after its wrapper was gone. Inside `stop_signals_raise`
all three raise `StopSignal` (a `KeyboardInterrupt`) in the main thread instead, once:
further signals are ignored while the clean-up runs, so a second Ctrl-C cannot cut short
the stopping of a server.
"""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager
from types import FrameType
from typing import Iterator, Optional

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignal(KeyboardInterrupt):
    """The program was asked to stop by a signal."""

    def __init__(self, signum: int) -> None:
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signal_name}")


@contextmanager
def stop_signals_raise() -> Iterator[None]:
    """Within the block, SIGINT, SIGTERM and SIGHUP raise `StopSignal`; the previous
    handlers come back afterwards. Call from the main thread."""
    def raise_stop(signum: int, _frame: Optional[FrameType]) -> None:
        for stop_signal in STOP_SIGNALS:
            signal.signal(stop_signal, signal.SIG_IGN)
        raise StopSignal(signum)

    previous = {signum: signal.signal(signum, raise_stop) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def die_with_parent() -> None:
    """In a child before exec: get SIGTERM when the thread that started it ends, which for the
    main thread means when the process dies, even by SIGKILL (Linux only; elsewhere the
    parent's clean-up is the safeguard)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
