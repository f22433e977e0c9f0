"""Sampling records: how the completions behind one item's rollouts were sampled.

While an environment collects the rollouts of one item, the mode running it keeps a
*sampling record* open (`recording`). Every completion an inference server answers in that
time adds a `SampledCompletion` to it: the sampling parameters the request set
(`SAMPLING_KEYS`, those passed in ``extra_body`` included) and the policy version the server
reported (header `POLICY_VERSION_HEADER`, or ``"policy_version"`` in a ``/generate``
answer; None when it did not say). `ManagedServer` completions also carry the token ids of
the node they produced, so a rollout built from a node is matched to it by its tokens.
Prompt scoring (``get_logprobs``) samples nothing and is not recorded; other completions
made meanwhile (a judge's, say) are, which can only narrow what a group is said to share.
`BaseEnv.handle_send_to_api` stamps each group from the record
(`atroposlib.envs.sampling_stamp`).

The record sits in a context variable and is mutable: tasks an environment starts inside
``collect_trajectories`` (``asyncio.gather``, ``create_task``) copy the context, so they add to
the same record, while items collected concurrently, each in its own task, have their own.
Backends report versions the same way, into a list `APIServer` opens around each request
(`reported_versions`), so a request split into several HTTP calls (``n`` emulation) is as
old as the oldest answer.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Optional

from atroposlib.policy_version import POLICY_VERSION_HEADER, POLICY_VERSION_KEY, SAMPLING_KEYS, parse_version

_RECORD: ContextVar[Optional["SamplingRecord"]] = ContextVar("atropos_sampling_record", default=None)
_VERSIONS: ContextVar[Optional[list[Optional[int]]]] = ContextVar("atropos_reported_versions", default=None)


@dataclass(frozen=True)
class SampledCompletion:
    """One completion request's sampling: `params` (the `SAMPLING_KEYS` it set), the policy
    `version` that answered (None: unknown), and for a managed node its `tokens`."""

    params: dict[str, Any] = field(default_factory=dict)
    version: Optional[int] = None
    tokens: Optional[tuple[int, ...]] = None

    def keys(self) -> dict[str, Any]:
        """What it stamps on a rollout: its parameters, and its version when known."""
        keys = dict(self.params)
        if self.version is not None:
            keys[POLICY_VERSION_KEY] = self.version
        return keys


class SamplingRecord:
    """The completions sampled while one item's rollouts were collected."""

    def __init__(self) -> None:
        self.completions: list[SampledCompletion] = []

    def add(self, completion: SampledCompletion) -> None:
        self.completions.append(completion)

    def nodes(self) -> dict[tuple[int, ...], list[SampledCompletion]]:
        """Managed nodes by their token ids; equal answers sampled by different requests are
        all kept, in the order they were recorded."""
        nodes: dict[tuple[int, ...], list[SampledCompletion]] = {}
        for completion in self.completions:
            if completion.tokens is not None:
                nodes.setdefault(completion.tokens, []).append(completion)
        return nodes

    def overall(self) -> Optional[SampledCompletion]:
        """All completions as one: the parameters they all share and the oldest version;
        None when nothing was recorded."""
        if not self.completions:
            return None
        first, rest = self.completions[0].params, self.completions[1:]
        shared = {k: v for k, v in first.items() if all(k in c.params and c.params[k] == v for c in rest)}
        return SampledCompletion(shared, oldest(c.version for c in self.completions))


def oldest(versions: Iterable[Optional[int]]) -> Optional[int]:
    """The oldest of `versions`; None (unknown) when there are none or one is unknown."""
    known = []
    for version in versions:
        if version is None:
            return None
        known.append(version)
    return min(known) if known else None


def sampling_params(request: Mapping[str, Any]) -> dict[str, Any]:
    """The `SAMPLING_KEYS` a request sets, numbers only; ``extra_body`` wins, as it does on
    the wire (the openai client and `VLLMServer` merge it over the other fields)."""
    extra = request.get("extra_body")
    merged = {**request, **extra} if isinstance(extra, Mapping) else request
    return {k: merged[k] for k in SAMPLING_KEYS
            if isinstance(merged.get(k), (int, float)) and not isinstance(merged.get(k), bool)}


def current_record() -> Optional[SamplingRecord]:
    """The record open in this context, or None."""
    return _RECORD.get()


@contextmanager
def recording() -> Iterator[SamplingRecord]:
    """Open a fresh record for the code inside the block (and the tasks it starts)."""
    record = SamplingRecord()
    token = _RECORD.set(record)
    try:
        yield record
    finally:
        _RECORD.reset(token)


def record_completion(params: dict[str, Any], version: Optional[int], tokens: Optional[Iterable[int]] = None) -> None:
    """Add a completion to the open record (nothing happens when none is open)."""
    record = _RECORD.get()
    if record is not None:
        record.add(SampledCompletion(dict(params), version, tuple(tokens) if tokens is not None else None))


@contextmanager
def reported_versions() -> Iterator[list[Optional[int]]]:
    """Collect the versions backends report (`report_version`) inside the block."""
    versions: list[Optional[int]] = []
    token = _VERSIONS.set(versions)
    try:
        yield versions
    finally:
        _VERSIONS.reset(token)


def version_header(response: Any) -> Optional[str]:
    """The policy version header of an HTTP answer (httpx, aiohttp, the openai client's raw
    answers); None for one without headers, such as the stand-ins environments' tests use."""
    headers = getattr(response, "headers", None)
    return headers.get(POLICY_VERSION_HEADER) if headers is not None else None


def report_version(*values: Any) -> None:
    """A backend got an answer: note its version, the first of `values` (header, then body
    field) that is one, or None when none is."""
    versions = _VERSIONS.get()
    if versions is not None:
        versions.append(next((v for v in map(parse_version, values) if v is not None), None))
