"""One GRPO optimizer step: every micro-batch of a batch forward and backward, then the step.

For each micro-batch the model scores the labels under the distribution each rollout was
sampled from (`example_trainer.logprobs`), the sampler's log-probabilities stand in where
a rollout has none (or the run stops, per ``missing_logprobs``), and the configured policy
loss (`example_trainer.loss`) is normalised by the whole step's sequences and tokens, so
the micro-batches' gradients add up to the gradient of the batch taken at once. Then the
gradient norm is clipped to 1 and the optimizer steps. Forward passes run in the compute
dtype over float32 master weights (`example_trainer.precision`). A step whose loss or
gradient norm is not finite changes nothing: the optimizer step is skipped with a warning
and counted (``train/skipped_step``); the loop stops a run that keeps skipping.

On several processes (`example_trainer.distributed`) each rank trains its share of the
rollouts, gradients are averaged once per step, and the metrics are summed over the ranks
(the spread of log-probabilities is rank 0's share).

The step's metrics keep Atropos's names (``loss``, ``mean_ratio``, ``clipped_fraction``,
``alignment/diff_mean``, ...) and add ``grpo/clip_binding_fraction`` (trained tokens whose
gradient the clip removed), ``grpo/entropy`` (of the sampling distribution), ``grpo/kl``
(k3 against the sampler), ``grpo/kl_reference`` (against the reference model, when one is
used), ``grpo/tis_weight_mean`` and ``grpo/tis_capped_fraction`` (with ``--tis-cap``),
``grpo/outside_truncation`` (sampled tokens outside the trainer's top-p/top-k/min-p set,
scored untruncated: `example_trainer.logprobs`).
The optimizer lives in `example_trainer.optim`, console and W&B output in
`example_trainer.reporting`; both are re-exported here under Atropos's names.
"""

from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch

from example_trainer.config import TrainingConfig
from example_trainer.data import LABEL_PAD, MicroBatch, PreparedBatch
from example_trainer.distributed import Ranks, max_float, sum_floats
from example_trainer.logprobs import ReferenceLogprobs, sampled_token_logprobs
from example_trainer.loss import LossSettings, LossTerms, StepTotals, k3, policy_loss
from example_trainer.optim import create_optimizer, learning_rate
from example_trainer.precision import Precision, precision_for
from example_trainer.reporting import (TIMING_KEYS, console_line, finalize_training, log_metrics, setup_wandb,
                                       wandb_metrics)

__all__ = ["MAX_GRAD_NORM", "STEP_KEYS", "TIMING_KEYS", "compute_grpo_loss", "console_line", "create_optimizer",
           "finalize_training", "learning_rate", "log_metrics", "loss_settings", "micro_batch_loss",
           "run_training_step", "setup_wandb", "step_totals", "token_logprobs", "wandb_metrics"]

log = logging.getLogger("example_trainer")

MAX_GRAD_NORM = 1.0
MISALIGNED_SAMPLER_LOGP = 0.5  # a mean sampler logprob above this means 1.0 placeholders were trained on
STEP_KEYS = ("loss", "lr", "grad_norm", "pos_logp", "neg_logp", "pos_count", "neg_count", "mean_ratio",
             "clipped_fraction", "grpo/clip_binding_fraction", "grpo/entropy", "grpo/kl")

_warned_missing_logprobs = False


def loss_settings(config: TrainingConfig) -> LossSettings:
    """The policy loss `config` asks for."""
    return LossSettings(loss_type=config.loss_type, clip_eps=config.clip_eps, clip_eps_high=config.epsilon_high,
                        dual_clip=config.dual_clip, tis_cap=config.tis_cap, kl_coef=config.kl_coef)


def step_totals(batch: PreparedBatch, config: TrainingConfig) -> StepTotals:
    """The sequences and trained tokens of the whole step, and Dr. GRPO's constant length."""
    return StepTotals(sequences=batch.num_sequences, tokens=batch.num_tokens,
                      norm_length=config.loss_norm_length or config.seq_len)


