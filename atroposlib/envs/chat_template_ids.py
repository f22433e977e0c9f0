"""Chat templates that answer as environment files written for transformers 4 expect.

Atropos's environment files were written against transformers 4, where
``tokenizer.apply_chat_template(messages)`` (``tokenize=True`` by default) returned the token
ids as a ``list[int]``. transformers 5 returns a ``BatchEncoding`` (a dict) instead, so such a
file's ``len(ids)``, ``ids[n:]`` or ``json.dumps(ids)`` fails or means something else.

`keep_transformers4_chat_ids` makes an environment's tokenizer give, for a tokenizing call
that does not choose ``return_dict`` (or ``return_tensors``) itself, a `ChatTokenIds`: the
list transformers 4 returned, which also answers the lookups of transformers 5's result
(``["input_ids"]``, ``.input_ids``, ``["attention_mask"]``, ``.keys()``), so files written
either way work. A call that passes ``return_dict`` or ``return_tensors``, or asks for text
(``tokenize=False``), gets exactly what transformers gives.
"""

from __future__ import annotations

import inspect
from typing import Any, Iterator, Union

INPUT_IDS, ATTENTION_MASK = "input_ids", "attention_mask"


class ChatTokenIds(list):
    """A chat's token ids: a ``list[int]`` (transformers 4's answer) that also behaves as
    transformers 5's ``BatchEncoding`` where code looks it up by key."""

    def __getitem__(self, key: Union[int, slice, str]) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            if key == INPUT_IDS:
                return list(self)
            if key == ATTENTION_MASK:
                return [1] * len(self)
            raise KeyError(key)
        return super().__getitem__(key)

    @property
    def input_ids(self) -> list[int]:
        return list(self)

    @property
    def attention_mask(self) -> list[int]:
        return [1] * len(self)

    def keys(self) -> list[str]:
        return [INPUT_IDS, ATTENTION_MASK]

    def items(self) -> Iterator[tuple[str, list[int]]]:
        return iter([(INPUT_IDS, self.input_ids), (ATTENTION_MASK, self.attention_mask)])


def _as_chat_ids(result: Any) -> Any:
    if isinstance(result, list) and all(isinstance(token, int) for token in result):
        return ChatTokenIds(result)
    if isinstance(result, list) and all(isinstance(row, list) for row in result):
        return [_as_chat_ids(row) for row in result]
    return result


class _ChatTemplateAsIds:
    """The tokenizer's own ``apply_chat_template``, giving `ChatTokenIds` where the caller
    did not choose the form of a tokenized answer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.method = type(tokenizer).apply_chat_template
        self.signature = inspect.signature(self.method)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            called = self.signature.bind_partial(self.tokenizer, *args, **kwargs).arguments
        except TypeError:  # let transformers report the bad call
            return self.method(self.tokenizer, *args, **kwargs)
        extra = called.get("kwargs", {})
        chosen = any(name in called or name in extra for name in ("return_dict", "return_tensors"))
        if not called.get("tokenize", True) or chosen:
            return self.method(self.tokenizer, *args, **kwargs)
        return _as_chat_ids(self.method(self.tokenizer, *args, **kwargs, return_dict=False))


def keep_transformers4_chat_ids(tokenizer: Any) -> Any:
    """`tokenizer`, whose ``apply_chat_template`` now answers a plain tokenizing call with
    `ChatTokenIds` (a no-op where the tokenizer's method has no ``return_dict``: transformers 4)."""
    method = getattr(type(tokenizer), "apply_chat_template", None)
    if method is None or "return_dict" not in inspect.signature(method).parameters:
        return tokenizer
    tokenizer.apply_chat_template = _ChatTemplateAsIds(tokenizer)
    return tokenizer
