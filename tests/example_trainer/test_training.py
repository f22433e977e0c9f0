"""Atropos's GRPO loss through `compute_grpo_loss` (hand-computed cases, both signs of the
advantage), missing logprobs, the training step, and a tiny model that learns. The loss
variants are pinned in test_loss.py, the optimizer in test_optim.py, output in test_reporting.py."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest
import torch

from example_trainer import training
from example_trainer.config import TrainingConfig
from example_trainer.data import MicroBatch, prepare_batch
from example_trainer.model import load_model_and_tokenizer
from example_trainer.training import compute_grpo_loss, create_optimizer, run_training_step
from tests.example_trainer.tiny_model import build_tiny_model

LN2 = math.log(2.0)


class FixedLogits(torch.nn.Module):
    """A 'model' whose logits are a parameter: gradients show exactly which tokens push."""

    def __init__(self, batch: int, width: int, vocab: int = 2) -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(batch, width, vocab))

    def forward(self, tokens: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.logits)


def micro(labels: list[list[int]], advantages: list[float], logprobs: Optional[list[list[float]]],
          temperatures: Optional[list[float]] = None, missing: Optional[list[bool]] = None,
          sft: Optional[list[bool]] = None) -> MicroBatch:
    rows = len(labels)
    return MicroBatch(
        tokens=torch.zeros(rows, len(labels[0]), dtype=torch.long), labels=torch.tensor(labels),
        advantages=torch.tensor(advantages).view(-1, 1),
        temperatures=torch.tensor(temperatures or [1.0] * rows).view(-1, 1, 1),
        inference_logprobs=None if logprobs is None else torch.tensor(logprobs),
        logprobs_missing=torch.tensor(missing or [logprobs is None] * rows),
        sft=torch.tensor(sft or [False] * rows))


# Zero logits over 2 classes: every trained token has logp = -ln 2. Sampler logprobs chosen so
# the ratios are 1.5 (A=+1, clipped), then 0.5 and 1.5 (A=-1).
HAND = dict(labels=[[0, -100], [1, 1]], advantages=[1.0, -1.0],
            logprobs=[[-LN2 - math.log(1.5), 1.0], [-LN2 - math.log(0.5), -LN2 - math.log(1.5)]])


def test_loss_matches_a_hand_computed_example_for_both_signs() -> None:
    model = FixedLogits(2, 2)
    loss, metrics = compute_grpo_loss(model, micro(**HAND), gradient_accumulation_steps=2, clip_eps=0.2)
    # row 0: -min(1.5, 1.2) = -1.2; row 1: mean(-min(-0.5, -0.8), -min(-1.5, -1.2)) = mean(0.8, 1.5)
    expected = (-1.2 + (0.8 + 1.5) / 2) / 2 / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["mean_ratio"] == pytest.approx(3.5 / 3, abs=1e-6)
    assert metrics["clipped_fraction"] == pytest.approx(1.0)
    assert metrics["pos_count"] == 1 and metrics["neg_count"] == 1
    assert metrics["pos_logp"] == pytest.approx(-LN2) and metrics["neg_logp"] == pytest.approx(-LN2)
    assert metrics["logprob_diff_mean"] == pytest.approx((2 * math.log(1.5) + math.log(0.5)) / 3, abs=1e-6)
    assert metrics["logprob_diff_max"] == pytest.approx(math.log(2.0), abs=1e-6)


def test_clipping_stops_the_right_side_for_negative_advantages() -> None:
    model = FixedLogits(2, 2)
    loss, _ = compute_grpo_loss(model, micro(**HAND), gradient_accumulation_steps=1, clip_eps=0.2)
    loss.backward()
    grad = model.logits.grad.abs().sum(-1)
    assert float(grad[0, 0]) == 0.0  # A > 0, r > 1 + eps: clipped, no push further up
    assert float(grad[1, 0]) == 0.0  # A < 0, r < 1 - eps: already pushed down enough
    assert float(grad[1, 1]) > 0.0  # A < 0, r > 1 + eps: must still be pushed down


def test_on_policy_ratio_is_one_and_gradient_is_the_policy_gradient() -> None:
    model = FixedLogits(1, 2)
    batch = micro([[0, 1]], [2.0], [[-LN2, -LN2]])
    loss, metrics = compute_grpo_loss(model, batch, gradient_accumulation_steps=1, clip_eps=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(-2.0) and metrics["mean_ratio"] == pytest.approx(1.0)
    # d(-A * mean logp)/d logit of the label = -A * (1 - 0.5) / 2 tokens
    assert float(model.logits.grad[0, 0, 0]) == pytest.approx(-0.5)


def test_temperature_scales_logits_and_non_positive_means_one() -> None:
    model = FixedLogits(1, 1)
    with torch.no_grad():
        model.logits[0, 0] = torch.tensor([2.0, 0.0])
    values = []
    for temperature in (1.0, 0.0, -1.0, 2.0):
        batch = micro([[0]], [1.0], [[0.0]], temperatures=[temperature])
        values.append(compute_grpo_loss(model, batch, gradient_accumulation_steps=1, clip_eps=10.0)[0].item())
    assert values[0] == values[1] == values[2]
    assert values[3] == pytest.approx(-1 / (1 + math.exp(-1.0)))  # softmax([1, 0])[0] at T=2


def test_kl_term_adds_the_k3_estimate() -> None:
    model = FixedLogits(1, 1)
    sampled = -LN2 + 0.3
    batch = micro([[0]], [0.0], [[sampled]])
    plain, _ = compute_grpo_loss(model, batch, gradient_accumulation_steps=1, clip_eps=0.2)
    with_kl, _ = compute_grpo_loss(model, batch, gradient_accumulation_steps=1, clip_eps=0.2, kl_coef=0.5)
    assert (with_kl - plain).item() == pytest.approx(0.5 * (math.exp(0.3) - 0.3 - 1), abs=1e-6)


def test_sft_rows_are_trained_with_cross_entropy() -> None:
    model = FixedLogits(2, 1)
    batch = micro([[0], [1]], [-5.0, 0.0], [[-3.0], [-LN2]], sft=[True, False])
    loss, metrics = compute_grpo_loss(model, batch, gradient_accumulation_steps=1, clip_eps=0.2)
    assert loss.item() == pytest.approx((LN2 + 0.0) / 2)
    assert metrics["sft_count"] == 1 and metrics["mean_ratio"] == pytest.approx(1.0)


def test_missing_logprobs_on_policy_warns_once(monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(training, "_warned_missing_logprobs", False)
    model = FixedLogits(2, 1)
    partly = micro([[0], [0]], [1.0, -1.0], [[-LN2 - math.log(1.5)], [1.0]], missing=[False, True])
    with caplog.at_level(logging.WARNING, logger="example_trainer"):
        loss, metrics = compute_grpo_loss(model, partly, gradient_accumulation_steps=1, clip_eps=0.2)
        compute_grpo_loss(model, micro([[0], [0]], [1.0, -1.0], None), gradient_accumulation_steps=1, clip_eps=0.2)
    assert loss.item() == pytest.approx((-1.2 + 1.0) / 2)  # the missing row: ratio 1, -A
    assert metrics["missing_count"] == 1
    assert sum("no inference_logprobs" in r.getMessage() for r in caplog.records) == 1


def test_missing_logprobs_error_mode_refuses() -> None:
    with pytest.raises(ValueError, match="no inference_logprobs.*server_type vllm"):
        compute_grpo_loss(FixedLogits(1, 1), micro([[0]], [1.0], None), gradient_accumulation_steps=1,
                          clip_eps=0.2, missing_logprobs="error")


# --- optimizer and step ------------------------------------------------------------------

def config(**overrides: Any) -> TrainingConfig:
    values: dict[str, Any] = dict(model_name="tiny", device="cpu", optimizer="adamw", lr=1e-3,
                                  gradient_accumulation_steps=1, dtype="float32")
    values.update(overrides)
    return TrainingConfig(**values)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"), tokenizer_dir)


def completions(tokenizer: Any) -> list[dict]:
    """One group: a prompt, a rewarded completion and an unrewarded one."""
    prompt = tokenizer("What is 2 + 2?")["input_ids"]
    good, bad = tokenizer(" The answer is 4.")["input_ids"], tokenizer(" Hello there")["input_ids"]
    rows = [prompt + good, prompt + bad]
    return [{"tokens": rows, "masks": [[-100] * len(prompt) + row[len(prompt):] for row in rows],
             "scores": [1.0, 0.0], "overrides": None, "generation_params": None, "group_overrides": None}]


def sequence_logps(model: torch.nn.Module, group: list[dict]) -> list[float]:
    micro_batch = prepare_batch(group, 8, extract_inference_logprobs=False).micro_batches[0]
    with torch.no_grad():
        logp = training.token_logprobs(model, micro_batch)
    mask = (micro_batch.labels != -100).float()
    return ((logp * mask).sum(-1) / mask.sum(-1)).tolist()


def with_sampler_logprobs(model: torch.nn.Module, group: list[dict]) -> list[dict]:
    """The group with `model`'s own log-probabilities as inference_logprobs (an on-policy sample)."""
    micro_batch = prepare_batch(group, 8, extract_inference_logprobs=False).micro_batches[0]
    model.eval()
    with torch.no_grad():
        logp = training.token_logprobs(model, micro_batch)
    model.train()
    rows = []
    for i, tokens in enumerate(group[0]["tokens"]):
        shifted = logp[i, :len(tokens) - 1].tolist()
        rows.append([1.0] + [value if group[0]["masks"][i][j + 1] != -100 else 1.0 for j, value in enumerate(shifted)])
    return [dict(group[0], inference_logprobs=rows)]


