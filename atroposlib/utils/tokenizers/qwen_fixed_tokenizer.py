"""`QwenFixedTokenizer`: a Qwen tokenizer whose chat template renders tool calls reliably.

Some Qwen releases ship templates that mutate lists inside Jinja, which sandboxed
renderers reject, so conversations with tool calls fail to render. This wrapper loads the
tokenizer normally and renders chats with the packaged ``qwen_chat_template.jinja``
(ChatML with ``<tools>``, ``<tool_call>`` and ``<tool_response>`` blocks) unless the caller
passes its own ``chat_template``.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any


@lru_cache(maxsize=1)
def packaged_chat_template() -> str:
    """The text of the packaged ``qwen_chat_template.jinja``."""
    return resources.files(__package__).joinpath("qwen_chat_template.jinja").read_text(encoding="utf-8")


class QwenFixedTokenizer:
    """An `AutoTokenizer` (every attribute delegated) with the packaged chat template."""

    def __init__(self, model_name_or_path: str, **kwargs: Any) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, **kwargs)
        self.tokenizer.chat_template = packaged_chat_template()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)

    def apply_chat_template(self, conversation: Any, tools: Any = None, **kwargs: Any) -> Any:
        if kwargs.get("chat_template") is None:
            kwargs["chat_template"] = packaged_chat_template()
        return self.tokenizer.apply_chat_template(conversation, tools=tools, **kwargs)
