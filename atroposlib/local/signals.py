"""Stop signals as exceptions, so the local tools clean up whatever signal stops them.

Python turns SIGINT into `KeyboardInterrupt`, which runs ``finally`` blocks and context
managers' exits; SIGTERM and SIGHUP kill it without either, which once left a vLLM server
running with its port and memory after its wrapper was gone. Inside `stop_signals_raise`
all three raise `StopSignal` (a `KeyboardInterrupt`) in the main thread instead, once:
further signals are ignored while the clean-up runs, so a second Ctrl-C cannot cut short
the stopping of a server. An exception raised inside a finalizer (``weakref.finalize``, which
urllib3 uses for its connection pools, or a ``__del__``) is printed and dropped by the
interpreter, which would leave the program running with every stop signal ignored: a signal
that lands there is sent again once the finalizer has returned.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import weakref
from contextlib import contextmanager
from types import FrameType
from typing import Iterator, Optional

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# seconds after which a stop signal that landed in a finalizer is sent again
REDELIVERY_S = 0.05


class StopSignal(KeyboardInterrupt):
    """The program was asked to stop by a signal."""

    def __init__(self, signum: int) -> None:
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signal_name}")


@contextmanager
def stop_signals_raise() -> Iterator[None]:
    """Within the block, SIGINT, SIGTERM and SIGHUP raise `StopSignal`; the previous
    handlers come back afterwards. Call from the main thread."""
    def raise_stop(signum: int, frame: Optional[FrameType]) -> None:
        if in_finalizer(frame):
            threading.Timer(REDELIVERY_S, os.kill, (os.getpid(), signum)).start()
            return
        for stop_signal in STOP_SIGNALS:
            signal.signal(stop_signal, signal.SIG_IGN)
        raise StopSignal(signum)

    previous = {signum: signal.signal(signum, raise_stop) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def in_finalizer(frame: Optional[FrameType]) -> bool:
    """Whether `frame` runs inside a ``weakref.finalize`` callback or a ``__del__``, where the
    interpreter prints and drops whatever exception is raised."""
    while frame is not None:
        if frame.f_code is weakref.finalize.__call__.__code__ or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def signal_group(leader: int, signum: int) -> None:
    """Send `signum` to the process group `leader` leads (its own, from ``start_new_session``);
    a group with no process left is not an error."""
    try:
        os.killpg(leader, signum)
    except ProcessLookupError:
        pass


def die_with_parent() -> None:
    """In a child before exec: get SIGTERM when the thread that started it ends, which for the
    main thread means when the process dies, even by SIGKILL (Linux only; elsewhere the
    parent's clean-up is the safeguard)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
