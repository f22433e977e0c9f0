"""The optimizer choices and their fallbacks, and the learning-rate schedule."""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest
import torch

from example_trainer.config import TrainingConfig
from example_trainer.optim import create_optimizer, learning_rate


def config(**overrides: Any) -> TrainingConfig:
    values: dict[str, Any] = dict(model_name="tiny", device="cpu", optimizer="adamw", lr=1e-3,
                                  gradient_accumulation_steps=1, dtype="float32")
    values.update(overrides)
    return TrainingConfig(**values)


def test_optimizer_choices_and_fallbacks(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from transformers.optimization import Adafactor

    model = torch.nn.Linear(2, 2)
    assert type(create_optimizer(model, config())) is torch.optim.AdamW
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import fails as when not installed
    with caplog.at_level(logging.WARNING, logger="example_trainer"):
        assert type(create_optimizer(model, config(optimizer="adamw_8bit"))) is torch.optim.AdamW
    assert "bitsandbytes" in caplog.text
    assert isinstance(create_optimizer(model, config(optimizer="adafactor")), Adafactor)
    assert isinstance(create_optimizer(model, config(optimizer="adafactor", adafactor_relative_step=True)), Adafactor)
    for param in model.parameters():
        param.requires_grad_(False)
    with pytest.raises(RuntimeError, match="no trainable parameters"):
        create_optimizer(model, config())


def test_warmup_is_linear_then_constant() -> None:
    cfg = config(lr=1e-3, warmup_steps=4)
    assert [learning_rate(cfg, step) for step in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert learning_rate(config(lr=1e-3), 0) == 1e-3
