"""The policy losses: GRPO and the variants RL engineers use, as one function of tensors.

Notation, per trained token ``t`` of rollout ``i``: ``logp`` the trainer's log-probability
(under the distribution the rollout was sampled from: `example_trainer.logprobs`), ``q``
the sampler's (``inference_logprobs``), ``A`` the advantage, ``m`` the mask of trained
tokens, ``N`` the sequences and ``T`` the trained tokens of the whole optimizer step.

* Ratio. Without ``tis_cap``, Atropos's: ``r = exp(logp - q)``, the policy against the
  weights that sampled the rollout, so the clip bounds how far a step moves from them
  however stale the rollout is. With ``tis_cap = C`` (truncated importance sampling, TRL's
  ``vllm_importance_sampling_correction``): the ratio is taken against the trainer's own
  log-probabilities at the start of the step (``r = exp(logp - sg(logp))``, 1 in value,
  the policy gradient in derivative, as one optimizer step per batch makes the trainer's
  "old" policy its current one) and every token's term is weighted by
  ``w = min(exp(sg(logp) - q), C)``, which corrects for the sampler/trainer mismatch
  (numerics, staleness, truncation) with a bounded weight.
* Surrogate. ``obj = min(r * A, clip(r, 1 - eps, 1 + eps_high) * A)`` for both signs of
  ``A`` (``eps_high`` defaults to ``eps``: DAPO's clip-higher when larger). With
  ``dual_clip = c > 1`` a negative advantage's objective is also bounded below by
  ``c * A`` (Ye et al. 2020; verl's ``clip_ratio_c``), so one very unlikely-now token
  cannot dominate the step. The token's loss is ``-obj * w`` (``w = 1`` without TIS).
* GSPO (``loss_type="gspo"``). The ratio is per sequence, ``s_i = exp(mean_t (logp - q))``
  (the geometric mean of the token ratios), clipped and weighted the same way and shared
  by every token of the sequence (Zheng et al. 2025).
* KL. ``kl_coef * k3`` with ``k3 = exp(x - logp) - (x - logp) - 1`` is added per token,
  where ``x`` is the sampler's log-probability (Atropos's estimate) or a frozen reference
  model's (``reference_logp``: TRL's ``beta``).
* SFT rows (``sft``) are trained with the token loss ``-logp`` instead.
* Aggregation. ``grpo`` and ``gspo``: each sequence's token mean, summed over sequences,
  divided by ``N``. ``dapo``: every token's loss summed, divided by ``T`` (DAPO's
  token-level mean; TRL's ``bnpo`` over the step). ``dr_grpo``: summed, divided by
  ``N * norm_length`` (Dr. GRPO's constant length, which removes the bias to short wrong
  answers). ``N`` and ``T`` count the whole step, so the losses of its micro-batches add
  up to the loss of the batch taken at once: gradient accumulation changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from example_trainer.config import LOSS_TYPES, LossType

__all__ = ["LOSS_TYPES", "LossSettings", "LossTerms", "LossType", "StepTotals", "k3", "policy_loss"]


@dataclass(frozen=True)
class LossSettings:
    """The knobs of `policy_loss` (see the module docstring)."""

    loss_type: LossType = "grpo"
    clip_eps: float = 0.2
    clip_eps_high: Optional[float] = None
    dual_clip: Optional[float] = None
    tis_cap: Optional[float] = None
    kl_coef: float = 0.0

    @property
    def upper_clip(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high


@dataclass(frozen=True)
class StepTotals:
    """What the whole optimizer step normalises by."""

    sequences: int
    tokens: int
    norm_length: int = 1


@dataclass
class LossTerms:
    """One micro-batch's loss (ready for ``backward``) and the per-token tensors behind it."""

    loss: torch.Tensor
    ratio: torch.Tensor
    clip_binds: torch.Tensor
    kl: torch.Tensor
    tis_weight: Optional[torch.Tensor]


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """Schulman's unbiased, non-negative KL estimator for ``log_ratio = log(p_target / p)``."""
    return torch.exp(log_ratio) - log_ratio - 1


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row mean of `values` over `mask` (``[B]``); 0 for a row without trained tokens."""
    return (values * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)


def _ratio(logp: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, sequence_level: bool) -> torch.Tensor:
    log_ratio = logp - behaviour
    if sequence_level:
        return torch.exp(_masked_mean(log_ratio, mask)).unsqueeze(-1).expand_as(logp)
    return torch.exp(log_ratio)


def _aggregate(per_token: torch.Tensor, mask: torch.Tensor, loss_type: LossType, totals: StepTotals) -> torch.Tensor:
    if loss_type in ("grpo", "gspo"):
        return _masked_mean(per_token, mask).sum() / max(totals.sequences, 1)
    summed = (per_token * mask).sum()
    if loss_type == "dapo":
        return summed / max(totals.tokens, 1)
    return summed / (max(totals.sequences, 1) * max(totals.norm_length, 1))


def policy_loss(logp: torch.Tensor, sampler_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                settings: LossSettings, totals: StepTotals, *, sft: Optional[torch.Tensor] = None,
                reference_logp: Optional[torch.Tensor] = None) -> LossTerms:
    """The loss of one micro-batch: ``logp`` (with gradient), ``sampler_logp``, ``mask`` and
    ``reference_logp`` are ``[B, P]``; ``advantages`` ``[B, 1]`` or ``[B, P]``; ``sft`` ``[B]``."""
    mask = mask.to(logp.dtype)
    advantages = advantages.to(logp.device, logp.dtype).expand_as(logp)
    tis_weight = None
    behaviour = sampler_logp
    if settings.tis_cap is not None:
        behaviour = logp.detach()
        tis_weight = torch.exp(logp.detach() - sampler_logp).clamp(max=settings.tis_cap)
    ratio = _ratio(logp, behaviour, mask, sequence_level=settings.loss_type == "gspo")
    low, high = 1 - settings.clip_eps, 1 + settings.upper_clip
    unclipped, clipped = ratio * advantages, ratio.clamp(low, high) * advantages
    objective = torch.min(unclipped, clipped)
    clip_binds = clipped < unclipped
    if settings.dual_clip is not None:
        floor = settings.dual_clip * advantages
        dual_binds = (advantages < 0) & (objective < floor)
        objective = torch.where(dual_binds, floor, objective)
        clip_binds = clip_binds | dual_binds
    per_token = -objective if tis_weight is None else -objective * tis_weight
    kl_target = sampler_logp if reference_logp is None else reference_logp
    kl = k3(kl_target - logp)
    if settings.kl_coef > 0:
        per_token = per_token + settings.kl_coef * kl
    if sft is not None:
        per_token = torch.where(sft.to(logp.device).unsqueeze(-1), -logp, per_token)
    loss = _aggregate(per_token, mask, settings.loss_type, totals)
    return LossTerms(loss=loss, ratio=ratio.detach(), clip_binds=clip_binds.detach(), kl=kl.detach(),
                     tis_weight=tis_weight)
