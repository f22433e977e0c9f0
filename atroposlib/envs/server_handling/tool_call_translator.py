"""`ToolCallTranslator`: between raw model text and OpenAI-style ``tool_calls``.

Hermes-format calls (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) are
parsed natively; other formats use vLLM's tool-parser registry when vLLM is installed.
The raw text of every parsed call is remembered, so replaying the conversation renders
the model's exact tokens again (prefix matching in `ManagedServer` depends on it).
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from typing import Any, Optional

log = logging.getLogger("atroposlib.inference")

HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class ToolCallTranslator:
    def __init__(self, tokenizer: Any, parser_name: str = "hermes") -> None:
        self.tokenizer = tokenizer
        self.parser_name = parser_name
        self.raw_text_by_call_id: dict[str, str] = {}
        self._vllm_parser = None if parser_name == "hermes" else self._load_vllm_parser(parser_name)

    def _load_vllm_parser(self, name: str) -> Any:
        try:
            from vllm.entrypoints.openai.tool_parsers import ToolParserManager
        except ImportError:
            log.warning("tool parser %r needs vLLM, which is not installed: tool calls are not parsed", name)
            return None
        return ToolParserManager.get_tool_parser(name)(self.tokenizer)

    @property
    def can_parse(self) -> bool:
        return self.parser_name == "hermes" or self._vllm_parser is not None

    def parse_model_output(
        self, raw_text: str, tool_choice: Optional[str] = None, tools: Optional[list[Any]] = None
    ) -> tuple[str, Optional[list[dict[str, Any]]], str]:
        """(content, tool_calls or None, finish_reason) of one completion."""
        if tool_choice == "none" or not tools or not self.can_parse:
            return raw_text, None, "stop"
        calls = self._parse(raw_text)
        if not calls:
            return raw_text, None, "stop"
        self.raw_text_by_call_id[calls[0]["id"]] = raw_text
        content = HERMES_CALL.sub("", raw_text).strip() if self.parser_name == "hermes" else ""
        return content, calls, "tool_calls"

    def _parse(self, raw_text: str) -> list[dict[str, Any]]:
        if self._vllm_parser is not None:
            result = self._vllm_parser.extract_tool_calls(raw_text, request=None)
            return [call.model_dump() for call in result.tool_calls] if result.tools_called else []
        calls = []
        for body in HERMES_CALL.findall(raw_text):
            try:
                parsed = json.loads(body)
            except json.JSONDecodeError:
                continue
            if isinstance(parsed, dict) and "name" in parsed:
                calls.append({
                    "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                    "function": {"name": parsed["name"], "arguments": json.dumps(parsed.get("arguments", {}))},
                })
        return calls

    def reconstruct_raw_text_from_tool_calls(self, tool_calls: list[dict[str, Any]]) -> tuple[str, bool]:
        """(raw text, exact) for replaying an assistant message that made `tool_calls`."""
        if tool_calls and tool_calls[0].get("id") in self.raw_text_by_call_id:
            return self.raw_text_by_call_id[tool_calls[0]["id"]], True
        lines = []
        for call in tool_calls:
            function = call.get("function", {})
            arguments = function.get("arguments", {})
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    pass
            lines.append(f"<tool_call>{json.dumps({'name': function.get('name'), 'arguments': arguments})}</tool_call>")
        return "\n".join(lines), False

    def convert_messages_for_template(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        converted = []
        for message in messages:
            if message.get("role") == "assistant" and message.get("tool_calls"):
                raw, exact = self.reconstruct_raw_text_from_tool_calls(message["tool_calls"])
                if not exact and message.get("content"):
                    raw = f"{message['content']}\n{raw}"
                converted.append({"role": "assistant", "content": raw})
            else:
                converted.append(message)
        return converted

    def decode_with_tool_awareness(self, ids: list[int], has_tools: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=not has_tools)
