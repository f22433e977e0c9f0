"""Token log-probabilities under the distribution the sampler actually drew each token from.

vLLM samples from the model's logits divided by the temperature and then truncated: min-p
drops tokens less likely than ``min_p`` times the most likely one, top-k keeps the ``k``
largest logits (ties included), top-p keeps the smallest set of most likely tokens whose
probability reaches ``p``; the kept tokens are renormalised. Run with
``--logprobs-mode processed_logprobs`` (both of this project's vLLM servers are), vLLM
reports each sampled token's log-probability under that final distribution.

`sampled_token_logprobs` computes the same quantity from the trainer's logits, in the same
order (temperature, min-p, top-k, top-p), so that at the weights that sampled a rollout the
trainer's log-probabilities equal the sampler's and the importance ratio is exactly 1.
With ``match_truncation=False`` only the temperature is applied (TRL's and verl's choice):
the trainer then scores tokens under the full distribution, whose probability of a sampled
token is lower by the mass truncation removed, and the ratio starts below 1 by that much
(``--tis-cap`` bounds the resulting correction).

A sampled token can fall outside the trainer's truncated set: the sampler computed in
another precision (a bfloat16 vLLM against the trainer's float32 masters) and the token sat
at the edge of the nucleus, or the weights moved since the rollout was sampled. Its truncated
log-probability is -inf, which would make the ratio 0, the importance weight and the KL
estimate infinite and the step NaN. Such a token is scored under the untruncated
distribution at the rollout's temperature instead (finite, and lower than the sampler's, so
its ratio is small and the clip and ``--tis-cap`` treat it as a token the policy has moved
away from); `ScoredTokens.outside` marks them, and the step line counts them.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import torch
import transformers

from example_trainer.data import LABEL_PAD, MicroBatch
from example_trainer.prefix_sharing import CACHE_ARGUMENT, prompt_cache

# Rows of positions whose full-vocabulary sort is done at once: bounds the extra memory of
# truncation (a sort and its indices) to a few of these slices.
TRUNCATION_CHUNK = 2048

# transformers 5 computes logits at the positions of a boolean mask only (`slice_logits_to_keep`).
LOGITS_TO_KEEP_MASKS = hasattr(transformers.modeling_utils, "slice_logits_to_keep")

# A frozen policy's log-probabilities of a micro-batch's labels (``[B, P]``, 0 where masked).
ReferenceLogprobs = Callable[[MicroBatch], torch.Tensor]


def _truncate_rows(logits: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
                   min_p: torch.Tensor) -> torch.Tensor:
    """``[N, V]`` logits with the tokens vLLM's sampler would never draw set to -inf; `top_p`,
    `top_k`, `min_p` are ``[N]`` (1.0, <= 0 and 0.0 switch each off)."""
    if bool((min_p > 0).any()):
        probs = logits.softmax(-1)
        threshold = min_p.unsqueeze(-1) * probs.max(-1, keepdim=True).values
        logits = logits.masked_fill(probs < threshold, float("-inf"))
    ordered, order = logits.sort(dim=-1)  # ascending, as vLLM's top-k/top-p sampler
    vocab = ordered.size(-1)
    if bool((top_k > 0).any()):
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
        kth_largest = ordered.gather(-1, (vocab - k).unsqueeze(-1))
        ordered = ordered.masked_fill(ordered < kth_largest, float("-inf"))
    if bool((top_p < 1).any()):
        cumulative = ordered.softmax(-1).cumsum(-1)
        dropped = cumulative <= (1 - top_p).unsqueeze(-1)
        dropped[:, -1] = False  # the most likely token always stays
        ordered = ordered.masked_fill(dropped, float("-inf"))
    return ordered.scatter(-1, order, ordered)


def truncate(logits: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """``[N, V]`` temperature-scaled logits truncated as their rollouts were sampled (``[N]``
    parameters, one row per position); kept logits are unchanged, so gradients flow through them."""
    chunks = [_truncate_rows(logits[start:start + TRUNCATION_CHUNK], top_p[start:start + TRUNCATION_CHUNK],
                             top_k[start:start + TRUNCATION_CHUNK], min_p[start:start + TRUNCATION_CHUNK])
              for start in range(0, logits.size(0), TRUNCATION_CHUNK)]
    return torch.cat(chunks) if chunks else logits


def model_logits_at(model: torch.nn.Module, tokens: torch.Tensor, positions: torch.Tensor,
                    shared_prefix: int = 0) -> torch.Tensor:
    """``[N, V]`` logits of `model` at the N ``True`` entries of `positions` (``[B, P]``), row-major.

    The LM head, a vocabulary-wide matrix multiply, runs only there: transformers'
    ``logits_to_keep`` with a boolean mask (transformers 5); elsewhere, or for a model whose
    forward does not take it, every position's logits are computed and then selected. With
    `shared_prefix` S (`example_trainer.prefix_sharing`), the first S tokens, the same in every
    row and trained in none, run once for all rows."""
    if shared_prefix:
        cache = prompt_cache(model, tokens[:1, :shared_prefix], tokens.size(0))
        if cache is not None:
            return _logits_at(model, tokens[:, shared_prefix:], positions[:, shared_prefix:], {CACHE_ARGUMENT: cache})
    return _logits_at(model, tokens, positions, {})


def _logits_at(model: torch.nn.Module, tokens: torch.Tensor, positions: torch.Tensor,
               extra: dict[str, Any]) -> torch.Tensor:
    logits = None
    if LOGITS_TO_KEEP_MASKS:
        try:
            logits = model(tokens, logits_to_keep=positions, **extra).logits
        except TypeError:  # raised before the forward ran: an attention cache in `extra` is still unused
            logits = None
        if logits is not None and logits.dim() == 2 and logits.size(0) == int(positions.sum()):
            return logits
    if logits is None:  # no boolean logits_to_keep: every position's logits, then the trained ones'
        logits = model(tokens, **extra).logits
    return logits[positions]


def _tempered(logits: torch.Tensor, micro: MicroBatch, rollout: torch.Tensor) -> torch.Tensor:
    """``[N, V]`` float32 logits at the trained positions divided by the temperature of each
    row's rollout (`rollout`, ``[N]``; values <= 0 mean 1)."""
    rows = logits.float()
    temperatures = micro.temperatures.view(-1).to(rows.device, rows.dtype)[rollout]
    return rows / torch.where(temperatures <= 0, torch.ones_like(temperatures), temperatures).unsqueeze(-1)


