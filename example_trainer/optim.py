"""The optimizer over the trainable parameters, and the learning rate of each step."""

from __future__ import annotations

import logging

import torch

from example_trainer.config import TrainingConfig

log = logging.getLogger("example_trainer")


def create_optimizer(model: torch.nn.Module, config: TrainingConfig) -> torch.optim.Optimizer:
    """The configured optimizer over the trainable parameters, falling back to AdamW."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise RuntimeError("the model has no trainable parameters (check --train-layer-indices or the LoRA settings)")
    if config.optimizer == "adamw_8bit":
        try:
            import bitsandbytes
        except ImportError:
            log.warning("optimizer adamw_8bit needs bitsandbytes, which is not installed: using AdamW "
                        "(pip install bitsandbytes, or --optimizer adamw to silence this)")
        else:
            return bitsandbytes.optim.AdamW8bit(params, lr=config.lr)
    if config.optimizer == "adafactor":
        try:
            from transformers.optimization import Adafactor
        except ImportError:
            log.warning("optimizer adafactor needs transformers' Adafactor, which is unavailable: using AdamW")
        else:
            # Adafactor computes its own step size with relative_step and refuses a manual one.
            lr = None if config.adafactor_relative_step else config.lr
            return Adafactor(params, lr=lr, scale_parameter=config.adafactor_scale_parameter,
                             relative_step=config.adafactor_relative_step, warmup_init=False)
    return torch.optim.AdamW(params, lr=config.lr)


def learning_rate(config: TrainingConfig, step_idx: int) -> float:
    """The learning rate of step `step_idx` (0-based): linear warm-up, then constant."""
    if config.warmup_steps > 0 and step_idx < config.warmup_steps:
        return config.lr * (step_idx + 1) / config.warmup_steps
    return config.lr
