"""Batch preparation: the groups of one API batch turned into padded micro-batch tensors.

A batch from the trajectory API is a list of scored groups (``tokens``, ``masks``,
``scores`` and optional per-rollout extras). The trainer wants equal-width tensors:

* Width. Rollouts are right-padded to a working length ``W`` whose label width ``W - 1``
  is the longest ``L - 1`` rounded up to a multiple of ``pad_multiple`` (Atropos's 64,
  good for GPU kernels; 1 pads only to the longest, which halves the positions of short
  rollouts on a CPU). Inputs are ``tokens[:-1]`` and labels ``masks[1:]`` (the causal
  shift). Tokens pad with 0, labels with -100. With ``pack`` rollouts are sorted by length
  and each micro-batch is only as wide as its own longest rollout; without it (Atropos's
  layout) every micro-batch has the batch's width and the rollouts keep their order.
* Advantage. Each group's scores minus their mean, divided by a standard deviation chosen
  by ``scale_rewards``: the group's (``group``: Atropos's, population std floored at 1e-8),
  the whole batch's scores' (``batch``), or none (``none``: Dr. GRPO's unscaled centring).
  A group of one keeps its raw score; ``overrides[i].set_advantage_to_zero`` forces 0.
  With ``use_env_advantages`` an item's own per-token ``advantages`` (aligned with its
  tokens, shifted like the labels, padded with 0) are used instead.
* Sampler log-probabilities. ``inference_logprobs`` rows are aligned with the tokens; they
  are padded with 1.0 (the placeholder the environments put on prompt positions) and
  shifted like the labels. A rollout without a row (``null``, missing or empty) gets 1.0s
  and is flagged in ``logprobs_missing`` so the loss can treat it on-policy.
* Sampling distribution. Each of ``temperature``, ``top_p``, ``top_k`` and ``min_p`` comes
  from ``overrides[i]``, else ``generation_params``, else ``group_overrides``, else its
  neutral value (1.0, 1.0, off, 0.0): what the environment recorded of the request that
  sampled the rollout (`atroposlib.policy_version`).
* Policy version. Each group's version (`atroposlib.policy_version.group_policy_version`),
  for the staleness the trainer logs.
* Length. With ``max_length``, a rollout longer than it (the trainer's ``--seq-len``) is
  left out of the batch and counted in ``too_long``, never trained on.
* SFT. ``overrides[i].sft`` or ``group_overrides.sft`` marks rollouts trained with plain
  cross-entropy instead of the policy loss.

Rollouts are then cut into micro-batches of ``batch_size`` (the last may be smaller); on
several ranks each keeps every ``world_size``-th rollout (`example_trainer.distributed`).
With ``share_prefix`` a micro-batch holds rollouts of one group only, and the prompt they
share runs through the model once (`shared_prefix_layout`), when that computes fewer
positions than packing.
`pad_data_to_good_offset` returns Atropos's five lists of tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

import numpy as np
import torch

from atroposlib.policy_version import group_policy_version
from example_trainer.config import ScaleRewards
from example_trainer.prefix_sharing import shared_prefix_length, worth_sharing

GOOD_MULTIPLE = 64
LABEL_PAD = -100
LOGPROB_PAD = 1.0
STD_FLOOR = 1e-8
TOP_K_OFF = -1

BatchTuple = tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor],
                   Optional[list[torch.Tensor]]]


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters that shaped the distribution a rollout was drawn from."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_OFF
    min_p: float = 0.0

    @property
    def truncates(self) -> bool:
        """Whether tokens were drawn from a truncated (and renormalised) distribution."""
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0


@dataclass
class MicroBatch:
    """One forward pass worth of rollouts, all ``P`` positions wide.

    ``advantages`` is ``[B, 1]`` (one score per rollout) or ``[B, P]`` (per-token advantages
    from the environment); ``inference_logprobs`` is None when no rollout of the batch came
    with sampler log-probabilities. ``top_p``/``top_k``/``min_p`` are ``[B]`` (None: no
    rollout of the micro-batch was sampled from a truncated distribution). The first
    ``shared_prefix`` positions are the same in every row and trained in none: the forward
    pass runs them once (`example_trainer.prefix_sharing`).
    """

    tokens: torch.Tensor
    labels: torch.Tensor
    advantages: torch.Tensor
    temperatures: torch.Tensor
    inference_logprobs: Optional[torch.Tensor]
    logprobs_missing: torch.Tensor
    sft: torch.Tensor
    top_p: Optional[torch.Tensor] = None
    top_k: Optional[torch.Tensor] = None
    min_p: Optional[torch.Tensor] = None
    shared_prefix: int = 0

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def truncated(self) -> bool:
        """Whether some rollout here was sampled with top-p, top-k or min-p."""
        return self.top_p is not None

    def to(self, device: torch.device | str) -> "MicroBatch":
        """The same micro-batch with every tensor on `device`."""
        def move(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return None if tensor is None else tensor.to(device)

        return replace(self, tokens=self.tokens.to(device), labels=self.labels.to(device),
                       advantages=self.advantages.to(device), temperatures=self.temperatures.to(device),
                       inference_logprobs=move(self.inference_logprobs),
                       logprobs_missing=self.logprobs_missing.to(device), sft=self.sft.to(device),
                       top_p=move(self.top_p), top_k=move(self.top_k), min_p=move(self.min_p))


@dataclass
class PreparedBatch:
    """The micro-batches of one optimizer step, and what the loss normalises by.

    ``num_sequences`` and ``num_tokens`` (trained tokens) count the whole step, so that the
    micro-batches' losses add up to the loss of the batch taken in one pass."""

    micro_batches: list[MicroBatch]
    num_sequences: int
    num_tokens: int
    had_inference_logprobs: bool
    policy_versions: list[Optional[int]] = field(default_factory=list)
    too_long: int = 0

    @property
    def positions(self) -> int:
        """Token positions the forward passes compute, padding included."""
        return _positions(self.micro_batches)

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
    """One rollout, before padding and the causal shift."""

    tokens: Sequence[int]
    masks: Sequence[int]
    advantage: float
    token_advantages: Optional[Sequence[float]]
    sampling: Sampling
    logprobs: Optional[Sequence[float]]
    sft: bool


