"""`ServerHarness`: a scripted stand-in for an inference server, for offline tests.

Tests tell it what to answer for given messages, prompts or token requests; unknown
requests raise `KeyError` naming the request, unless a default response is set.
``--testing`` (``ServerManager(testing=True)``) runs environments against a harness whose
default answer is `TESTING_RESPONSE`, so serve and process modes run without a model.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from openai.types import Completion, CompletionChoice
from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice

from atroposlib.envs.server_handling.configs import APIServerConfig
from atroposlib.envs.server_handling.semaphore import AsyncSemWithAdaptiveWeight

TESTING_RESPONSE = "This is a test response from the atroposlib testing harness."

PerChoice = Union[str, Sequence[str]]


def _per_choice(value: PerChoice, n: int) -> list[str]:
    return [value] * n if isinstance(value, str) else list(value)


def create_chat_completion(resp: PerChoice, n: int = 1, finish_reason: PerChoice = "stop") -> ChatCompletion:
    """A `ChatCompletion` with `n` assistant choices (`resp`/`finish_reason`: one value or one per choice)."""
    texts, reasons = _per_choice(resp, n), _per_choice(finish_reason, n)
    choices = [
        Choice(index=i, finish_reason=reasons[i], message=ChatCompletionMessage(role="assistant", content=texts[i]))
        for i in range(n)
    ]
    return ChatCompletion(id="test_id", object="chat.completion", created=0, model="test_model", choices=choices)


def create_completion(resp: PerChoice, n: int = 1, finish_reason: PerChoice = "stop") -> Completion:
    """A `Completion` with `n` choices."""
    texts, reasons = _per_choice(resp, n), _per_choice(finish_reason, n)
    choices = [CompletionChoice(index=i, finish_reason=reasons[i], text=texts[i]) for i in range(n)]
    return Completion(id="test_id", object="text_completion", created=0, model="test_model", choices=choices)


def messages_key(messages: Sequence[dict[str, Any]]) -> str:
    return "\n".join(f"role:{m.get('role')}\ncontent:{m.get('content')}" for m in messages)


class ServerHarness:
    """Answers chat, completion, token and logprob requests from maps set by tests."""

    def __init__(self, tokenizer: Any = None) -> None:
        self.config = APIServerConfig(model_name="test_model", base_url=None, health_check=False)
        self.tokenizer = tokenizer
        self.server_healthy = True
        self.check_task = None
        self.sem = AsyncSemWithAdaptiveWeight(self.config.num_max_requests_at_once)
        self.eval_sem = AsyncSemWithAdaptiveWeight(self.config.num_requests_for_eval)
        self.response_map: dict[str, Any] = {}
        self.tokens_and_logprobs_map: dict[str, Any] = {}
        self.logprobs_map: dict[str, Any] = {}
        self.default_response: Optional[str] = None

    def set_desired_response(self, messages: Sequence[dict[str, Any]], chat_completion: ChatCompletion) -> None:
        self.response_map[messages_key(messages)] = chat_completion

    def set_desired_completion(self, prompt: str, completion: Completion) -> None:
        self.response_map[prompt] = completion

    def set_tokens_and_logprobs_response(
        self, prompt: str, prompt_tokens: list[int], output_tokens_list: list[list[int]],
        output_logprobs_list: list[list[float]], finish_reasons: list[str],
    ) -> None:
        self.tokens_and_logprobs_map[prompt] = (prompt_tokens, output_tokens_list, output_logprobs_list, finish_reasons)

    def set_logprobs_response(self, prompt: str, response: dict[str, Any]) -> None:
        self.logprobs_map[prompt] = response

    def set_default_response(self, text: Optional[str]) -> None:
        """Answer unknown chat and completion requests with `text` (None: raise KeyError)."""
        self.default_response = text

    def _lookup(self, table: dict[str, Any], key: str, kind: str) -> Any:
        if key in table:
            return table[key]
        raise KeyError(f"the testing harness has no {kind} response for {key!r}")

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        key = messages_key(kwargs.get("messages", []))
        if key not in self.response_map and self.default_response is not None:
            return create_chat_completion(self.default_response, n=int(kwargs.get("n") or 1))
        return self._lookup(self.response_map, key, "chat")

    async def completion(self, **kwargs: Any) -> Completion:
        prompt = str(kwargs.get("prompt", ""))
        if prompt not in self.response_map and self.default_response is not None:
            return create_completion(self.default_response, n=int(kwargs.get("n") or 1))
        return self._lookup(self.response_map, prompt, "completion")

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> Any:
        prompt = str(kwargs.get("prompt", ""))
        if prompt not in self.tokens_and_logprobs_map and self.default_response is not None and self.tokenizer:
            # the default text as token ids, each with logprob -1 (a stand-in: never train on it)
            answer = list(self.tokenizer.encode(self.default_response, add_special_tokens=False))
            n = int(kwargs.get("n") or 1)
            return list(kwargs.get("input_ids") or []), [answer] * n, [[-1.0] * len(answer)] * n, ["stop"] * n
        return self._lookup(self.tokens_and_logprobs_map, prompt, "tokens-and-logprobs")

    async def get_logprobs(self, **kwargs: Any) -> Any:
        if not self.logprobs_map:
            raise NotImplementedError("ServerHarness does not implement get_logprobs until answers are scripted "
                                      "with set_logprobs_response(prompt, response)")
        return self._lookup(self.logprobs_map, str(kwargs.get("prompt", "")), "logprobs")

    def update_weight(self, weight: float) -> None:
        self.sem.update_weight(weight)
        self.eval_sem.update_weight(weight)

    def wandb_metrics(self, metrics_dict: Optional[dict[str, float]] = None, server_name: Optional[str] = None) -> dict[str, float]:
        return metrics_dict if metrics_dict is not None else {}

    async def _probe_health(self, client: Any) -> bool:
        return True

    async def close(self) -> None:
        return None