def test_training_step_accumulates_clips_and_reports(tiny_model_dir: Path) -> None:
    cfg = config(model_name=str(tiny_model_dir), gradient_accumulation_steps=2, batch_size=1, warmup_steps=2)
    model, tokenizer = load_model_and_tokenizer(cfg)
    optimizer = create_optimizer(model, cfg)
    batch = prepare_batch(with_sampler_logprobs(model, completions(tokenizer)), cfg.batch_size)
    before = [p.detach().clone() for p in model.parameters()]
    metrics = run_training_step(model, optimizer, batch, cfg, step_idx=0)
    assert set(training.STEP_KEYS) <= set(metrics)
    assert metrics["lr"] == pytest.approx(cfg.lr / 2) and optimizer.param_groups[0]["lr"] == pytest.approx(cfg.lr / 2)
    assert metrics["pos_count"] == 1 and metrics["neg_count"] == 1
    assert metrics["mean_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["alignment/diff_abs_mean"] < 1e-4
    assert {"logprobs/training_mean", "logprobs/inference_std", "alignment/diff_max"} <= set(metrics)
    assert metrics["grad_norm"] > 0 and all(p.grad is None for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_tiny_model_learns_from_advantages(tiny_model_dir: Path) -> None:
    cfg = config(model_name=str(tiny_model_dir), lr=3e-3, batch_size=2)
    model, tokenizer = load_model_and_tokenizer(cfg)
    optimizer = create_optimizer(model, cfg)
    group = completions(tokenizer)
    good_before, bad_before = sequence_logps(model, group)
    batch = prepare_batch(with_sampler_logprobs(model, group), cfg.batch_size)  # sampled once, reused
    for step in range(8):
        metrics = run_training_step(model, optimizer, batch, cfg, step)
    good_after, bad_after = sequence_logps(model, group)
    assert good_after > good_before + 0.1
    assert bad_after < bad_before - 0.1
    assert metrics["clipped_fraction"] > 0  # the policy has moved past 1 +- eps from the sampler




# --- the whole step: accumulation, dropout, the reference model, metrics ---------------------

def varied_groups(tokenizer: Any) -> list[dict]:
    """Two groups of four rollouts of different lengths and scores, with sampler logprobs a
    little off the model's so that ratios, clipping and KL are all non-trivial."""
    groups = []
    for g, prompt_text in enumerate(("What is 2 + 2?", "Name a colour.")):
        prompt = tokenizer(prompt_text)["input_ids"]
        rows = [prompt + tokenizer(" " + " ".join(["word"] * (k + 1) * (g + 1)))["input_ids"] for k in range(4)]
        masks = [[-100] * len(prompt) + row[len(prompt):] for row in rows]
        logprobs = [[1.0] * len(prompt) + [-2.0 - 0.1 * j for j in range(len(row) - len(prompt))] for row in rows]
        groups.append({"tokens": rows, "masks": masks, "scores": [1.0, 0.0, 0.5, -1.0][: len(rows)],
                       "inference_logprobs": logprobs, "overrides": None, "generation_params": {"temperature": 0.8},
                       "group_overrides": None})
    return groups


def update_of_one_step(model_dir: Path, batch_size: int, accumulation: int, **options: Any) -> list[torch.Tensor]:
    """The parameter change of one step with plain SGD at learning rate 1: the (clipped) gradient
    itself, which Adam's per-parameter normalisation would blow up where it is nearly 0."""
    cfg = config(model_name=str(model_dir), batch_size=batch_size, gradient_accumulation_steps=accumulation,
                 lr=1.0, **options)
    model, tokenizer = load_model_and_tokenizer(cfg)
    before = [p.detach().clone() for p in model.parameters()]
    batch = prepare_batch(varied_groups(tokenizer), cfg.batch_size, pack=True, pad_multiple=cfg.pad_multiple)
    run_training_step(model, torch.optim.SGD(model.parameters(), lr=1.0), batch, cfg, step_idx=0)
    return [after.detach() - start for after, start in zip(model.parameters(), before)]


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "gspo"])
def test_gradient_accumulation_over_micro_batches_gives_the_update_of_one_batch(tiny_model_dir: Path,
                                                                                 loss_type: str) -> None:
    options = dict(loss_type=loss_type, kl_coef=0.05, epsilon_high=0.3)
    whole = update_of_one_step(tiny_model_dir, 8, 1, **options)
    accumulated = update_of_one_step(tiny_model_dir, 2, 4, **options)
    assert any(float(delta.abs().max()) > 1e-3 for delta in whole)
    for a, b in zip(whole, accumulated):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_dropout_is_off_in_the_rl_forward(tiny_model_dir: Path) -> None:
    cfg = config(model_name=str(tiny_model_dir), weight_bridge_mode="lora_restart", lora_dropout=0.5)
    model, tokenizer = load_model_and_tokenizer(cfg)
    assert model.training  # gradient checkpointing needs train mode
    batch = prepare_batch(varied_groups(tokenizer), 8).micro_batches[0]
    first, second = training.token_logprobs(model, batch), training.token_logprobs(model, batch)
    assert torch.equal(first, second)


