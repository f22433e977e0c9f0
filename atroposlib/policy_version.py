"""Policy versions: which weights sampled a group, and how stale the group is when trained on.

A *policy version* is the number of trainer optimizer steps behind the weights an inference
server samples from: 0 for the weights training started from, ``N`` after the trainer handed
it the checkpoint of step ``N``. Servers that know their version say so in the
``X-Atropos-Policy-Version`` header of every answer (the trainer's bundled vLLM server and
``atropos-vllm serve`` do; the bundled server's ``/generate`` answer also carries
``"policy_version"``). Environments stamp it on each group they send, beside the sampling
parameters, in ``generation_params`` (and per rollout in ``overrides[i]`` where a rollout
differs from its group):

    {"generation_params": {"temperature": 0.7, "top_p": 1.0, "policy_version": 12}, ...}

A group's version is the oldest of its rollouts'; a group without one is *unknown*. The
*staleness* of a group trained at step ``s`` is ``s - version``: how many optimizer steps
the trainer has taken since the weights that sampled it.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

POLICY_VERSION_HEADER = "X-Atropos-Policy-Version"
POLICY_VERSION_KEY = "policy_version"
# The sampling parameters that change the distribution tokens are drawn from, and so the
# log-probabilities a trainer must compute to match the sampler's.
SAMPLING_KEYS: tuple[str, ...] = ("temperature", "top_p", "top_k", "min_p")


def parse_version(value: Any) -> Optional[int]:
    """A policy version from a header or JSON value: a non-negative integer, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def group_policy_version(group: Mapping[str, Any]) -> Optional[int]:
    """The version of the oldest weights that sampled any rollout of `group`; None (unknown)
    when the group or one of its rollouts does not say."""
    params = group.get("generation_params")
    group_version = parse_version(params.get(POLICY_VERSION_KEY)) if isinstance(params, Mapping) else None
    overrides = group.get("overrides")
    rollouts = len(group.get("tokens") or ())
    versions = []
    for i in range(rollouts):
        override = overrides[i] if isinstance(overrides, list) and i < len(overrides) else None
        if isinstance(override, Mapping) and POLICY_VERSION_KEY in override:
            versions.append(parse_version(override[POLICY_VERSION_KEY]))
        else:
            versions.append(group_version)
    if not versions:
        return group_version
    if any(version is None for version in versions):
        return None
    return min(v for v in versions if v is not None)


def staleness(step: int, version: Optional[int]) -> Optional[int]:
    """Optimizer steps between the weights that sampled a group (`version`) and the step
    `step` it is trained at; None when the version is unknown."""
    if version is None:
        return None
    return max(step - version, 0)
