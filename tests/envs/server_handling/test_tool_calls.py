"""Tool calls: parsed from Hermes-format text, replayed with the exact raw text."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

import transformers

from atroposlib.envs.server_handling.managed_server import ManagedServer
from atroposlib.envs.server_handling.tool_call_translator import VLLM_AVAILABLE, ToolCallTranslator, parse_hermes
from atroposlib.utils.tool_call_parser import extract_tool_call, parse_tool_call
from atroposlib.local.runtime import Runtime
from tests.envs.server_handling.test_managed_server import TokenHarness

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
RAW = 'Let me add.<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'


def test_parse_tool_call() -> None:
    assert extract_tool_call(RAW) == '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    assert parse_tool_call(RAW, TOOLS) == ("add", {"a": 1, "b": 2}, False)
    assert parse_tool_call("<tool_call>{'name': 'add', 'arguments': {}}</tool_call>") == ("add", {}, False)
    assert parse_tool_call('<tool_call>{"name": "it\'s", "arguments": {"q": "it\'s"}}</tool_call>') == ("it's", {"q": "it's"}, False)
    assert parse_tool_call(RAW, [{"name": "other"}]) == ("-ERROR-", {"a": 1, "b": 2}, True)
    assert parse_tool_call("no call") == ("-ERROR-", {}, True)


def test_translator_round_trip(tokenizer_dir: Path) -> None:
    translator = ToolCallTranslator(transformers.AutoTokenizer.from_pretrained(tokenizer_dir))
    content, calls, reason = translator.parse_model_output(RAW, "auto", TOOLS)
    assert (content, reason, calls[0].function.name) == ("Let me add.", "tool_calls", "add")
    assert translator.call_id_to_raw_text == {calls[0].id: RAW}
    assert translator.parse_model_output(RAW, "none", TOOLS) == (RAW, None, "stop")
    replay = translator.convert_messages_for_template(
        [{"role": "assistant", "content": content, "tool_calls": [c.model_dump() for c in calls]}])
    assert replay == [{"role": "assistant", "content": RAW}]
    foreign = [{"id": "x", "function": {"name": "add", "arguments": '{"a": 1}'}}]
    assert translator.reconstruct_raw_text_from_tool_calls(foreign) == '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    assert translator.convert_messages_for_template([{"role": "assistant", "content": "Sure.", "tool_calls": foreign}]) == [
        {"role": "assistant", "content": 'Sure.\n<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'}]


def test_hermes_parsing_needs_no_vllm() -> None:
    assert VLLM_AVAILABLE
    two = '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>'
    content, calls = parse_hermes(two)
    assert content is None and [(c.function.name, c.function.arguments) for c in calls] == [("a", "{}"), ("b", '{"x": 1}')]
    unclosed = parse_hermes('<tool_call>{"name": "a", "arguments": {"q": "cats"}}')[1]
    assert [(c.function.name, c.function.arguments) for c in unclosed] == [("a", '{"q": "cats"}')]
    assert parse_hermes("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])


def test_managed_server_returns_tool_calls(tokenizer_dir: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    completion = tokenizer.encode(RAW, add_special_tokens=False)
    managed = ManagedServer(TokenHarness(completion), tokenizer, tool_parser="hermes")
    response = asyncio.run(managed.chat_completion(messages=[{"role": "user", "content": "1 + 2?"}], tools=TOOLS))
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0]["function"]["name"] == "add"
    assert managed.get_state()["nodes"][0].full_text.endswith(RAW)


VLLM_PARSING = """
import json, sys
from transformers import AutoTokenizer
from atroposlib.envs.server_handling.tool_call_translator import ToolCallTranslator
translator = ToolCallTranslator(AutoTokenizer.from_pretrained(sys.argv[1]), "pythonic")
content, calls, reason = translator.parse_model_output("[add(a=1, b=2)]", "auto", json.loads(sys.argv[2]))
print(json.dumps([reason, [c.model_dump() for c in calls], translator.call_id_to_raw_text]))
"""


@pytest.mark.real_vllm
@pytest.mark.slow
def test_other_formats_use_vllms_parsers(tokenizer_dir: Path) -> None:
    """Run in the vLLM runtime's own interpreter, the one place vLLM is installed."""
    runtime = Runtime()
    if not runtime.is_installed():
        pytest.skip(f"no vLLM runtime at {runtime.path} (run `atropos-vllm install`, or set ATROPOS_HOME)")
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([str(runtime.python), "-c", VLLM_PARSING, str(tokenizer_dir), json.dumps(TOOLS)],
                          capture_output=True, text=True, timeout=300, cwd=root,
                          env={"PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    reason, calls, raw_by_id = json.loads(done.stdout.strip().splitlines()[-1])
    assert reason == "tool_calls" and [c["function"] for c in calls] == [{"name": "add", "arguments": '{"a": 1, "b": 2}'}]
    assert raw_by_id == {calls[0]["id"]: "[add(a=1, b=2)]"}
