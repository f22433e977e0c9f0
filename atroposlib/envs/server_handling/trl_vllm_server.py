"""`TrlVllmServer`: TRL's ``vllm-serve``, which returns completion token ids only.

A policy version in the answer's ``X-Atropos-Policy-Version`` header reaches the sampling
record, as with the other backends.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Optional

import aiohttp
from openai.types import Completion, CompletionChoice
from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from transformers import AutoTokenizer

from atroposlib.envs.server_handling.api_server import APIServer
from atroposlib.envs.server_handling.configs import APIServerConfig
from atroposlib.envs.server_handling.reasoning import ReasoningConfig
from atroposlib.envs.server_handling.sampling_record import report_version, version_header
from atroposlib.envs.tokenizer_loading import TOKENIZER_FLAG, TokenizerUnavailable, fix_hint

SAMPLING_DEFAULTS = {"repetition_penalty": 1.0, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                     "max_tokens": 1024}


class TrlVllmServer(APIServer):
    """Completions through ``POST {base_url}/generate/``; chats rendered with the chat template."""

    def __init__(self, config: APIServerConfig, reasoning_config: Optional[ReasoningConfig] = None) -> None:
        super().__init__(config, reasoning_config)
        name = config.tokenizer_name if config.tokenizer_name != "none" else config.model_name
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(name)
        except OSError as exc:  # transformers' "not found" errors: one line naming the flag
            raise TokenizerUnavailable(f"cannot load tokenizer {name!r} ({str(exc).splitlines()[0][:200]}); "
                                       f"{fix_hint(TOKENIZER_FLAG)}") from None

    async def _probe_health(self, client: Any) -> bool:
        return True

    async def _sample(self, prompt: str, kwargs: dict[str, Any]) -> tuple[list[str], list[str]]:
        body = {"prompts": [prompt], "n": int(kwargs.get("n") or 1),
                **{k: kwargs.get(k, default) for k, default in SAMPLING_DEFAULTS.items()}}
        url = f"{(self.config.base_url or '').rstrip('/')}/generate/"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.config.timeout)) as session:
            async with session.post(url, json=body, raise_for_status=True) as response:
                payload = await response.json()
                report_version(version_header(response))
        eos = self.tokenizer.eos_token_id
        texts, reasons = [], []
        for ids in payload["completion_ids"]:
            texts.append(self.tokenizer.decode(ids, skip_special_tokens=True))
            reasons.append("stop" if eos in ids else "length")
        return texts, reasons

    async def _completion_wrapper(self, **kwargs: Any) -> Completion:
        texts, reasons = await self._sample(str(kwargs.get("prompt", "")), kwargs)
        choices = [CompletionChoice(index=i, text=t, finish_reason=r) for i, (t, r) in enumerate(zip(texts, reasons))]
        return Completion(id=f"cmpl-{uuid.uuid4().hex}", object="text_completion", created=int(time.time()),
                          model=self.config.model_name, choices=choices)

    async def _chat_completion_wrapper(self, **kwargs: Any) -> ChatCompletion:
        prompt = self.tokenizer.apply_chat_template(kwargs["messages"], tokenize=False, add_generation_prompt=True)
        texts, reasons = await self._sample(prompt, kwargs)
        choices = [Choice(index=i, finish_reason=r, message=ChatCompletionMessage(role="assistant", content=t))
                   for i, (t, r) in enumerate(zip(texts, reasons))]
        return ChatCompletion(id=f"chatcmpl-{uuid.uuid4().hex}", object="chat.completion", created=int(time.time()),
                              model=self.config.model_name, choices=choices)
