"""What serve mode tells the person running it: that it waits, how it goes, how it ended.

`Throttle` spaces out a repeated message (at once, then every interval, with the time
waited so far); `ServeReport` writes serve mode's periodic progress line and its final
summary from the environment's counters.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

from atroposlib.envs.accept import SAME_SCORES_REMEDY

log = logging.getLogger("atroposlib.envs")

WAIT_MESSAGE_INTERVAL_S = 30.0


def duration(seconds: float) -> str:
    """``42s``, ``3m07s`` or ``1h05m00s``."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class Throttle:
    """Says when a repeated message is due: on the first call (unless `immediate` is
    False), then once every `interval_s` seconds."""

    def __init__(self, interval_s: float = WAIT_MESSAGE_INTERVAL_S, immediate: bool = True) -> None:
        self.interval_s = interval_s
        self.started = time.monotonic()
        self.last: Optional[float] = None if immediate else self.started

    def due(self) -> Optional[float]:
        """Seconds since the throttle was made when a message is due now, else None."""
        now = time.monotonic()
        if self.last is not None and (self.interval_s <= 0 or now - self.last < self.interval_s):
            return None
        self.last = now
        return now - self.started


class ServeReport:
    """Serve mode's progress line (every `interval_s` seconds; <= 0: never) and summary."""

    def __init__(self, interval_s: float) -> None:
        self.started = time.monotonic()
        self.throttle = Throttle(interval_s, immediate=False)

    @staticmethod
    def _counts(env: Any) -> str:
        api = getattr(env, "api", None)
        parts = [f"{env.groups_sent} groups sent ({env.rollouts_sent} rollouts)", env.skipped.summary()]
        if api is not None:
            if api.items_rejected:
                parts.append(f"{api.items_rejected} rejected by the API (kept in {api.rejected_path})")
            spooled = len(api.spool)
            if spooled:
                parts.append(f"{spooled} spooled in {api.spool.folder}")
        return ", ".join(parts)

    def maybe_log(self, env: Any, status: dict[str, Any]) -> None:
        """Log the progress line when it is due."""
        if self.throttle.due() is None:
            return
        log.info(
            "step %d/%d: %s; %d groups queued at the API, %d groups in progress",
            env.curr_step, env.config.total_steps, self._counts(env), status.get("queue_size", 0), len(env.workers),
        )

    def summary(self, env: Any, outcome: str) -> str:
        """The final line: why serve mode stopped and what it did."""
        line = (f"serve stopped ({outcome}) after {duration(time.monotonic() - self.started)}: "
                f"step {env.curr_step}/{env.config.total_steps}, {self._counts(env)}")
        return line + (f"; {SAME_SCORES_REMEDY}" if env.skipped.get("same_scores") else "")