def working_length(longest: int, multiple: int = GOOD_MULTIPLE) -> int:
    """The padded length of a rollout of `longest` tokens before the shift: the label width
    ``longest - 1`` rounded up to a multiple of `multiple`, plus one."""
    return math.ceil((longest - 1) / multiple) * multiple + 1 if longest > 1 else longest


def group_advantages(scores: Sequence[float], overrides: Optional[Sequence[Optional[dict]]] = None,
                     scale: Optional[float] = None) -> np.ndarray:
    """A group's scores centred on their mean and divided by `scale` (None: the group's own
    population std, floored at 1e-8; 1.0: centring only), then overridden."""
    values = np.asarray(scores, dtype=np.float64)
    if len(values) > 1:
        spread = float(values.std()) if scale is None else scale
        values = (values - values.mean()) / max(spread, STD_FLOOR)
    for i, override in enumerate(overrides or []):
        if i < len(values) and isinstance(override, dict) and override.get("set_advantage_to_zero"):
            values[i] = 0.0
    return values


def batch_reward_scale(items: list[dict], scale_rewards: ScaleRewards) -> Optional[float]:
    """The std each group's centred scores are divided by: None (each group's own), the
    population std of every score in the batch, or 1.0 (no scaling)."""
    if scale_rewards == "group":
        return None
    if scale_rewards == "none":
        return 1.0
    return float(np.std([score for item in items for score in item["scores"]]))


def _override(item: dict, i: int) -> dict:
    overrides = item.get("overrides") or []
    entry = overrides[i] if i < len(overrides) else None
    return entry if isinstance(entry, dict) else {}


def _setting(item: dict, i: int, key: str) -> Any:
    """`key` from rollout `i`'s override, the group's generation_params, or its group_overrides."""
    for source in (_override(item, i), item.get("generation_params") or {}, item.get("group_overrides") or {}):
        if isinstance(source, dict) and source.get(key) is not None:
            return source[key]
    return None


def rollout_temperature(item: dict, i: int) -> float:
    """The temperature rollout `i` was sampled at (its override, the group's settings, or 1.0)."""
    return rollout_sampling(item, i).temperature


