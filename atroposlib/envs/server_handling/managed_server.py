"""`ManagedServer`: chat and completion calls that also record trainer-ready sequences.

Each completion becomes a `SequenceNode`: the prompt and completion token ids, a label
mask (``-100`` on prompt positions, the token id on completion positions) and the
sampler's logprobs (``1.0`` on prompt positions). A multi-turn conversation extends its
earlier node: the new prompt's ids start with that node's tokens, so earlier completions
stay trainable and only the new user/tool text is masked. Environments copy ``tokens``,
``masked_tokens`` and ``logprobs`` into ``tokens``, ``masks`` and ``inference_logprobs``.

A node also says how it was sampled, in ``metadata["generation_params"]`` (the sampling
parameters the request set) and ``metadata["policy_version"]`` (the version the server
reported), each only when known, and is added to the open sampling record with its token
ids, so the group of a rollout built from it is stamped with them. A node extended over
several turns has the parameters of its last turn and the oldest version of its turns
(unknown when one turn's is).
"""

from __future__ import annotations

import copy
import logging
import time
import uuid
from typing import Any, Optional

from openai.types import Completion, CompletionChoice
from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from pydantic import BaseModel

from atroposlib.envs.server_handling.sampling_record import (
    SampledCompletion,
    oldest,
    record_completion,
    recording,
    sampling_params,
)
from atroposlib.envs.server_handling.tool_call_translator import ToolCallTranslator
from atroposlib.policy_version import POLICY_VERSION_KEY
from atroposlib.utils.tokenize_for_trainer import token_ids

log = logging.getLogger("atroposlib.inference")

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
THINK_OPEN_MARK, THINK_CLOSE_MARK = "__MNGD_THINK__", "__MNGD_ENDTHINK__"
GENERATION_PARAMS = "generation_params"


def _has_chat_template(tokenizer: Any) -> bool:
    """Whether `tokenizer` renders chats: Hugging Face tokenizers say so in ``chat_template``
    (None without one); other objects with ``apply_chat_template`` are trusted to."""
    if not hasattr(tokenizer, "apply_chat_template"):
        return False
    return getattr(tokenizer, "chat_template", "own") is not None


def sampling_metadata(sampled: SampledCompletion) -> dict[str, Any]:
    """A node's ``generation_params`` and ``policy_version`` metadata, each only when known."""
    metadata: dict[str, Any] = {}
    if sampled.params:
        metadata[GENERATION_PARAMS] = dict(sampled.params)
    if sampled.version is not None:
        metadata[POLICY_VERSION_KEY] = sampled.version
    return metadata


class SequenceNode(BaseModel):
    """One tracked sequence: prompt plus completion, with labels and logprobs per token."""

    full_text: str
    tokens: list[int]
    masked_tokens: list[int]
    logprobs: list[float]
    metadata: Optional[dict[str, Any]] = None


