"""Batch preparation: the groups of one API batch turned into padded micro-batch tensors.

A batch from the trajectory API is a list of scored groups (``tokens``, ``masks``,
``scores`` and optional per-rollout extras). The trainer wants equal-width tensors:

* Width. Every rollout is right-padded to one working length ``W``: the longest token list
  ``L`` if ``L - 1`` is a multiple of 64, else ``ceil((L - 1) / 64) * 64 + 1``. Inputs are
  ``tokens[:-1]`` and labels ``masks[1:]`` (the causal shift), both ``P = W - 1`` wide, so
  the model always sees a multiple of 64 positions. Tokens pad with 0, labels with -100.
* Advantage. A group's scores minus their mean, over ``max(population std, 1e-8)``; a
  group of one keeps its raw score; ``overrides[i].set_advantage_to_zero`` forces 0.
  With ``use_env_advantages`` an item's own per-token ``advantages`` (aligned with its
  tokens, shifted like the labels, padded with 0) are used instead.
* Sampler log-probabilities. ``inference_logprobs`` rows are aligned with the tokens; they
  are padded with 1.0 (the placeholder the environments put on prompt positions) and
  shifted like the labels. A rollout without a row (``null``, missing or empty) gets 1.0s
  and is flagged in ``logprobs_missing`` so the loss can treat it on-policy.
* Temperature. ``overrides[i].temperature``, else ``generation_params.temperature``, else
  ``group_overrides.temperature``, else 1.0.
* SFT. ``overrides[i].sft`` or ``group_overrides.sft`` marks rollouts trained with plain
  cross-entropy instead of the policy loss.

Rollouts are then cut, in order, into micro-batches of ``batch_size`` (the last may be
smaller). `pad_data_to_good_offset` returns Atropos's five lists of tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

import numpy as np
import torch

GOOD_MULTIPLE = 64
LABEL_PAD = -100
LOGPROB_PAD = 1.0
STD_FLOOR = 1e-8

BatchTuple = tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor],
                   Optional[list[torch.Tensor]]]


@dataclass
class MicroBatch:
    """One forward pass worth of rollouts, all ``P`` positions wide.

    ``advantages`` is ``[B, 1]`` (one score per rollout) or ``[B, P]`` (per-token advantages
    from the environment); ``inference_logprobs`` is None when no rollout of the batch came
    with sampler log-probabilities.
    """

    tokens: torch.Tensor
    labels: torch.Tensor
    advantages: torch.Tensor
    temperatures: torch.Tensor
    inference_logprobs: Optional[torch.Tensor]
    logprobs_missing: torch.Tensor
    sft: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    def to(self, device: torch.device | str) -> "MicroBatch":
        """The same micro-batch with every tensor on `device`."""
        logprobs = None if self.inference_logprobs is None else self.inference_logprobs.to(device)
        return replace(self, tokens=self.tokens.to(device), labels=self.labels.to(device),
                       advantages=self.advantages.to(device), temperatures=self.temperatures.to(device),
                       inference_logprobs=logprobs, logprobs_missing=self.logprobs_missing.to(device),
                       sft=self.sft.to(device))


@dataclass
class PreparedBatch:
    """The micro-batches of one optimizer step."""

    micro_batches: list[MicroBatch]
    num_sequences: int
    num_tokens: int
    had_inference_logprobs: bool

    def as_tuple(self) -> BatchTuple:
        """Atropos's ``(tokens, labels, advantages, temperatures, inference_logprobs | None)``."""
        logprobs = None
        if self.had_inference_logprobs:
            logprobs = [m.inference_logprobs for m in self.micro_batches if m.inference_logprobs is not None]
        return ([m.tokens for m in self.micro_batches], [m.labels for m in self.micro_batches],
                [m.advantages for m in self.micro_batches], [m.temperatures for m in self.micro_batches],
                logprobs)


@dataclass
class _Rollout:
    """One rollout padded to the working length, before the causal shift."""

    tokens: np.ndarray
    masks: np.ndarray
    advantage: float
    token_advantages: Optional[np.ndarray]
    temperature: float
    logprobs: Optional[np.ndarray]
    sft: bool


def working_length(longest: int) -> int:
    """The padded length of every rollout before the shift (labels are one shorter)."""
    if (longest - 1) % GOOD_MULTIPLE != 0:
        return math.ceil((longest - 1) / GOOD_MULTIPLE) * GOOD_MULTIPLE + 1
    return longest


def group_advantages(scores: Sequence[float], overrides: Optional[Sequence[Optional[dict]]] = None) -> np.ndarray:
    """A group's scores normalised to zero mean and unit (population) std, then overridden."""
    values = np.asarray(scores, dtype=np.float64)
    if len(values) > 1:
        values = (values - values.mean()) / max(float(values.std()), STD_FLOOR)
    for i, override in enumerate(overrides or []):
        if i < len(values) and isinstance(override, dict) and override.get("set_advantage_to_zero"):
            values[i] = 0.0
    return values


def _override(item: dict, i: int) -> dict:
    overrides = item.get("overrides") or []
    entry = overrides[i] if i < len(overrides) else None
    return entry if isinstance(entry, dict) else {}


def rollout_temperature(item: dict, i: int) -> float:
    """The temperature rollout `i` was sampled at (its override, the group's settings, or 1.0)."""
    for source in (_override(item, i), item.get("generation_params") or {}, item.get("group_overrides") or {}):
        if source.get("temperature") is not None:
            return float(source["temperature"])
    return 1.0