def rollout_sampling(item: dict, i: int) -> Sampling:
    """The sampling parameters of rollout `i` (neutral values where the group does not say)."""
    values = {key: _setting(item, i, key) for key in ("temperature", "top_p", "top_k", "min_p")}
    try:
        top_k = int(values["top_k"]) if values["top_k"] is not None else TOP_K_OFF
        return Sampling(temperature=float(values["temperature"]) if values["temperature"] is not None else 1.0,
                        top_p=float(values["top_p"]) if values["top_p"] is not None else 1.0,
                        top_k=top_k if top_k > 0 else TOP_K_OFF,
                        min_p=float(values["min_p"]) if values["min_p"] is not None else 0.0)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"rollout {i} of a group has unreadable sampling parameters {values}: {exc}") from None


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


def _item_rollouts(item: dict, scale: Optional[float], extract_logprobs: bool,
                   use_env_advantages: bool) -> list[_Rollout]:
    tokens, masks = item["tokens"], item["masks"]
    if len(masks) != len(tokens) or len(item["scores"]) != len(tokens):
        raise ValueError(f"a group has {len(tokens)} token lists, {len(masks)} masks and "
                         f"{len(item['scores'])} scores; they must match")
    advantages = group_advantages(item["scores"], item.get("overrides"), scale)
    rollouts = []
    for i, token_row in enumerate(tokens):
        if len(masks[i]) != len(token_row):
            raise ValueError(f"rollout {i} of a group has {len(token_row)} tokens but {len(masks[i])} mask entries")
        env_row = _row(item.get("advantages"), i) if use_env_advantages else None
        if _override(item, i).get("set_advantage_to_zero"):
            env_row = None
        rollouts.append(_Rollout(
            tokens=token_row, masks=masks[i], advantage=float(advantages[i]), token_advantages=env_row,
            sampling=rollout_sampling(item, i), sft=is_sft(item, i),
            logprobs=_row(item.get("inference_logprobs"), i) if extract_logprobs else None))
    return rollouts


def _advantage_row(rollout: _Rollout, per_token: bool, width: int) -> np.ndarray:
    if not per_token:
        return np.array([rollout.advantage], dtype=np.float32)
    if rollout.token_advantages is not None:
        return _pad(rollout.token_advantages, width, 0.0, np.float32)[1:]
    return np.full(width - 1, rollout.advantage, dtype=np.float32)


def _truncation(rollouts: list[_Rollout]) -> dict[str, Optional[torch.Tensor]]:
    if not any(r.sampling.truncates for r in rollouts):
        return {"top_p": None, "top_k": None, "min_p": None}
    return {"top_p": torch.tensor([r.sampling.top_p for r in rollouts], dtype=torch.float32),
            "top_k": torch.tensor([r.sampling.top_k for r in rollouts], dtype=torch.long),
            "min_p": torch.tensor([r.sampling.min_p for r in rollouts], dtype=torch.float32)}


def _micro_batch(rollouts: list[_Rollout], width: int, per_token: bool, with_logprobs: bool) -> MicroBatch:
    logprobs = None
    if with_logprobs:
        rows = [np.full(width, LOGPROB_PAD, np.float32) if r.logprobs is None else
                _pad(r.logprobs, width, LOGPROB_PAD, np.float32) for r in rollouts]
        logprobs = torch.from_numpy(np.stack([row[1:] for row in rows]))
    return MicroBatch(
        tokens=torch.from_numpy(np.stack([_pad(r.tokens, width, 0, np.int64)[:-1] for r in rollouts])),
        labels=torch.from_numpy(np.stack([_pad(r.masks, width, LABEL_PAD, np.int64)[1:] for r in rollouts])),
        advantages=torch.from_numpy(np.stack([_advantage_row(r, per_token, width) for r in rollouts])),
        temperatures=torch.tensor([r.sampling.temperature for r in rollouts], dtype=torch.float32).view(-1, 1, 1),
        inference_logprobs=logprobs,
        logprobs_missing=torch.tensor([r.logprobs is None for r in rollouts], dtype=torch.bool),
        sft=torch.tensor([r.sft for r in rollouts], dtype=torch.bool),
        **_truncation(rollouts))


def _trained_tokens(rollout: _Rollout) -> int:
    """The rollout's trained positions: its labels (masks shifted by one) that are not -100."""
    return sum(1 for mask in list(rollout.masks)[1:] if mask != LABEL_PAD)


