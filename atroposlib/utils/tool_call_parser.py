"""Reading ``<tool_call>{...}</tool_call>`` blocks out of model output."""

from __future__ import annotations

import json
import re
from typing import Any, Optional, Sequence

ERROR_NAME = "-ERROR-"


def extract_tool_call(text: str, preferred_tags: Optional[Sequence[str]] = None) -> Optional[str]:
    """The stripped content of the first ``<tag>...</tag>`` for the first tag that occurs."""
    for tag in preferred_tags or ["tool_call"]:
        found = re.search(f"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, re.DOTALL)
        if found:
            return found.group(1).strip()
    return None


def _decode(body: str) -> Any:
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        # Models often write Python-style single quotes; try that only after strict JSON,
        # since the replacement corrupts arguments that contain apostrophes.
        return json.loads(body.replace("'", '"'), strict=False)


def _tool_names(available_tools: Sequence[Any]) -> set[str]:
    names = set()
    for tool in available_tools:
        if isinstance(tool, dict):
            names.add(tool.get("name") or (tool.get("function") or {}).get("name"))
    return names


def parse_tool_call(
    response: str, available_tools: Optional[Sequence[Any]] = None, preferred_tags: Optional[Sequence[str]] = None
) -> tuple[str, dict[str, Any], bool]:
    """(tool name, arguments, is_error) of the first tool call in `response`."""
    body = extract_tool_call(response, preferred_tags)
    if body is None:
        return ERROR_NAME, {}, True
    try:
        call = _decode(body)
    except json.JSONDecodeError:
        return ERROR_NAME, {}, True
    if not isinstance(call, dict):
        return ERROR_NAME, {}, True
    name, arguments = call.get("name"), call.get("arguments") or {}
    if available_tools is not None and name not in _tool_names(available_tools):
        return ERROR_NAME, arguments, True
    return str(name), arguments, False