def token_logprobs(model: torch.nn.Module, micro: MicroBatch, match_truncation: bool = True) -> torch.Tensor:
    """``[B, P]`` log-probabilities of the labels under each rollout's sampling distribution
    (temperature, and top-p/top-k/min-p unless `match_truncation` is off); 0 where masked."""
    return sampled_token_logprobs(model, micro, match_truncation).logp


def _sampler_logprobs(logp: torch.Tensor, micro: MicroBatch,
                      missing_logprobs: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler's log-probabilities, with detached current ones standing in for missing rows."""
    global _warned_missing_logprobs
    missing = micro.logprobs_missing.to(logp.device)
    if micro.inference_logprobs is None:
        missing = torch.ones_like(missing)
    if not bool(missing.any()):
        assert micro.inference_logprobs is not None
        return micro.inference_logprobs.to(logp.device, logp.dtype), missing
    if missing_logprobs == "error":
        raise ValueError(f"{int(missing.sum())} of {missing.numel()} rollouts have no inference_logprobs; GRPO "
                         "needs the sampler's log-probabilities (run the environment with server_type vllm, "
                         "or --missing-logprobs on_policy to train those rollouts on-policy)")
    if not _warned_missing_logprobs:
        log.warning("some rollouts have no inference_logprobs: they are trained on-policy (ratio 1, no clipping); "
                    "environments with server_type vllm send them")
        _warned_missing_logprobs = True
    if micro.inference_logprobs is None:
        return logp.detach(), missing
    sampled = micro.inference_logprobs.to(logp.device, logp.dtype)
    return torch.where(missing.unsqueeze(-1), logp.detach(), sampled), missing


SUMMED_STATS = ("policy_tokens", "ratio", "outside_band", "clip_binds", "entropy", "kl", "kl_reference",
                "tis_weight", "tis_capped", "diff", "diff_abs", "aligned_tokens", "pos_logp", "neg_logp",
                "pos_count", "neg_count", "missing_count", "sft_count", "outside_truncation")


@dataclass
class MicroStats:
    """Sums over one micro-batch's trained tokens (policy rows only, SFT rows excluded), so a
    step's statistics are exact however its rollouts were split."""

    policy_tokens: float = 0.0
    ratio: float = 0.0
    outside_band: float = 0.0
    clip_binds: float = 0.0
    entropy: float = 0.0
    kl: float = 0.0
    kl_reference: float = 0.0
    tis_weight: float = 0.0
    tis_capped: float = 0.0
    diff: float = 0.0
    diff_abs: float = 0.0
    diff_max: float = 0.0
    aligned_tokens: float = 0.0
    pos_logp: float = 0.0
    neg_logp: float = 0.0
    pos_count: int = 0
    neg_count: int = 0
    missing_count: int = 0
    sft_count: int = 0
    outside_truncation: int = 0
    training_logprobs: list[torch.Tensor] = field(default_factory=list)
    inference_logprobs: list[torch.Tensor] = field(default_factory=list)

    def add(self, other: "MicroStats") -> None:
        for name in SUMMED_STATS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.diff_max = max(self.diff_max, other.diff_max)
        self.training_logprobs += other.training_logprobs
        self.inference_logprobs += other.inference_logprobs

    def mean(self, name: str, default: float = 0.0) -> float:
        """A per-token mean over the policy tokens."""
        return getattr(self, name) / self.policy_tokens if self.policy_tokens else default


@torch.no_grad()
def _micro_stats(logp: torch.Tensor, sampled: torch.Tensor, terms: LossTerms, entropy: Optional[torch.Tensor],
                 micro: MicroBatch, missing: torch.Tensor, settings: LossSettings,
                 reference_logp: Optional[torch.Tensor], untruncated: torch.Tensor) -> MicroStats:
    mask = (micro.labels != LABEL_PAD).to(logp.dtype)
    sft = micro.sft.to(logp.device)
    policy = mask * (~sft).to(mask.dtype).unsqueeze(-1)
    aligned = (policy * (~missing).unsqueeze(-1).to(mask.dtype)).bool()
    train_flat, inference_flat = logp[aligned], sampled[aligned]
    diff = train_flat - inference_flat
    if inference_flat.numel() and float(inference_flat.mean()) > MISALIGNED_SAMPLER_LOGP:
        log.warning("mean sampler logprob on trained tokens is %.3f (> %.1f): inference_logprobs look misaligned "
                    "with the masks", float(inference_flat.mean()), MISALIGNED_SAMPLER_LOGP)
    outside = (terms.ratio < 1 - settings.clip_eps) | (terms.ratio > 1 + settings.upper_clip)
    sequence_logp = (logp * mask).sum(-1) / mask.sum(-1).clamp_min(1e-8)
    advantages = micro.advantages.to(logp.device, logp.dtype).expand_as(logp)
    positive = (advantages * mask).sum(-1) / mask.sum(-1).clamp_min(1e-8) > 0
    total = lambda values: float((values.to(policy.dtype) * policy).sum())  # noqa: E731
    return MicroStats(
        policy_tokens=float(policy.sum()), ratio=total(terms.ratio), outside_band=total(outside),
        clip_binds=total(terms.clip_binds), entropy=total(entropy) if entropy is not None else 0.0,
        kl=total(k3(sampled - logp)), kl_reference=total(k3(reference_logp - logp)) if reference_logp is not None
        else 0.0, tis_weight=total(terms.tis_weight) if terms.tis_weight is not None else 0.0,
        tis_capped=total(terms.tis_weight >= settings.tis_cap) if terms.tis_weight is not None else 0.0,
        diff=float(diff.sum()), diff_abs=float(diff.abs().sum()),
        diff_max=float(diff.abs().max()) if diff.numel() else 0.0, aligned_tokens=float(diff.numel()),
        pos_logp=float(sequence_logp[positive].sum()), neg_logp=float(sequence_logp[~positive].sum()),
        pos_count=int(positive.sum()), neg_count=int((~positive).sum()), missing_count=int(missing.sum()),
        sft_count=int(sft.sum()), outside_truncation=int((untruncated & policy.bool()).sum()),
        training_logprobs=[train_flat.cpu()], inference_logprobs=[inference_flat.cpu()])


def micro_batch_loss(model: torch.nn.Module, micro: MicroBatch, settings: LossSettings, totals: StepTotals, *,
                     missing_logprobs: str = "on_policy", match_truncation: bool = True,
                     reference: Optional[ReferenceLogprobs] = None) -> tuple[torch.Tensor, MicroStats]:
    """One micro-batch's share of the step's loss (ready for ``backward``) and its statistics."""
    logp, entropy, outside = sampled_token_logprobs(model, micro, match_truncation, with_entropy=True)
    sampled, missing = _sampler_logprobs(logp, micro, missing_logprobs)
    reference_logp = reference(micro) if reference is not None else None
    mask = micro.labels != LABEL_PAD
    terms = policy_loss(logp, sampled, micro.advantages, mask, settings, totals, sft=micro.sft,
                        reference_logp=reference_logp)
    return terms.loss, _micro_stats(logp.detach(), sampled, terms, entropy, micro, missing, settings, reference_logp,
                                    outside)


def compute_grpo_loss(model: torch.nn.Module, micro: MicroBatch, *, gradient_accumulation_steps: int,
                      clip_eps: float, kl_coef: float = 0.0,
                      missing_logprobs: str = "on_policy") -> tuple[torch.Tensor, dict[str, Any]]:
    """Atropos's function: the GRPO loss of `micro` as one of `gradient_accumulation_steps`
    equal micro-batches, and its diagnostics."""
    trained = int((micro.labels != LABEL_PAD).sum())
    totals = StepTotals(sequences=micro.size * gradient_accumulation_steps,
                        tokens=trained * gradient_accumulation_steps)
    loss, stats = micro_batch_loss(model, micro, LossSettings(clip_eps=clip_eps, kl_coef=kl_coef), totals,
                                   missing_logprobs=missing_logprobs)
    return loss, {
        "mean_ratio": stats.mean("ratio", 1.0), "clipped_fraction": stats.mean("outside_band"),
        "logprob_diff_mean": stats.diff / stats.aligned_tokens if stats.aligned_tokens else 0.0,
        "logprob_diff_abs_mean": stats.diff_abs / stats.aligned_tokens if stats.aligned_tokens else 0.0,
        "logprob_diff_max": stats.diff_max,
        "pos_logp": stats.pos_logp / stats.pos_count if stats.pos_count else 0.0,
        "neg_logp": stats.neg_logp / stats.neg_count if stats.neg_count else 0.0,
        "pos_count": stats.pos_count, "neg_count": stats.neg_count, "missing_count": stats.missing_count,
        "sft_count": stats.sft_count, "training_logprobs": torch.cat(stats.training_logprobs),
        "inference_logprobs": torch.cat(stats.inference_logprobs)}


def _spread(prefix: str, values: list[torch.Tensor]) -> dict[str, float]:
    flat = torch.cat(values) if values else torch.empty(0)
    if not flat.numel():
        return {}
    std = float(flat.std()) if flat.numel() > 1 else 0.0
    return {f"{prefix}_mean": float(flat.mean()), f"{prefix}_std": std}


def _step_metrics(stats: MicroStats, loss: float, lr: float, grad_norm: float, batch: PreparedBatch,
                  settings: LossSettings, with_reference: bool) -> dict[str, Any]:
    metrics: dict[str, Any] = {
        "loss": loss, "lr": lr, "grad_norm": grad_norm,
        "pos_logp": stats.pos_logp / stats.pos_count if stats.pos_count else 0.0,
        "neg_logp": stats.neg_logp / stats.neg_count if stats.neg_count else 0.0,
        "pos_count": stats.pos_count, "neg_count": stats.neg_count,
        "mean_ratio": stats.mean("ratio", 1.0), "clipped_fraction": stats.mean("outside_band"),
        "num_sequences": batch.num_sequences, "num_tokens": batch.num_tokens,
        "grpo/clip_binding_fraction": stats.mean("clip_binds"), "grpo/entropy": stats.mean("entropy"),
        "grpo/kl": stats.mean("kl"), "train/too_long": batch.too_long, "train/positions": batch.positions,
        **_spread("logprobs/training", stats.training_logprobs),
        **_spread("logprobs/inference", stats.inference_logprobs),
        "alignment/diff_mean": stats.diff / stats.aligned_tokens if stats.aligned_tokens else 0.0,
        "alignment/diff_abs_mean": stats.diff_abs / stats.aligned_tokens if stats.aligned_tokens else 0.0,
        "alignment/diff_max": stats.diff_max, "grpo/outside_truncation": stats.outside_truncation,
    }
    if with_reference:
        metrics["grpo/kl_reference"] = stats.mean("kl_reference")
    if settings.tis_cap is not None:
        metrics["grpo/tis_weight_mean"] = stats.mean("tis_weight", 1.0)
        metrics["grpo/tis_capped_fraction"] = stats.mean("tis_capped")
    return metrics


@contextmanager
def _gradient_sync(model: torch.nn.Module, last: bool) -> Iterator[None]:
    """Data-parallel gradient averaging only on a step's last backward: DDP's ``no_sync``
    before it, FSDP2's ``set_requires_gradient_sync``; nothing for a single process."""
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(last)
        yield
    elif hasattr(model, "no_sync") and not last:
        with model.no_sync():
            yield
    else:
        yield


def _idle_pass(model: torch.nn.Module, precision: Precision) -> None:
    """A forward and backward that change nothing, for a rank with fewer micro-batches than
    the others: FSDP gathers parameters in every pass and DDP averages gradients in the last,
    so every rank runs as many passes."""
    with precision.autocast():
        logits = model(torch.zeros(1, 1, dtype=torch.long, device=next(model.parameters()).device)).logits
    (logits.float().sum() * 0.0).backward()


def _all_ranks(stats: MicroStats, loss: float, ranks: Ranks) -> tuple[MicroStats, float]:
    """The step's statistics and loss summed over every rank (each rank trained its share)."""
    if not ranks.distributed:
        return stats, loss
    totals = sum_floats([float(getattr(stats, name)) for name in SUMMED_STATS] + [loss], ranks)
    for name, value in zip(SUMMED_STATS, totals):
        setattr(stats, name, type(getattr(stats, name))(value))
    stats.diff_max = max_float(stats.diff_max, ranks)
    return stats, totals[-1]


def run_training_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: PreparedBatch,
                      config: TrainingConfig, step_idx: int, reference: Optional[ReferenceLogprobs] = None,
                      ranks: Ranks = Ranks(), scaler: Optional[torch.amp.GradScaler] = None) -> dict[str, Any]:
    """Forward and backward every micro-batch of this rank's share of the batch, clip the
    gradient norm to 1, step (unless the loss or the norm is not finite); the step's metrics
    (over every rank). `scaler` scales the loss of float16 compute (`Precision.grad_scaler`)."""
    lr = learning_rate(config, step_idx)
    for group in optimizer.param_groups:
        group["lr"] = lr
    settings, totals = loss_settings(config), step_totals(batch, config)
    precision = precision_for(config, ranks.world_size)
    loss_sum, stats = 0.0, MicroStats()
    passes = max(1, int(max_float(len(batch.micro_batches), ranks)))
    with precision.casts_kept():
        for index in range(passes):
            with _gradient_sync(model, last=index == passes - 1):
                if index >= len(batch.micro_batches):
                    _idle_pass(model, precision)
                    continue
                with precision.autocast():
                    loss, micro_stats = micro_batch_loss(model, batch.micro_batches[index].to(config.device),
                                                         settings, totals, missing_logprobs=config.missing_logprobs,
                                                         match_truncation=config.match_sampler_truncation,
                                                         reference=reference)
                # data parallelism averages the ranks' gradients; the step's loss is their sum
                summed = loss * ranks.world_size
                (summed if scaler is None else scaler.scale(summed)).backward()
            loss_sum += float(loss.detach())
            stats.add(micro_stats)
    stats, loss_sum = _all_ranks(stats, loss_sum, ranks)
    grad_norm, stepped = _optimizer_step(model, optimizer, scaler, loss_sum)
    if not stepped and ranks.is_main:
        log.warning("step %d: the loss (%s) or the gradient norm (%s) is not finite: optimizer step skipped, "
                    "weights unchanged", step_idx + 1, loss_sum, grad_norm)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    metrics = _step_metrics(stats, loss_sum, lr, grad_norm, batch, settings, reference is not None)
    metrics["train/skipped_step"] = 0 if stepped else 1
    return metrics


def _optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scaler: Optional[torch.amp.GradScaler], loss: float) -> tuple[float, bool]:
    """Clip the gradient norm and step, unless the loss or the norm is not finite (every rank
    sees the same reduced values, so every rank decides alike); the norm and whether it stepped."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    trainable = [p for p in model.parameters() if p.requires_grad]
    norm = torch.nn.utils.clip_grad_norm_(trainable, max_norm=MAX_GRAD_NORM)
    if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor, reduced over the shards
        norm = norm.full_tensor()
    grad_norm = float(norm)
    finite = math.isfinite(grad_norm) and math.isfinite(loss)
    if finite and scaler is None:
        optimizer.step()
    elif finite:
        scaler.step(optimizer)
    if scaler is not None:
        scaler.update()  # an overflow lowers the loss scale
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, finite
