"""`VLLMServer`: a vLLM server, with token-level generation and prompt scoring.

Chat and text completions use the OpenAI routes. `tokens_and_logprobs_completion` sends
token ids and returns the sampled ids with their logprobs; `get_logprobs` scores a
prompt's tokens (``prompt_logprobs``), e.g. for teacher distillation. Both use the
``/generate`` route of Atropos-style vLLM wrappers; a stock ``vllm serve`` has no such
route, so on a 404 the server switches to the OpenAI ``/completions`` route with token-id
prompts and ``return_token_ids`` (vLLM's own extension), which gives the same data.
Both routes report the policy version of their answers to the sampling record (the
``X-Atropos-Policy-Version`` header, or ``"policy_version"`` in a ``/generate`` answer).
"""

from __future__ import annotations

from typing import Any, Optional

import logging

import httpx

from atroposlib.envs.server_handling.api_server import root_url
from atroposlib.envs.server_handling.configs import APIServerConfig
from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.reasoning import ReasoningConfig
from atroposlib.envs.server_handling.resolve import resolve_openai_configs
from atroposlib.envs.server_handling.sampling_record import report_version, version_header
from atroposlib.envs.tokenizer_loading import TOKENIZER_FLAG, load_tokenizer
from atroposlib.policy_version import POLICY_VERSION_KEY
from atroposlib.utils.tokenize_for_trainer import token_ids

__all__ = ["APIServerConfig", "VLLMServer", "resolve_openai_configs"]

log = logging.getLogger("atroposlib.inference")


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
        self.tokenizer_name = config.model_name if config.tokenizer_name == "none" else config.tokenizer_name
        self._tokenizer: Any = None
        self.http = httpx.AsyncClient(timeout=config.timeout)
        self.has_generate_route = True

    @property
    def tokenizer(self) -> Any:
        """The tokenizer of prompts sent as text, loaded when first needed: `managed_server()`
        sends token ids of its own, so an environment that uses it never loads this one."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.tokenizer_name, flag=TOKENIZER_FLAG)
        return self._tokenizer

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

    async def _post(self, url: str, body: dict[str, Any]) -> httpx.Response:
        return await self.http.post(url, json=body, headers=self._auth_headers())

    async def _generate(self, body: dict[str, Any]) -> Optional[dict[str, Any]]:
        """The ``/generate`` answer, or None when the server has no such route."""
        if not self.has_generate_route:
            return None
        response = await self._post(f"{root_url(self.config.base_url or '')}/generate", body)
        if response.status_code == 404:
            if self.has_generate_route:  # concurrent first calls all land here; say it once
                log.info("%s has no /generate route: using /completions with return_token_ids", self.config.base_url)
            self.has_generate_route = False
            return None
        response.raise_for_status()
        answer = response.json()
        body_version = answer.get(POLICY_VERSION_KEY) if isinstance(answer, dict) else None
        report_version(version_header(response), body_version)
        return answer

    async def _openai_completion(self, ids: list[int], sampling: dict[str, Any]) -> dict[str, Any]:
        """vLLM's OpenAI ``/completions`` with a token-id prompt and token ids in the answer."""
        extra = sampling.pop("extra_body", None) or {}
        body = {**sampling, **extra, "model": self.config.model_name, "prompt": ids, "return_token_ids": True}
        response = await self._post(f"{(self.config.base_url or '').rstrip('/')}/completions", body)
        response.raise_for_status()
        report_version(version_header(response))
        return response.json()

    @staticmethod
    def _normalise_sampling(kwargs: dict[str, Any]) -> dict[str, Any]:
        for alias in ("max_new_tokens", "max_completion_tokens"):
            if alias in kwargs:
                kwargs["max_tokens"] = kwargs.pop(alias)
        kwargs.pop("model", None)
        return kwargs

    async def _tokens_and_logprobs_completion_wrapper(self, **kwargs: Any) -> Any:
        ids = self._prompt_ids(kwargs)
        sampling = self._normalise_sampling(kwargs)
        result = await self._generate({"prompt": {"prompt_token_ids": ids}, "logprobs": 0, **sampling})
        if result is None:
            answer = await self._openai_completion(ids, {**sampling, "logprobs": 0})
            choices = sorted(answer["choices"], key=lambda c: c["index"])
            return (ids, [list(c["token_ids"]) for c in choices],
                    [list(c["logprobs"]["token_logprobs"]) for c in choices],
                    [c.get("finish_reason") or "stop" for c in choices])
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
        sampling = {"n": 1, "temperature": 0.0, "top_p": 1.0, "max_tokens": kwargs.pop("max_tokens", 1),
                    **self._normalise_sampling(kwargs), "prompt_logprobs": top_k}
        result = await self._generate({"prompt": {"prompt_token_ids": ids}, **sampling})
        if result is None:
            result = (await self._openai_completion(ids, sampling))["choices"][0]
        if result.get("prompt_logprobs") is None:
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
