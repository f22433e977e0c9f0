"""How submitted groups are stored and turned back into served items.

The server stores each group as the bytes it was submitted in (gzip-compressed when
the client compressed it), after validating them. Serving turns those bytes into the
canonical item: exactly the fourteen keys of `ITEM_KEYS`, absent optionals ``null``,
unknown fields dropped, numbers typed as declared. Storing the submission rather than
the canonical form keeps the hot submission path to one parse, and compressed bodies
make the journal's writes 2-3x smaller.
"""

from __future__ import annotations

import gzip
from typing import Optional

import orjson

from atroposlib.policy_version import group_policy_version
from atroposlib.wire import ITEM_KEYS, ScoredData

_ITEM_FIELDS = set(ITEM_KEYS)
_GZIP_MAGIC = b"\x1f\x8b"


def item_json(group: ScoredData) -> bytes:
    """The canonical stored-item JSON of a validated group."""
    return group.model_dump_json(include=_ITEM_FIELDS).encode()


def _plain(stored: bytes) -> bytes:
    return gzip.decompress(stored) if stored[:2] == _GZIP_MAGIC else stored


def served_item(stored: bytes) -> bytes:
    """The canonical item JSON of a stored submission."""
    # Lax: it passed validation when it was stored (whole-number floats included).
    return item_json(ScoredData.model_validate_json(_plain(stored), strict=False))


def stored_policy_version(stored: bytes) -> Optional[int]:
    """The policy version of a stored submission (None: unknown)."""
    group = orjson.loads(_plain(stored))
    return group_policy_version(group) if isinstance(group, dict) else None


def served_items(stored: list[bytes]) -> list[bytes]:
    return [served_item(payload) for payload in stored]
