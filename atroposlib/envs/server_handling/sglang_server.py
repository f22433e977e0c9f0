"""`SGLangServer`: an SGLang server, with token-level generation through its ``/generate``."""

from __future__ import annotations

from typing import Any

from atroposlib.envs.server_handling.configs import APIServerConfig
from atroposlib.envs.server_handling.resolve import resolve_openai_configs
from atroposlib.envs.server_handling.vllm_server import VLLMServer

__all__ = ["APIServerConfig", "SGLangServer", "resolve_openai_configs"]


class SGLangServer(VLLMServer):
    """OpenAI routes for chat and completions; SGLang's ``/generate`` for tokens and logprobs."""

    async def _tokens_and_logprobs_completion_wrapper(self, **kwargs: Any) -> Any:
        ids = self._prompt_ids(kwargs)
        if "max_tokens" in kwargs:
            kwargs["max_new_tokens"] = kwargs.pop("max_tokens")
        kwargs.pop("model", None)
        result = await self._generate(
            {"input_ids": ids, "sampling_params": kwargs, "return_logprob": True, "return_text_in_logprobs": False}
        )
        choices = result if isinstance(result, list) else [result]
        outputs = [[int(entry[1]) for entry in c["meta_info"]["output_token_logprobs"]] for c in choices]
        logprobs = [[float(entry[0]) for entry in c["meta_info"]["output_token_logprobs"]] for c in choices]
        reasons = [c["meta_info"].get("finish_reason") for c in choices]
        return ids, outputs, logprobs, reasons

    async def _get_logprobs_wrapper(self, **kwargs: Any) -> Any:
        raise NotImplementedError("prompt scoring is not implemented for SGLang servers yet")