class ManagedServer:
    """Wraps a token-level server (`tokens_and_logprobs_completion`) and tracks nodes."""

    def __init__(self, server: Any, tokenizer: Any = None, track_tree: bool = False,
                 tool_parser: Optional[str] = None, preserve_think_blocks: bool = False) -> None:
        self.server = server
        self.tokenizer = tokenizer or getattr(server, "tokenizer", None)
        if self.tokenizer is None:
            raise ValueError("ManagedServer needs a tokenizer (pass tokenizer=..., e.g. self.tokenizer)")
        self.track_tree = track_tree
        self.tool_parser = tool_parser
        self.preserve_think_blocks = preserve_think_blocks
        self.current_nodes: list[SequenceNode] = []
        self.sequences: dict[str, SequenceNode] = {}
        self._warned_tools = False
        self.translator = ToolCallTranslator(self.tokenizer, tool_parser) if tool_parser else None

    # -- state ---------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        if self.track_tree:
            return {"sequences": copy.deepcopy(self.sequences), "tree": copy.deepcopy(self.sequences)}
        return {"nodes": copy.deepcopy(self.current_nodes)}

    def reset(self) -> None:
        self.current_nodes.clear()
        self.sequences.clear()

    # -- prompts -----------------------------------------------------------------------------
    def _get_translator(self) -> Optional[ToolCallTranslator]:
        """The tool-call translator (None without a tool parser)."""
        return self.translator

    def render(self, messages: list[dict[str, Any]], tools: Any = None) -> str:
        """The prompt text of `messages` under the tokenizer's chat template; assistant
        messages that made tool calls are replayed as the model's raw text."""
        if self.translator is not None:
            messages = self.translator.convert_messages_for_template(messages)
        replayed = [self._mark_think(m) for m in messages]
        add_generation_prompt = not messages or messages[-1].get("role") != "assistant"
        if _has_chat_template(self.tokenizer):
            kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
            if tools:
                kwargs["tools"] = tools
            prompt = self.tokenizer.apply_chat_template(replayed, **kwargs)
        else:
            prompt = "\n".join(f"{m.get('role')}: {m.get('content')}" for m in replayed)
        return prompt.replace(THINK_OPEN_MARK, THINK_OPEN).replace(THINK_CLOSE_MARK, THINK_CLOSE)

    _convert_messages_to_prompt = render  # Atropos 0.4.0's name, used by its tests

    def _mark_think(self, message: dict[str, Any]) -> dict[str, Any]:
        if self.preserve_think_blocks or message.get("role") != "assistant" or not isinstance(message.get("content"), str):
            return message
        content = message["content"].replace(THINK_OPEN, THINK_OPEN_MARK).replace(THINK_CLOSE, THINK_CLOSE_MARK)
        return {**message, "content": content}

    def _encode(self, text: str, special: bool) -> list[int]:
        return token_ids(self.tokenizer.encode(text, add_special_tokens=special))

    def _extending_node(self, prompt: str) -> tuple[Optional[SequenceNode], list[int]]:
        """The node this prompt continues (token-prefix match) and the prompt's ids."""
        if self.track_tree:
            parent = self.sequences.get(prompt)
            return parent, list(parent.tokens) if parent else self._encode(prompt, True)
        for node in self.current_nodes:
            if prompt.startswith(node.full_text):
                suffix = prompt[len(node.full_text):]
                return node, list(node.tokens) + (self._encode(suffix, False) if suffix else [])
        return None, self._encode(prompt, True)

    # -- calls ----------------------------------------------------------------------------------
    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        messages = kwargs.pop("messages")
        tools = kwargs.pop("tools", None)
        tool_choice = kwargs.pop("tool_choice", "auto")
        if tools and self.translator is None and not self._warned_tools:
            log.warning("tools are rendered into the prompt, but no tool parser is configured to read calls back")
            self._warned_tools = True
        prompt = self.render(messages, tools)
        texts, reasons = await self._generate(prompt, kwargs, skip_special=not tools)
        choices = []
        for i, text in enumerate(texts):
            message = ChatCompletionMessage(role="assistant", content=text)
            reason = reasons[i]
            if self.translator is not None and tools:
                content, calls, parsed_reason = self.translator.parse_model_output(text, tool_choice, tools)
                if calls:
                    message = ChatCompletionMessage(role="assistant", content=content)
                    # OpenAI-shaped dicts, as Atropos returns them (assigned: validation would make models)
                    message.tool_calls = [call.model_dump() for call in calls]  # type: ignore[assignment]
                    reason = parsed_reason
            choices.append(Choice(index=i, finish_reason=reason, message=message))
        return ChatCompletion(id=f"chatcmpl-{uuid.uuid4().hex}", object="chat.completion", created=int(time.time()),
                              model=self._model(), choices=choices)

    async def completion(self, **kwargs: Any) -> Completion:
        prompt = str(kwargs.pop("prompt"))
        texts, reasons = await self._generate(prompt, kwargs, skip_special=True)
        choices = [CompletionChoice(index=i, finish_reason=reasons[i], text=texts[i]) for i in range(len(texts))]
        return Completion(id=f"cmpl-{uuid.uuid4().hex}", object="text_completion", created=int(time.time()),
                          model=self._model(), choices=choices)

    async def get_logprobs(self, **kwargs: Any) -> Any:
        if "messages" in kwargs:
            kwargs["prompt"] = self.render(kwargs.pop("messages"))
        if not hasattr(self.server, "get_logprobs"):
            raise NotImplementedError(f"{type(self.server).__name__} does not implement get_logprobs")
        return await self.server.get_logprobs(**kwargs)

    def _model(self) -> str:
        return getattr(getattr(self.server, "config", None), "model_name", "managed")

    async def _generate(self, prompt: str, kwargs: dict[str, Any], skip_special: bool) -> tuple[list[str], list[str]]:
        extending, input_ids = self._extending_node(prompt)
        kwargs.setdefault("model", self._model())
        # a record of its own: the server's entry would not say which node it made, the node's does
        with recording() as answered:
            _, outputs, logprobs, finish_reasons = await self.server.tokens_and_logprobs_completion(
                prompt=prompt, input_ids=input_ids, **kwargs
            )
        sampled = self._sampled(extending, SampledCompletion(
            sampling_params(kwargs), oldest(c.version for c in answered.completions)))
        texts, reasons = [], []
        for i, completion in enumerate(outputs):
            reason = finish_reasons[i] if i < len(finish_reasons) else "stop"
            reason = getattr(reason, "type", reason) or "stop"
            text = self.tokenizer.decode(completion, skip_special_tokens=skip_special)
            completion_logprobs = (list(logprobs[i]) + [1.0] * len(completion))[: len(completion)]
            node = self._node(prompt, input_ids, extending, completion, completion_logprobs, text, reason, sampled)
            record_completion(sampled.params, sampled.version, node.tokens)
            self._store(node, extending, first=(i == 0))
            texts.append(text)
            reasons.append(reason)
        return texts, reasons

    def _node(self, prompt: str, input_ids: list[int], extending: Optional[SequenceNode], completion: list[int],
              completion_logprobs: list[float], text: str, reason: str, sampled: SampledCompletion) -> SequenceNode:
        if extending is not None and not self.track_tree:
            new_prompt = len(input_ids) - len(extending.tokens)
            masks = list(extending.masked_tokens) + [-100] * new_prompt + list(completion)
            logprobs = list(extending.logprobs) + [1.0] * new_prompt + completion_logprobs
        else:
            masks = [-100] * len(input_ids) + list(completion)
            logprobs = [1.0] * len(input_ids) + completion_logprobs
        return SequenceNode(full_text=prompt + text, tokens=list(input_ids) + list(completion),
                            masked_tokens=masks, logprobs=logprobs,
                            metadata={"finish_reason": reason, **sampling_metadata(sampled)})

    def _sampled(self, extending: Optional[SequenceNode], turn: SampledCompletion) -> SampledCompletion:
        """How the nodes `turn` makes were sampled: with its parameters; an extended node
        keeps its earlier turns trainable, so it is as old as the oldest of them."""
        if extending is None or self.track_tree:
            return turn
        earlier = (extending.metadata or {}).get(POLICY_VERSION_KEY)
        return SampledCompletion(turn.params, oldest([turn.version, earlier]))

    def _store(self, node: SequenceNode, extending: Optional[SequenceNode], first: bool) -> None:
        if self.track_tree:
            self.sequences[node.full_text] = node
            return
        if first and extending is not None:
            for index, existing in enumerate(self.current_nodes):
                if existing is extending:
                    self.current_nodes[index] = node
                    return
        self.current_nodes.append(node)


