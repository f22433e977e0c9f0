"""The cross-field checks of one submitted group, by ``--validation`` level.

*Structural* problems make a group meaningless (no sequences, a mask list or score
missing for a sequence, a mask of another length than its tokens, a negative env id):
every level but ``off`` refuses them. *Quality* problems make it suspect (an empty
sequence, a token id outside ``[0, TOKEN_ID_LIMIT)``, a mask label that is neither -100
nor the token at its position, an auxiliary array whose shape does not follow the
tokens): ``warn`` reports them as `Problem` values and accepts the group, ``strict``
refuses it. Checks against the run (registered env, trainer's ``max_token_len``) need
server state and live in `atroposlib.api.intake`.
"""

from __future__ import annotations

from array import array
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np

from atroposlib.wire import PER_SEQUENCE_AUX_KEYS, TOKEN_ID_LIMIT, ScoredData

MASKED = -100
# Auxiliary arrays holding one entry per token of each sequence.
PER_TOKEN_AUX_KEYS: tuple[str, ...] = (
    "advantages", "ref_logprobs", "inference_logprobs", "distill_token_ids", "distill_logprobs",
)


class Problem(NamedTuple):
    """One validation finding: `reason` is its metrics label, `field` its location."""

    reason: str
    field: str
    message: str

    def text(self) -> str:
        return f"{self.field}: {self.message}"


def structural_problems(group: ScoredData) -> list[tuple[str, str]]:
    """(field, message) pairs of the problems every level but ``off`` refuses."""
    hard: list[tuple[str, str]] = []
    count = len(group.tokens)
    if count == 0:
        hard.append(("tokens", "a group needs at least one sequence"))
    if len(group.masks) != count:
        hard.append(("masks", f"{len(group.masks)} mask lists for {count} token lists"))
    if len(group.scores) != count:
        hard.append(("scores", f"{len(group.scores)} scores for {count} sequences"))
    for i, (tokens, mask) in enumerate(zip(group.tokens, group.masks)):
        if len(tokens) != len(mask):
            hard.append((f"masks.{i}", f"{len(mask)} labels for {len(tokens)} tokens"))
            break
    if group.env_id is not None and group.env_id < 0:
        hard.append(("env_id", "must not be negative"))
    return hard


def quality_problems(group: ScoredData) -> list[Problem]:
    """Problems ``warn`` accepts and ``strict`` refuses (fields relative to the body);
    assumes `structural_problems` found nothing."""
    return [*_sequence_problems(group), *_aux_problems(group)]


def _sequence_problems(group: ScoredData) -> list[Problem]:
    empty, bad_ids, bad_labels = [], [], []
    for i, (tokens, mask) in enumerate(zip(group.tokens, group.masks)):
        if not tokens:
            empty.append(i)
            continue
        ids = _packed_ids(tokens)
        if ids is None or np.frombuffer(ids, dtype=np.uint32).max() >= TOKEN_ID_LIMIT:
            j = next(j for j, token in enumerate(tokens) if not 0 <= token < TOKEN_ID_LIMIT)
            bad_ids.append((i, j, tokens[j]))
        position = _wrong_label(tokens, mask, ids)
        if position is not None:
            bad_labels.append((i, position, mask[position], tokens[position]))
    problems = []
    if empty:
        problems.append(Problem("empty_sequence", f"tokens.{empty[0]}", "an empty sequence" + _more(empty)))
    if bad_ids:
        i, j, value = bad_ids[0]
        problems.append(Problem(
            "token_id_range", f"tokens.{i}.{j}",
            f"token id {value} is outside [0, {TOKEN_ID_LIMIT})" + _more(bad_ids),
        ))
    if bad_labels:
        i, j, label, token = bad_labels[0]
        problems.append(Problem(
            "mask_label", f"masks.{i}.{j}",
            f"{label} is neither {MASKED} nor the token {token}" + _more(bad_labels),
        ))
    return problems


def _more(found: Sequence[Any]) -> str:
    return f" (and {len(found) - 1} more sequences)" if len(found) > 1 else ""


def _packed_ids(values: list[int]) -> Optional[array]:
    """`values` packed as uint32, or None when one is negative or past 2**32.

    Packing runs in C (signed typecodes take a much slower path) and packed arrays
    compare with memcmp, which is what makes these checks cheap next to parsing.
    """
    try:
        return array("I", values)
    except OverflowError:
        return None


def _masked_prefix(mask: list[int]) -> int:
    """Length of the leading run of -100 labels, assuming the usual shape (a masked
    prompt, then the completion); the caller verifies the assumption."""
    low, high = 0, len(mask)
    while low < high:
        middle = (low + high) // 2
        if mask[middle] == MASKED:
            low = middle + 1
        else:
            high = middle
    return low


def _wrong_label(tokens: list[int], mask: list[int], ids: Optional[array]) -> Optional[int]:
    """Index of the first mask label that is neither -100 nor its token, or None."""
    masked = _masked_prefix(mask)
    if ids is not None and mask[:masked].count(MASKED) == masked:
        completion = _packed_ids(mask[masked:])
        if completion is not None and completion == ids[masked:]:
            return None
    return next(
        (j for j, (label, token) in enumerate(zip(mask, tokens)) if label != MASKED and label != token),
        None,
    )


def _aux_problems(group: ScoredData) -> list[Problem]:
    count = len(group.tokens)
    problems = []
    for key in PER_SEQUENCE_AUX_KEYS:
        value = getattr(group, key)
        if value is None:
            continue
        if len(value) != count:
            problems.append(Problem("aux_length", key, f"{len(value)} entries for {count} sequences"))
            continue
        if key not in PER_TOKEN_AUX_KEYS:
            continue
        misaligned = [i for i, (entry, tokens) in enumerate(zip(value, group.tokens)) if len(entry) != len(tokens)]
        if misaligned:
            i = misaligned[0]
            problems.append(Problem(
                "aux_length", f"{key}.{i}",
                f"{len(value[i])} values for {len(group.tokens[i])} tokens" + _more(misaligned),
            ))
    return problems
