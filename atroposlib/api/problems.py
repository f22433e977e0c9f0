"""The ledger of validation problems the server accepted (``--validation warn``).

Each problem is counted in Prometheus by reason (``atropos_validation_warnings_total``)
and logged; the log says the first occurrence of a reason at once and then at most one
line a minute per reason with the count since, so a misbehaving client cannot flood it.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable

from prometheus_client import Counter

from atroposlib.api.group_checks import Problem

log = logging.getLogger("atroposlib.api")

LOG_INTERVAL_S = 60.0


class ProblemLedger:
    """Counts accepted validation problems and logs them without flooding."""

    def __init__(self, counter: Counter, clock: Callable[[], float] = time.monotonic) -> None:
        self.counter = counter
        self.clock = clock
        self._last_logged: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def record(self, problems: Iterable[Problem]) -> None:
        now = self.clock()
        for problem in problems:
            self.counter.labels(reason=problem.reason).inc()
            last = self._last_logged.get(problem.reason)
            if last is not None and now - last < LOG_INTERVAL_S:
                self._unlogged[problem.reason] = self._unlogged.get(problem.reason, 0) + 1
                continue
            since = self._unlogged.pop(problem.reason, 0)
            suffix = f" ({since} more since the last report)" if since else ""
            log.warning("accepted with a validation warning (%s): %s%s", problem.reason, problem.text(), suffix)
            self._last_logged[problem.reason] = now
