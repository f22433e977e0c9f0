"""`ToolCallTranslator`: between raw model text and OpenAI-style ``tool_calls``.

Hermes-format calls (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, also
when the model stops before the closing tag) are parsed natively; other formats use
vLLM's tool-parser registry when vLLM is installed. The raw text of every parsed call is
remembered by call id, so replaying the conversation renders the model's exact text again
(prefix matching in `ManagedServer` depends on it).

``VLLM_AVAILABLE`` keeps Atropos 0.4.0's name for "tool calls in model output can be
parsed": there that needed vLLM, here the default Hermes format never does, so it is
always true. ``VLLM_INSTALLED`` tells whether vLLM's parsers for other formats can load.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import re
import uuid
from typing import Any, Optional

from openai.types.chat import ChatCompletionMessageFunctionToolCall as ToolCall
from openai.types.chat.chat_completion_message_function_tool_call import Function

log = logging.getLogger("atroposlib.inference")

VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None
VLLM_AVAILABLE = True
NATIVE_PARSER = "hermes"

HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
# vLLM moved its parser registry and request model between releases; the newest first.
VLLM_PARSER_MODULES = ("vllm.tool_parsers", "vllm.entrypoints.openai.tool_parsers")
VLLM_REQUEST_MODULES = ("vllm.entrypoints.openai.chat_completion.protocol", "vllm.entrypoints.openai.protocol")

ParsedOutput = tuple[Optional[str], Optional[list[ToolCall]], str]


def _first_attribute(modules: tuple[str, ...], name: str) -> Any:
    for module in modules:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"no {name} in {', '.join(modules)}")


def _new_call(name: str, arguments: str) -> ToolCall:
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", type="function", function=Function(name=name, arguments=arguments))


def parse_hermes(raw_text: str) -> tuple[Optional[str], list[ToolCall]]:
    """(text outside the calls or None, calls) of Hermes-format output; bodies that are
    not a JSON object with a ``name`` are not calls."""
    calls = []
    for body in HERMES_CALL.findall(raw_text):
        try:
            parsed = json.loads(body)
        except json.JSONDecodeError:
            continue
        if isinstance(parsed, dict) and isinstance(parsed.get("name"), str):
            calls.append(_new_call(parsed["name"], json.dumps(parsed.get("arguments", {}))))
    content = HERMES_CALL.sub("", raw_text).strip() if calls else raw_text
    return content or None, calls


class ToolCallTranslator:
    """Parses tool calls out of completions and turns them back into raw text for replay."""

    def __init__(self, tokenizer: Any, parser_name: str = NATIVE_PARSER) -> None:
        self.tokenizer = tokenizer
        self.parser_name = parser_name
        self.call_id_to_raw_text: dict[str, str] = {}
        self._vllm_parser = None if parser_name == NATIVE_PARSER else self._load_vllm_parser(parser_name)

    def _load_vllm_parser(self, name: str) -> Any:
        if not VLLM_INSTALLED:
            log.warning("tool parser %r needs vLLM, which is not installed: tool calls are not parsed "
                        "(the %r parser needs nothing)", name, NATIVE_PARSER)
            return None
        manager = _first_attribute(VLLM_PARSER_MODULES, "ToolParserManager")
        return manager.get_tool_parser(name)(self.tokenizer)

    @property
    def can_parse(self) -> bool:
        return self.parser_name == NATIVE_PARSER or self._vllm_parser is not None

    def parse_model_output(
        self, raw_text: str, tool_choice: Optional[str] = None, tools: Optional[list[Any]] = None
    ) -> ParsedOutput:
        """(content, tool calls or None, finish_reason) of one completion."""
        if tool_choice == "none" or not tools or not self.can_parse:
            return raw_text, None, "stop"
        content, calls = self._parse(raw_text, tools, tool_choice)
        if not calls:
            return raw_text, None, "stop"
        for call in calls:
            self.call_id_to_raw_text[call.id] = raw_text
        return content, calls, "tool_calls"

    def _parse(self, raw_text: str, tools: list[Any], tool_choice: Optional[str]) -> tuple[Optional[str], list[ToolCall]]:
        if self._vllm_parser is None:
            return parse_hermes(raw_text)
        request_model = _first_attribute(VLLM_REQUEST_MODULES, "ChatCompletionRequest")
        request = request_model(messages=[{"role": "user", "content": ""}], tools=tools, tool_choice=tool_choice or "auto")
        result = self._vllm_parser.extract_tool_calls(raw_text, request=request)
        if not result.tools_called:
            return raw_text, []
        calls = [_new_call(c.function.name, c.function.arguments) for c in result.tool_calls]
        return result.content or None, calls

    def reconstruct_raw_text_from_tool_calls(self, tool_calls: list[dict[str, Any]]) -> str:
        """The raw text of an assistant message that made `tool_calls`: the model's exact
        text when this translator parsed them, else one Hermes line per call."""
        return self._replay(tool_calls)[0]

    def _replay(self, tool_calls: list[dict[str, Any]]) -> tuple[str, bool]:
        """(raw text, whether it is the model's exact text)."""
        if tool_calls and tool_calls[0].get("id") in self.call_id_to_raw_text:
            return self.call_id_to_raw_text[tool_calls[0]["id"]], True
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
        """`messages` with every assistant message that made tool calls turned into its raw text."""
        converted = []
        for message in messages:
            if message.get("role") == "assistant" and message.get("tool_calls"):
                raw, exact = self._replay(message["tool_calls"])
                if not exact and message.get("content"):
                    raw = f"{message['content']}\n{raw}"
                converted.append({"role": "assistant", "content": raw})
            else:
                converted.append(message)
        return converted

    def decode_with_tool_awareness(self, ids: list[int], has_tools: bool = False) -> str:
        """Decode `ids`, keeping special tokens when tools are active (call tags may be special tokens)."""
        return self.tokenizer.decode(ids, skip_special_tokens=not has_tools)
