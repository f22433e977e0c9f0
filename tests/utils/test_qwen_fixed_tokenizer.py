import json
from pathlib import Path

import jinja2.sandbox

from atroposlib.utils.tokenizers.qwen_fixed_tokenizer import QwenFixedTokenizer, packaged_chat_template

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
CHAT = [
    {"role": "user", "content": "1+2?"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
    {"role": "tool", "content": "3", "tool_call_id": "c1"},
    {"role": "tool", "content": "ok", "tool_call_id": "c2"},
]


def test_renders_tools_calls_and_responses(tokenizer_dir: Path) -> None:
    tokenizer = QwenFixedTokenizer(str(tokenizer_dir))
    text = tokenizer.apply_chat_template(CHAT, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are Qwen")
    assert json.dumps(TOOLS[0]) in text
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\n3\n</tool_response>\n<tool_response>\nok\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert tokenizer.eos_token == tokenizer.tokenizer.eos_token  # attributes are delegated


def test_explicit_template_wins_and_sandbox_accepts_the_packaged_one(tokenizer_dir: Path) -> None:
    tokenizer = QwenFixedTokenizer(str(tokenizer_dir))
    custom = "{% for m in messages %}[{{ m.content }}]{% endfor %}"
    assert tokenizer.apply_chat_template(CHAT[:1], tokenize=False, chat_template=custom) == "[1+2?]"
    rendered = jinja2.sandbox.ImmutableSandboxedEnvironment().from_string(packaged_chat_template()).render(
        messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert rendered == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
