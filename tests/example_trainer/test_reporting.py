"""What the trainer prints and logs: Atropos's W&B names, the console line, the summary."""

from __future__ import annotations

from typing import Any

import pytest

from example_trainer import reporting
from example_trainer.config import TrainingConfig
from example_trainer.reporting import console_line, finalize_training, log_metrics, setup_wandb, wandb_metrics


def config(**overrides: Any) -> TrainingConfig:
    values: dict[str, Any] = dict(model_name="tiny", device="cpu", optimizer="adamw", dtype="float32")
    values.update(overrides)
    return TrainingConfig(**values)


STEP = {"loss": 0.0123, "lr": 1e-5, "grad_norm": 0.5, "pos_logp": -1.2, "neg_logp": -2.3, "pos_count": 4,
        "neg_count": 4, "mean_ratio": 1.01, "clipped_fraction": 0.05, "step_time": 12.5, "sync_time": 3.0,
        "alignment/diff_mean": 0.01}


def test_metrics_use_atropos_names() -> None:
    logged = wandb_metrics(STEP, {"train/data_fetch_time": 0.1})
    assert {"train/loss", "train/grad_norm", "train/lr", "train/pos_logp", "train/neg_logp", "grpo/mean_ratio",
            "grpo/clipped_fraction", "train/step_time", "train/sync_time", "alignment/diff_mean",
            "train/data_fetch_time"} <= set(logged)
    assert logged["grpo/clipped_fraction"] == 0.05


def test_console_line_is_one_readable_line(capsys: pytest.CaptureFixture) -> None:
    log_metrics(STEP, 3, use_wandb=False, benchmark=True)
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    for part in ("step 3", "loss 0.0123", "grad norm 0.500", "ratio 1.010", "clipped 5.0%", "advantages +4/-4",
                 "time train 12.5s + sync 3.0s"):
        assert part in out


def test_the_step_line_says_where_the_time_went_and_which_speed_is_which() -> None:
    step = {**STEP, "data_fetch_time": 4.25, "checkpoint_time": 0.5, "train/tokens_per_s": 120.4,
            "vllm/generation_tokens_per_s": 41.6, "grpo/outside_truncation": 3, "train/skipped_step": 1}
    parts = console_line(step, 3).split(" | ")
    assert "time wait 4.2s + train 12.5s + save 0.5s + sync 3.0s" in parts
    assert "training 120 positions/s, vLLM generated 42 tokens/s" in parts
    assert "3 sampled tokens outside top-p/top-k/min-p scored untruncated" in parts
    assert "optimizer step SKIPPED (non-finite)" in parts


def test_wandb_needs_a_project_and_runs_disabled(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert setup_wandb(config()) is False
    assert setup_wandb(config(use_wandb=True)) is False
    assert "--wandb-project" in capsys.readouterr().out
    cfg = config(use_wandb=True, wandb_project="p")
    assert setup_wandb(cfg) is True and cfg.wandb_group and len(cfg.wandb_group) == 8
    log_metrics(STEP, 1, use_wandb=True)
    finalize_training(True, training_start_time=0.0, mode="none", total_steps=1)
    assert not reporting._wandb.active


def test_finalize_prints_a_summary_and_benchmark_table(capsys: pytest.CaptureFixture) -> None:
    finalize_training(False, training_start_time=None, mode="reload", total_steps=2,
                      benchmark_stats={"step_times": [1.0, 3.0], "sync_times": [0.5]}, benchmark=True)
    out = capsys.readouterr().out
    assert "2 steps" in out and "reload" in out
    assert "avg step time" in out and "2.00s" in out and "avg sync time (x1)" in out