def prepare_batch(items: list[dict], batch_size: int, *, extract_inference_logprobs: bool = True,
                  use_env_advantages: bool = False, pad_multiple: int = GOOD_MULTIPLE, pack: bool = False,
                  scale_rewards: ScaleRewards = "group", max_length: Optional[int] = None,
                  rank: int = 0, world_size: int = 1, share_prefix: bool = False) -> PreparedBatch:
    """The micro-batches for one optimizer step from the groups of one API batch; with
    several ranks, those of rank `rank`'s share (every `world_size`-th rollout, in the packed
    order), while the counts the loss normalises by stay the whole batch's. With
    `share_prefix` (one rank only), the layout of `shared_prefix_layout` when it computes
    fewer positions than the packed one."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if pad_multiple < 1:
        raise ValueError(f"pad_multiple must be at least 1, got {pad_multiple}")
    if share_prefix and world_size > 1:
        raise ValueError("share_prefix lays out a whole batch; it is not split over ranks")
    if not items or not any(item["tokens"] for item in items):
        raise ValueError("the batch has no rollouts")
    scale = batch_reward_scale(items, scale_rewards)
    groups = [_item_rollouts(item, scale, extract_inference_logprobs, use_env_advantages) for item in items]
    kept_groups = [[r for r in group if max_length is None or len(r.tokens) <= max_length] for group in groups]
    kept = [rollout for group in kept_groups for rollout in group]
    if not kept:
        raise ValueError(f"every rollout of the batch is longer than {max_length} tokens (--seq-len)")
    with_logprobs = any(r.logprobs is not None for r in kept)
    per_token = any(r.token_advantages is not None for r in kept)
    if pack:
        kept.sort(key=lambda r: len(r.tokens), reverse=True)
    mine = kept[rank::world_size]
    chunks = [mine[start:start + batch_size] for start in range(0, len(mine), batch_size)]
    batch_width = working_length(max(len(r.tokens) for r in kept), pad_multiple)
    micro_batches = [
        _micro_batch(chunk, working_length(max(len(r.tokens) for r in chunk), pad_multiple) if pack else batch_width,
                     per_token, with_logprobs)
        for chunk in chunks]
    if share_prefix:
        shared = shared_prefix_layout(kept_groups, batch_size, pad_multiple, per_token, with_logprobs)
        if _positions(shared) < _positions(micro_batches):
            micro_batches = shared
    trained = sum(_trained_tokens(r) for r in kept)
    return PreparedBatch(micro_batches=micro_batches, num_sequences=len(kept), num_tokens=trained,
                         had_inference_logprobs=with_logprobs,
                         policy_versions=[group_policy_version(item) for item in items],
                         too_long=sum(len(group) for group in groups) - len(kept))


def shared_prefix_layout(groups: list[list[_Rollout]], batch_size: int, pad_multiple: int, per_token: bool,
                         with_logprobs: bool) -> list[MicroBatch]:
    """Micro-batches that never mix groups, so their rows start with the group's prompt: each
    group, longest rollout first, cut into micro-batches of `batch_size` that run their common
    untrained prefix once (`example_trainer.prefix_sharing`). Rollouts with too little to share
    (groups of one, a last micro-batch of one, a short prompt) are packed together after them."""
    shared, alone = [], []
    for group in groups:
        ordered = sorted(group, key=lambda r: len(r.tokens), reverse=True)
        for start in range(0, len(ordered), batch_size):
            chunk = ordered[start:start + batch_size]
            micro = _micro_batch(chunk, working_length(len(chunk[0].tokens), pad_multiple), per_token, with_logprobs)
            prefix = shared_prefix_length(micro.tokens, micro.labels, LABEL_PAD)
            if worth_sharing(len(chunk), prefix):
                shared.append(replace(micro, shared_prefix=prefix))
            else:
                alone += chunk
    alone.sort(key=lambda r: len(r.tokens), reverse=True)
    return shared + [_micro_batch(chunk, working_length(len(chunk[0].tokens), pad_multiple), per_token, with_logprobs)
                     for chunk in (alone[start:start + batch_size] for start in range(0, len(alone), batch_size))]


def _positions(micro_batches: list[MicroBatch]) -> int:
    return sum(int(m.tokens.numel()) - (m.size - 1) * m.shared_prefix for m in micro_batches)


def pad_data_to_good_offset(data: dict, batch_size: int, extract_inference_logprobs: bool = True) -> BatchTuple:
    """Atropos's five lists of micro-batch tensors for ``{"batch": [group, ...]}``."""
    return prepare_batch(data["batch"], batch_size, extract_inference_logprobs=extract_inference_logprobs).as_tuple()
