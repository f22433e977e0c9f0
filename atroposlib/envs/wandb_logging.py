"""Weights & Biases, used only when enabled and installed; without it logging is a no-op."""

from __future__ import annotations

import datetime
import logging
import netrc
import os
import random
import string
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

log = logging.getLogger("atroposlib.envs")


def run_name(prefix: Optional[str]) -> Optional[str]:
    """``<prefix>-<YYYY-MM-DD>-<6 random letters>``, or None for W&B's own name."""
    if not prefix:
        return None
    suffix = "".join(random.choices(string.ascii_lowercase, k=6))
    return f"{prefix}-{datetime.date.today().isoformat()}-{suffix}"


def wandb_api_key_available() -> bool:
    """Whether W&B can authenticate without asking: ``WANDB_API_KEY`` or a netrc entry for its host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    netrc_path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return netrc.netrc(str(netrc_path)).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def choose_wandb_mode() -> Optional[str]:
    """The mode to start W&B in: the user's ``WANDB_MODE`` if set, else online with a key, else offline.

    Without a key W&B would ask for one on a terminal, or fail after a network time-out
    without one; offline runs never ask and can be uploaded later with ``wandb sync``.
    """
    if os.environ.get("WANDB_MODE"):
        return None
    if wandb_api_key_available():
        return None
    log.warning("W&B: no API key (WANDB_API_KEY or `wandb login`), so metrics are logged offline under ./wandb "
                "(upload later with `wandb sync`; WANDB_MODE=disabled or --env.use_wandb false turns W&B off)")
    return "offline"


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
            self._run = wandb.init(project=project, group=group, name=name, config=config, reinit=True,
                                   mode=choose_wandb_mode())
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
