"""Weights & Biases, used only when enabled and installed; without it logging is a no-op."""

from __future__ import annotations

import datetime
import logging
import random
import string
from typing import Any, Optional

log = logging.getLogger("atroposlib.envs")


def run_name(prefix: Optional[str]) -> Optional[str]:
    """``<prefix>-<YYYY-MM-DD>-<6 random letters>``, or None for W&B's own name."""
    if not prefix:
        return None
    suffix = "".join(random.choices(string.ascii_lowercase, k=6))
    return f"{prefix}-{datetime.date.today().isoformat()}-{suffix}"


class WandbRun:
    """A W&B run that may be absent (disabled, not installed, or failed to start)."""

    def __init__(self) -> None:
        self._run: Any = None

    @property
    def active(self) -> bool:
        return self._run is not None

    def start(self, project: Optional[str], group: Optional[str], name: Optional[str], config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError:
            log.warning("use_wandb is set but wandb is not installed: metrics are not logged (pip install wandb)")
            return
        try:
            self._run = wandb.init(project=project, group=group, name=name, config=config, reinit=True)
        except Exception as exc:  # a W&B outage or missing login must not stop rollouts
            log.warning("W&B did not start (%s): metrics are not logged", exc)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self._run is not None:
            self._run.log(metrics, step=step)

    def table(self, columns: list[str], rows: list[list[Any]]) -> Any:
        import wandb

        return wandb.Table(columns=columns, data=rows)

    def finish(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