def _truncated_as_sampled(rows: torch.Tensor, micro: MicroBatch, rollout: torch.Tensor) -> torch.Tensor:
    assert micro.top_p is not None and micro.top_k is not None and micro.min_p is not None
    return truncate(rows, micro.top_p.to(rows.device)[rollout], micro.top_k.to(rows.device)[rollout],
                    micro.min_p.to(rows.device)[rollout])


@torch.no_grad()
def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of ``softmax(logits)`` over the last dimension; -inf logits count as
    probability 0."""
    logp = logits.log_softmax(-1)
    return -torch.where(torch.isfinite(logp), logp.exp() * logp, torch.zeros_like(logp)).sum(-1)


class ScoredTokens(NamedTuple):
    """What `sampled_token_logprobs` computes, each ``[B, P]`` and 0 (False) where masked."""

    logp: torch.Tensor
    entropy: Optional[torch.Tensor]
    outside: torch.Tensor  # sampled tokens outside the trainer's truncated set, scored untruncated


def sampled_token_logprobs(model: torch.nn.Module, micro: MicroBatch, match_truncation: bool = True,
                           with_entropy: bool = False) -> ScoredTokens:
    """The model's log-probabilities of `micro`'s labels under each rollout's sampling
    distribution (a token outside its truncated set under the untruncated one: see the module
    docstring), that distribution's entropy when asked, and which tokens fell outside."""
    trained = micro.labels != LABEL_PAD
    labels = micro.labels[trained].unsqueeze(-1)
    rollout = trained.nonzero()[:, 0]  # the rollout of each trained position, row-major
    tempered = _tempered(model_logits_at(model, micro.tokens, trained, micro.shared_prefix), micro, rollout)
    rows = _truncated_as_sampled(tempered, micro, rollout) if match_truncation and micro.truncated else tempered
    picked = rows.log_softmax(-1).gather(-1, labels).squeeze(-1)
    outside = torch.isneginf(picked.detach())
    if bool(outside.any()):
        untruncated = tempered[outside].log_softmax(-1).gather(-1, labels[outside]).squeeze(-1)
        picked = picked.masked_scatter(outside, untruncated)
    blank = torch.zeros(trained.shape, dtype=rows.dtype, device=rows.device)
    logp = blank.masked_scatter(trained, picked)
    outside_positions = torch.zeros_like(trained).masked_scatter(trained, outside)
    spread = blank.masked_scatter(trained, entropy(rows)) if with_entropy else None
    return ScoredTokens(logp, spread, outside_positions)
