"""Stamping a group with how its rollouts were sampled, from its item's sampling record.

A trainer computes each token's log-probability under the distribution it was drawn from
and weighs how stale a group is, so each group says, in ``generation_params`` (and per
rollout in ``overrides[i]``), the sampling parameters (`SAMPLING_KEYS`) and the policy
version (``policy_version``) of its rollouts. `stamp_group` writes them:

* Rollout i's values are those of the `ManagedServer` node whose token ids equal its
  ``tokens`` (rollouts with equal tokens take the nodes with those tokens in the order
  they were recorded, the last one again if there are fewer). A rollout that matches no
  node (environments that tokenize plain chat or completion answers themselves) gets
  those of all the record's completions taken together: the parameters they all share
  and the oldest version, unknown if one is.
* A key goes into ``generation_params`` when every rollout has it, with the value most
  rollouts have (on a tie, the earliest rollout's); a rollout with another value carries
  it in ``overrides[i]``. A key only some rollouts have (a version some servers did not
  report) stays out of ``generation_params`` and goes into the ``overrides[i]`` of those
  rollouts, so the group's version reads as unknown (`group_policy_version`).
* ``overrides`` is created (``{}`` for the other rollouts) only when a rollout needs one.
* What the environment set itself stays: a key it put in ``generation_params`` or
  ``group_overrides`` is not stamped at all, one it put in ``overrides[i]`` not for rollout i.
* A group gets nothing when nothing was recorded (no inference call made it).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional

from atroposlib.envs.server_handling.sampling_record import SamplingRecord


def _rollout_keys(group: dict[str, Any], record: SamplingRecord) -> list[dict[str, Any]]:
    """What the record says of each rollout of `group`."""
    nodes = record.nodes()
    overall = record.overall()
    taken: Counter[tuple[int, ...]] = Counter()
    keys = []
    for tokens in group.get("tokens") or []:
        sequence = tuple(tokens)
        matches = nodes.get(sequence)
        match = matches[min(taken[sequence], len(matches) - 1)] if matches else overall
        taken[sequence] += 1
        keys.append(match.keys() if match is not None else {})
    return keys


def _group_value(values: list[Any]) -> Any:
    """The value most rollouts have; on a tie, the one the earliest of them has."""
    return max(values, key=lambda value: (values.count(value), -values.index(value)))


def stamp_group(group: dict[str, Any], record: SamplingRecord) -> None:
    """Write into `group` how its rollouts were sampled (rules in the module docstring)."""
    params = group.get("generation_params") or {}
    overrides = group.get("overrides")
    if not isinstance(params, dict) or not (overrides is None or isinstance(overrides, list)):
        return  # shapes this module does not understand are the environment's to explain
    per_rollout = _rollout_keys(group, record)
    owned = set(params) | set(group.get("group_overrides") or {})
    stamped: dict[str, Any] = {}
    rollout_overrides: dict[int, dict[str, Any]] = {}
    for key in dict.fromkeys(k for keys in per_rollout for k in keys):
        if key in owned:
            continue
        everyone = all(key in keys for keys in per_rollout)
        if everyone:
            stamped[key] = _group_value([keys[key] for keys in per_rollout])
        for i, keys in enumerate(per_rollout):
            if key in keys and not (everyone and keys[key] == stamped[key]):
                rollout_overrides.setdefault(i, {})[key] = keys[key]
    if stamped:
        group["generation_params"] = {**params, **stamped}
    if rollout_overrides:
        group["overrides"] = _merged_overrides(overrides, rollout_overrides, len(per_rollout))


def _merged_overrides(existing: Optional[list[Any]], stamped: dict[int, dict[str, Any]], rollouts: int) -> list[Any]:
    """The environment's overrides (padded with ``{}`` to one per rollout) with the stamped
    keys added where the environment did not set them; entries are copied, not changed,
    as an environment may share one dict between rollouts."""
    merged = list(existing or [])
    merged += [{} for _ in range(rollouts - len(merged))]
    for i, keys in stamped.items():
        own = merged[i] if isinstance(merged[i], dict) else {}
        merged[i] = {**keys, **own}
    return merged