class DummyManagedServer:
    """For OpenAI endpoints, which return no token ids: real answers, nodes of dummy tokens.
    Never train on its nodes."""

    def __init__(self, server: Any, tokenizer: Any = None, track_tree: bool = False) -> None:
        self.server = server
        self.tokenizer = tokenizer
        self.current_nodes: list[SequenceNode] = []

    def _dummy_node(self, text: str, reason: str) -> SequenceNode:
        return SequenceNode(full_text=text, tokens=list(range(128)), masked_tokens=[-100, *range(1, 128)],
                            logprobs=[-0.5] * 128, metadata={"finish_reason": reason, "dummy_tokens": True})

    async def chat_completion(self, **kwargs: Any) -> Any:
        response = await self.server.chat_completion(**kwargs)
        rendered = "\n\n".join(f"{m.get('role')}:{m.get('content')}" for m in kwargs.get("messages", []))
        for choice in response.choices:
            self.current_nodes.append(self._dummy_node(f"{rendered}\n\nassistant:{choice.message.content}",
                                                        choice.finish_reason or "stop"))
        return response

    async def completion(self, **kwargs: Any) -> Any:
        response = await self.server.completion(**kwargs)
        for choice in response.choices:
            self.current_nodes.append(self._dummy_node(str(kwargs.get("prompt", "")) + choice.text,
                                                        choice.finish_reason or "stop"))
        return response

    async def get_logprobs(self, **kwargs: Any) -> Any:
        raise NotImplementedError("OpenAI endpoints do not return prompt logprobs")

    def get_state(self) -> dict[str, Any]:
        return {"nodes": copy.deepcopy(self.current_nodes)}

    def reset(self) -> None:
        self.current_nodes.clear()


class ManagedServerAdapter:
    """An AsyncOpenAI look-alike over a managed server, for third-party libraries."""

    class _Endpoint:
        def __init__(self, create: Any) -> None:
            self.create = create

    def __init__(self, managed_server: Any, base_url: str) -> None:
        self.base_url = base_url
        self.chat = type("Chat", (), {})()
        self.chat.completions = self._Endpoint(managed_server.chat_completion)
        self.completions = self._Endpoint(managed_server.completion)

    def post(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("ManagedServerAdapter supports chat.completions.create and completions.create only")

    def copy(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("ManagedServerAdapter cannot be copied")
