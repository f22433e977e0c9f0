"""The trainer's registration with the trajectory API; taking batches is `atroposlib.trainer_api`.

The names Atropos's trainer imports from here (`check_atropos_api`, `get_batch`,
`register_trainer`) stay importable from this module.
"""

from __future__ import annotations

from typing import Any

from atroposlib.trainer_api import (
    AtroposApiError,
    BatchFeed,
    LeasedBatch,
    RetryPolicy,
    auth_headers,
    check_atropos_api,
    get_batch,
    request,
    with_retries,
)
from atroposlib.wire import Registration
from example_trainer.config import TrainingConfig

__all__ = [
    "AtroposApiError", "BatchFeed", "LeasedBatch", "RetryPolicy", "auth_headers", "check_atropos_api",
    "get_batch", "register_trainer", "registration_payload",
]


def registration_payload(config: TrainingConfig, starting_step: int = 0) -> dict[str, Any]:
    """The ``POST /register`` body for `config` (Atropos's fields and values)."""
    interval = config.training_steps if config.checkpoint_interval <= 0 else config.checkpoint_interval
    registration = Registration(
        wandb_group=config.wandb_group or "", wandb_project=config.wandb_project or "",
        batch_size=config.registered_batch_size, max_token_len=config.seq_len, starting_step=starting_step,
        checkpoint_dir=config.save_path, save_checkpoint_interval=interval, num_steps=config.training_steps,
        max_staleness=config.registered_max_staleness,
    )
    # Atropos's eight fields, plus the staleness bound when there is one
    return registration.model_dump(exclude={"replace"} | ({"max_staleness"} if registration.max_staleness is None
                                                          else set()))


def register_trainer(config: TrainingConfig, starting_step: int = 0, replace: bool = False) -> dict[str, Any]:
    """Register the run with the API at ``config.atropos_url``; returns its answer (with ``uuid``).
    With `replace` the API's stored run settings are replaced by this trainer's."""
    url = f"{config.atropos_url}/register"
    payload = {**registration_payload(config, starting_step), **({"replace": True} if replace else {})}
    answer = with_retries(lambda: request("POST", url, json=payload).json())
    if "uuid" not in answer:
        raise AtroposApiError(f"POST {url} did not register the trainer: {answer}")
    return answer