def test_kl_against_a_frozen_reference_model(tiny_model_dir: Path) -> None:
    from example_trainer.model import reference_logprobs

    cfg = config(model_name=str(tiny_model_dir), kl_coef=0.1, kl_reference="model", lr=5e-2)
    model, tokenizer = load_model_and_tokenizer(cfg)
    reference = reference_logprobs(model, cfg)
    assert reference is not None
    optimizer = create_optimizer(model, cfg)
    batch = prepare_batch(varied_groups(tokenizer), 8)
    first = run_training_step(model, optimizer, batch, cfg, 0, reference)
    assert first["grpo/kl_reference"] == pytest.approx(0.0, abs=1e-6)  # the same weights at step 0
    second = run_training_step(model, optimizer, batch, cfg, 1, reference)
    assert second["grpo/kl_reference"] > 0  # the policy moved, the reference did not
    assert reference_logprobs(model, config(model_name=str(tiny_model_dir), kl_coef=0.1)) is None  # sampler KL


def test_step_metrics_report_entropy_kl_clip_binding_and_positions(tiny_model_dir: Path) -> None:
    cfg = config(model_name=str(tiny_model_dir), batch_size=4, tis_cap=2.0)
    model, tokenizer = load_model_and_tokenizer(cfg)
    optimizer = create_optimizer(model, cfg)
    batch = prepare_batch(varied_groups(tokenizer), cfg.batch_size, pack=True, pad_multiple=1)
    metrics = run_training_step(model, optimizer, batch, cfg, 0)
    assert metrics["grpo/entropy"] > 0 and metrics["grpo/kl"] > 0
    assert 0 <= metrics["grpo/clip_binding_fraction"] <= metrics["clipped_fraction"] <= 1
    assert 0 < metrics["grpo/tis_weight_mean"] <= 2.0 and 0 <= metrics["grpo/tis_capped_fraction"] <= 1
    assert metrics["train/positions"] == batch.positions
    assert metrics["num_sequences"] == 8
