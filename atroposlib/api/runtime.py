"""One running API server's collaborators, opened together and closed together."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Optional

from atroposlib.api.dispatch import Dispatcher
from atroposlib.api.intake import Intake
from atroposlib.api.journal import Journal
from atroposlib.api.metrics import ApiMetrics
from atroposlib.api.problems import ProblemLedger
from atroposlib.api.settings import ApiSettings
from atroposlib.api.state import RunState
from atroposlib.api.validator_pool import ValidatorPool

log = logging.getLogger("atroposlib.api")

HOUSEKEEPING_INTERVAL_S = 1.0


class Runtime:
    """The state, its journal and the services that act on it."""

    def __init__(
        self,
        settings: ApiSettings,
        metrics: Optional[ApiMetrics] = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or ApiMetrics()
        state_dir = settings.resolved_state_dir()
        if state_dir is not None and settings.fresh:
            _discard_state(state_dir)
        self.journal = Journal(state_dir, settings.fsync)
        self.state = RunState(settings, self.journal, self.metrics, clock)
        self.ledger = ProblemLedger(self.metrics.validation_warnings)
        self.intake = Intake(self.state, self.ledger)
        self.dispatch = Dispatcher(self.state)
        self.validators = ValidatorPool(
            settings.resolved_validation_workers(), settings.validation, settings.max_decompressed_bytes
        )
        self._last_housekeeping = 0.0

    @property
    def state_dir(self) -> Optional[Path]:
        return self.journal.state_dir

    def housekeep(self, force: bool = False) -> None:
        """Expire leases and silent envs, flush stale buffers, forget old history."""
        now = self.state.clock()
        if not force and 0 <= now - self._last_housekeeping < HOUSEKEEPING_INTERVAL_S:
            return
        self._last_housekeeping = now
        self.dispatch.expire_leases()
        self.state.expire_silent_envs()
        self.intake.flush_stale_buffers()
        self.intake.forget_old_submission_ids()
        self.dispatch.forget_old_history()

    def restored_summary(self) -> Optional[dict[str, Any]]:
        """What was found on disk at start-up, or None for a fresh start."""
        state = self.state
        if not state.restored:
            return None
        return {
            "state_dir": str(self.state_dir),
            "queued_groups": len(state.queue),
            "buffered_sequences": state.buffered_sequences(),
            "current_step": state.step,
            "registered": state.config.model_dump() if state.config else None,
            "envs": len(state.envs),
        }

    def close(self) -> None:
        self.validators.close()
        self.journal.close()


def _discard_state(state_dir: Path) -> None:
    for name in ("state.sqlite3", "state.sqlite3-wal", "state.sqlite3-shm"):
        path = state_dir / name
        if path.exists():
            path.unlink()
    log.warning("--fresh: discarded the stored state in %s", state_dir)
    if state_dir.exists() and not any(state_dir.iterdir()):
        shutil.rmtree(state_dir)
