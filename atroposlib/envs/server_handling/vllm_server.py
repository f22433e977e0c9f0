"""`VLLMServer`: a vLLM server, with token-level generation through its ``/generate`` route.

Chat and text completions use the OpenAI routes. `tokens_and_logprobs_completion` sends
token ids and returns the sampled ids with their logprobs; `get_logprobs` scores a
prompt's tokens (``prompt_logprobs``), e.g. for teacher distillation.
"""

from __future__ import annotations

from typing import Any, Optional

import httpx

from atroposlib.envs.server_handling.api_server import root_url
from atroposlib.envs.server_handling.configs import APIServerConfig
from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.reasoning import ReasoningConfig
from atroposlib.envs.server_handling.resolve import resolve_openai_configs
from atroposlib.utils.tokenize_for_trainer import token_ids

__all__ = ["APIServerConfig", "VLLMServer", "resolve_openai_configs"]


def _position(entry: Any) -> tuple[list[int], list[float]]:
    """One position's ``{id: logprob}`` object(s) as parallel id and logprob lists."""
    objects = entry if isinstance(entry, list) else [entry]
    ids, logprobs = [], []
    for obj in objects:
        for token, value in (obj or {}).items():
            ids.append(int(token))
            logprobs.append(float(value["logprob"] if isinstance(value, dict) else value))
    return ids, logprobs


class VLLMServer(OpenAIServer):
    """OpenAI routes for chat and completions, ``/generate`` for tokens and logprobs."""

    def __init__(self, config: APIServerConfig, reasoning_config: Optional[ReasoningConfig] = None) -> None:
        super().__init__(config, reasoning_config)
        from transformers import AutoTokenizer

        name = config.model_name if config.tokenizer_name == "none" else config.tokenizer_name
        self.tokenizer = AutoTokenizer.from_pretrained(name)
        self.http = httpx.AsyncClient(timeout=config.timeout)

    def _prompt_ids(self, kwargs: dict[str, Any], dedupe_bos: bool = True) -> list[int]:
        if kwargs.get("input_ids") is not None:
            kwargs.pop("prompt", None)
            return list(kwargs.pop("input_ids"))
        kwargs.pop("input_ids", None)
        ids = token_ids(self.tokenizer.encode(kwargs.pop("prompt")))
        bos = self.tokenizer.bos_token_id
        if dedupe_bos and bos is not None and len(ids) > 1 and ids[0] == ids[1] == bos:
            ids = ids[1:]
        return ids

    async def _generate(self, body: dict[str, Any]) -> dict[str, Any]:
        response = await self.http.post(f"{root_url(self.config.base_url or '')}/generate", json=body,
                                        headers=self._auth_headers())
        response.raise_for_status()
        return response.json()

    async def _tokens_and_logprobs_completion_wrapper(self, **kwargs: Any) -> Any:
        ids = self._prompt_ids(kwargs)
        for alias in ("max_new_tokens", "max_completion_tokens"):
            if alias in kwargs:
                kwargs["max_tokens"] = kwargs.pop(alias)
        kwargs.pop("model", None)
        result = await self._generate({"prompt": {"prompt_token_ids": ids}, "logprobs": 0, **kwargs})
        outputs, logprobs = [], []
        for choice in result["logprobs"]:
            parsed = [_position(position) for position in choice]
            outputs.append([p[0][0] for p in parsed])
            logprobs.append([p[1][0] for p in parsed])
        return ids, outputs, logprobs, list(result.get("finish_reasons", []))

    async def _get_logprobs_wrapper(self, **kwargs: Any) -> Any:
        top_k = max(1, int(kwargs.pop("top_k", kwargs.pop("top_logprobs", 1)) or 1))
        text_prompt = kwargs.get("input_ids") is None
        ids = self._prompt_ids(kwargs, dedupe_bos=text_prompt)
        kwargs.pop("model", None)
        body = {"prompt": {"prompt_token_ids": ids}, "prompt_logprobs": top_k, "n": 1, "temperature": 0.0,
                "top_p": 1.0, "max_tokens": kwargs.pop("max_tokens", 1), **kwargs}
        result = await self._generate(body)
        if "prompt_logprobs" not in result:
            raise ValueError("the vLLM server returned no prompt_logprobs (does it support them?)")
        positions = result["prompt_logprobs"]
        if positions and isinstance(positions[0], list) and positions[0] and isinstance(positions[0][0], list):
            positions = positions[0]
        parsed = [_position(p) if p is not None else ([], []) for p in positions]
        return {"prompt_tokens": ids, "prompt_topk_token_ids": [p[0] for p in parsed],
                "prompt_topk_logprobs": [p[1] for p in parsed]}

    async def close(self) -> None:
        await super().close()
        await self.http.aclose()