def is_sft(item: dict, i: int) -> bool:
    """Whether rollout `i` is a supervised example rather than a policy sample."""
    return bool(_override(item, i).get("sft") or (item.get("group_overrides") or {}).get("sft"))


def _pad(row: Sequence[Any], length: int, fill: float, dtype: Any) -> np.ndarray:
    """`row` cut or right-padded with `fill` to `length`."""
    out = np.full(length, fill, dtype=dtype)
    values = np.asarray(row, dtype=dtype)[:length]
    out[:len(values)] = values
    return out


def _row(rows: Any, i: int) -> Optional[Sequence[Any]]:
    """Row `i` of an optional per-rollout list; None when absent or empty."""
    if not rows or i >= len(rows) or rows[i] is None or len(rows[i]) == 0:
        return None
    return rows[i]


def _item_rollouts(item: dict, width: int, extract_logprobs: bool, use_env_advantages: bool) -> list[_Rollout]:
    tokens, masks = item["tokens"], item["masks"]
    if len(masks) != len(tokens) or len(item["scores"]) != len(tokens):
        raise ValueError(f"a group has {len(tokens)} token lists, {len(masks)} masks and "
                         f"{len(item['scores'])} scores; they must match")
    advantages = group_advantages(item["scores"], item.get("overrides"))
    rollouts = []
    for i, token_row in enumerate(tokens):
        if len(masks[i]) != len(token_row):
            raise ValueError(f"rollout {i} of a group has {len(token_row)} tokens but {len(masks[i])} mask entries")
        logprob_row = _row(item.get("inference_logprobs"), i) if extract_logprobs else None
        env_row = _row(item.get("advantages"), i) if use_env_advantages else None
        token_advantages = None
        if env_row is not None and not _override(item, i).get("set_advantage_to_zero"):
            token_advantages = _pad(env_row, width, 0.0, np.float32)
        rollouts.append(_Rollout(
            tokens=_pad(token_row, width, 0, np.int64), masks=_pad(masks[i], width, LABEL_PAD, np.int64),
            advantage=float(advantages[i]), token_advantages=token_advantages,
            temperature=rollout_temperature(item, i),
            logprobs=None if logprob_row is None else _pad(logprob_row, width, LOGPROB_PAD, np.float32),
            sft=is_sft(item, i)))
    return rollouts


def _advantage_row(rollout: _Rollout, per_token: bool, width: int) -> np.ndarray:
    if not per_token:
        return np.array([rollout.advantage], dtype=np.float32)
    if rollout.token_advantages is not None:
        return rollout.token_advantages[1:]
    return np.full(width - 1, rollout.advantage, dtype=np.float32)


def _micro_batch(rollouts: list[_Rollout], width: int, per_token: bool, with_logprobs: bool) -> MicroBatch:
    missing = [r.logprobs is None for r in rollouts]
    logprobs = None
    if with_logprobs:
        filler = np.full(width, LOGPROB_PAD, dtype=np.float32)
        logprobs = torch.from_numpy(np.stack([(filler if r.logprobs is None else r.logprobs)[1:] for r in rollouts]))
    return MicroBatch(
        tokens=torch.from_numpy(np.stack([r.tokens[:-1] for r in rollouts])),
        labels=torch.from_numpy(np.stack([r.masks[1:] for r in rollouts])),
        advantages=torch.from_numpy(np.stack([_advantage_row(r, per_token, width) for r in rollouts])),
        temperatures=torch.tensor([r.temperature for r in rollouts], dtype=torch.float32).view(-1, 1, 1),
        inference_logprobs=logprobs,
        logprobs_missing=torch.tensor(missing, dtype=torch.bool),
        sft=torch.tensor([r.sft for r in rollouts], dtype=torch.bool))


def prepare_batch(items: list[dict], batch_size: int, *, extract_inference_logprobs: bool = True,
                  use_env_advantages: bool = False) -> PreparedBatch:
    """The micro-batches for one optimizer step from the groups of one API batch."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if not items or not any(item["tokens"] for item in items):
        raise ValueError("the batch has no rollouts")
    width = working_length(max(len(row) for item in items for row in item["tokens"]))
    rollouts = [rollout for item in items
                for rollout in _item_rollouts(item, width, extract_inference_logprobs, use_env_advantages)]
    with_logprobs = any(r.logprobs is not None for r in rollouts)
    per_token = any(r.token_advantages is not None for r in rollouts)
    micro_batches = [_micro_batch(rollouts[start:start + batch_size], width, per_token, with_logprobs)
                     for start in range(0, len(rollouts), batch_size)]
    trained = sum(int((m.labels != LABEL_PAD).sum()) for m in micro_batches)
    return PreparedBatch(micro_batches=micro_batches, num_sequences=len(rollouts), num_tokens=trained,
                         had_inference_logprobs=with_logprobs)


def pad_data_to_good_offset(data: dict, batch_size: int, extract_inference_logprobs: bool = True) -> BatchTuple:
    """Atropos's five lists of micro-batch tensors for ``{"batch": [group, ...]}``."""
    return prepare_batch(data["batch"], batch_size, extract_inference_logprobs=extract_inference_logprobs).as_tuple()
