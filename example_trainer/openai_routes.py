"""The bundled vLLM server's OpenAI routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``.

They answer the ``openai`` client and the environments' ``OpenAIServer``/``VLLMServer``
(``server_type: vllm``) on the same engine, adapter and API key as ``/generate``. A chat
request's messages go through the served model's chat template (generation prompt added,
``chat_template_kwargs`` passed on); a completion's prompt is text or token ids. Sampling
fields map to vLLM's ``SamplingParams``; without ``max_tokens`` a completion may fill the
context. ``logprobs`` (chat: ``logprobs``/``top_logprobs``; completions: a count) come in
OpenAI's shapes, and ``return_token_ids`` (vLLM's extension) adds the choices' and the
prompt's token ids. Streaming is refused with 400. Unknown fields are refused with 422;
``user``, ``reasoning_effort`` and ``reasoning`` are accepted and have no effect (the served
model's template decides about reasoning).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Literal, Optional, Union

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from vllm.exceptions import VLLMClientError
from vllm.lora.request import LoRARequest
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.utils import random_uuid
from vllm.v1.engine.async_llm import AsyncLLM

CLIENT_CLOSED = 499  # nginx's code for "client closed the request", as Atropos answers
# the request fields that are vLLM sampling parameters of the same name and meaning
VLLM_SAMPLING_FIELDS = ("n", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
                        "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens", "ignore_eos",
                        "skip_special_tokens", "include_stop_str_in_output")


@dataclass(frozen=True)
class EngineHooks:
    """What the routes take from the server: its engine, its active adapter, and how it runs a
    request to its end (None when the client hung up, 400 for the request's own faults)."""

    engine: Callable[[], AsyncLLM]
    adapter: Callable[[], Optional[LoRARequest]]
    final_output: Callable[[Request, AsyncIterator[RequestOutput]], Awaitable[Optional[RequestOutput]]]


class SamplingFields(BaseModel):
    """The fields both routes share; ``None`` leaves vLLM's default."""

    model_config = ConfigDict(extra="forbid")

    model: Optional[str] = None
    n: int = Field(1, ge=1)
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0)
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    min_tokens: Optional[int] = None
    ignore_eos: Optional[bool] = None
    skip_special_tokens: Optional[bool] = None
    include_stop_str_in_output: Optional[bool] = None
    return_token_ids: bool = False
    stream: bool = False
    user: Optional[str] = None
    reasoning_effort: Optional[str] = None
    reasoning: Optional[dict[str, Any]] = None

    @field_validator("stream")
    @classmethod
    def _not_streamed(cls, stream: bool) -> bool:
        if stream:
            raise ValueError("streaming is not supported by this server: send stream=false")
        return stream

    def sampling(self, logprobs: Optional[int], default_max_tokens: int) -> SamplingParams:
        passed = self.model_dump(include=set(VLLM_SAMPLING_FIELDS), exclude_none=True)
        passed.setdefault("max_tokens", default_max_tokens)
        try:
            return SamplingParams(**passed, logprobs=logprobs, output_kind=RequestOutputKind.FINAL_ONLY)
        except (TypeError, ValueError, VLLMClientError) as exc:
            raise HTTPException(status_code=400, detail=f"bad sampling parameters: {exc}") from exc


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message; keys beyond role and content (name, tool_calls, ...) reach the template as given."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: Optional[Union[str, list[TextPart]]] = None

    def for_template(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        return {**self.model_dump(exclude={"content"}), "content": content}


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_length_limit(self) -> "ChatCompletionRequest":
        if self.max_tokens is None:
            self.max_tokens = self.max_completion_tokens
        return self


class CompletionRequest(SamplingFields):
    prompt: Union[str, list[int], list[str], list[list[int]]] = Field(
        description="text or token ids; a list holding one of these is accepted too")
    logprobs: Optional[int] = Field(None, ge=0, le=20)

    def single_prompt(self) -> Union[str, list[int]]:
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise HTTPException(status_code=400, detail="one prompt per request: send a batch as separate requests")
            prompt = prompt[0]
        if not prompt:
            raise HTTPException(status_code=400, detail='"prompt" is empty')
        return prompt


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Optional[str]
    logprobs: Optional[dict[str, Any]] = None
    token_ids: Optional[list[int]] = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: Optional[str]
    logprobs: Optional[dict[str, Any]] = None
    token_ids: Optional[list[int]] = None
    prompt_token_ids: Optional[list[int]] = None


class ChatCompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: f"chatcmpl-{random_uuid()}")
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: Optional[list[int]] = None


class CompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: f"cmpl-{random_uuid()}")
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage


def _served_name(engine: AsyncLLM) -> str:
    config = engine.model_config
    return str(getattr(config, "served_model_name", None) or config.model)


def _check_model(engine: AsyncLLM, adapter: Any, model: Optional[str]) -> None:
    """404 for a request naming a model this server does not serve (its served name, the model
    folder it loaded, or the LoRA adapter it holds), as vLLM's own server answers."""
    names = {_served_name(engine), str(engine.model_config.model)} | ({adapter.lora_name} if adapter else set())
    if model and model not in names:
        raise HTTPException(status_code=404, detail=f"the model {model!r} is not served here; this server serves "
                                                    f"{', '.join(sorted(names))} (GET /v1/models)")


def _token_text(engine: AsyncLLM, token: int, value: Any) -> str:
    decoded = getattr(value, "decoded_token", None)
    return decoded if decoded is not None else engine.tokenizer.decode([token])


def _ranked(engine: AsyncLLM, position: dict[int, Any], top: int) -> list[tuple[str, float]]:
    """A position's ``top`` most likely tokens, best first, as (text, logprob)."""
    best = sorted(position.items(), key=lambda item: item[1].rank if item[1].rank is not None else 0)
    return [(_token_text(engine, token, value), value.logprob) for token, value in best[:top]]


def _chat_logprobs(engine: AsyncLLM, choice: CompletionOutput, top: int) -> dict[str, Any]:
    content = []
    for token, position in zip(choice.token_ids, choice.logprobs or []):
        text = _token_text(engine, token, position[token])
        content.append({"token": text, "logprob": position[token].logprob, "bytes": list(text.encode()),
                        "top_logprobs": [{"token": name, "logprob": logprob, "bytes": list(name.encode())}
                                         for name, logprob in _ranked(engine, position, top)]})
    return {"content": content}


def _completion_logprobs(engine: AsyncLLM, choice: CompletionOutput, top: int) -> dict[str, Any]:
    tokens, token_logprobs, tops, offsets, offset = [], [], [], [], 0
    for token, position in zip(choice.token_ids, choice.logprobs or []):
        text = _token_text(engine, token, position[token])
        tokens.append(text)
        token_logprobs.append(position[token].logprob)
        tops.append(dict(_ranked(engine, position, top)))
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def _usage(output: RequestOutput) -> Usage:
    prompt = len(output.prompt_token_ids or [])
    completion = sum(len(choice.token_ids) for choice in output.outputs)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def _default_max_tokens(engine: AsyncLLM, prompt_ids: list[int]) -> int:
    """Whatever room the context leaves (the engine refuses a prompt that fills it)."""
    return max(1, int(engine.model_config.max_model_len) - len(prompt_ids))


def _chat_prompt_ids(engine: AsyncLLM, body: ChatCompletionRequest) -> list[int]:
    messages = [message.for_template() for message in body.messages]
    try:
        text = engine.tokenizer.apply_chat_template(
            messages, add_generation_prompt=body.add_generation_prompt, tokenize=False, **body.chat_template_kwargs)
    except Exception as exc:  # the template's own checks (role order, missing fields) judge the request
        raise HTTPException(status_code=400, detail=f"the chat template refused the messages: {exc}") from exc
    # the template writes the special tokens itself
    return list(engine.tokenizer.encode(text, add_special_tokens=False))


def _completion_prompt_ids(engine: AsyncLLM, prompt: Union[str, list[int]]) -> list[int]:
    if isinstance(prompt, str):
        return list(engine.tokenizer.encode(prompt))
    return list(prompt)


def openai_router(hooks: EngineHooks) -> APIRouter:
    """The ``/v1`` routes, on the engine and adapter ``hooks`` give."""
    router = APIRouter(prefix="/v1")

    async def run(request: Request, prompt_ids: list[int], params: SamplingParams) -> Optional[RequestOutput]:
        outputs = hooks.engine().generate({"prompt_token_ids": prompt_ids}, params, random_uuid(),
                                          lora_request=hooks.adapter())
        return await hooks.final_output(request, outputs)

    @router.get("/models")
    async def models() -> dict[str, Any]:
        engine = hooks.engine()
        created = int(time.time())
        data = [{"id": _served_name(engine), "object": "model", "created": created, "owned_by": "atroposlib",
                 "root": str(engine.model_config.model), "max_model_len": engine.model_config.max_model_len}]
        adapter = hooks.adapter()
        if adapter is not None:
            data.append({"id": adapter.lora_name, "object": "model", "created": created, "owned_by": "atroposlib",
                         "root": adapter.lora_path, "parent": _served_name(engine)})
        return {"object": "list", "data": data}

    @router.post("/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        engine = hooks.engine()
        _check_model(engine, hooks.adapter(), body.model)
        prompt_ids = _chat_prompt_ids(engine, body)
        top = body.top_logprobs or 0
        params = body.sampling(top if body.logprobs else None, _default_max_tokens(engine, prompt_ids))
        output = await run(request, prompt_ids, params)
        if output is None:
            return Response(status_code=CLIENT_CLOSED)
        choices = [ChatChoice(index=index, message=AssistantMessage(content=choice.text),
                              finish_reason=choice.finish_reason,
                              logprobs=_chat_logprobs(engine, choice, top) if body.logprobs else None,
                              token_ids=list(choice.token_ids) if body.return_token_ids else None)
                   for index, choice in enumerate(output.outputs)]
        answer = ChatCompletionResponse(model=body.model or _served_name(engine), choices=choices,
                                        usage=_usage(output),
                                        prompt_token_ids=prompt_ids if body.return_token_ids else None)
        return JSONResponse(answer.model_dump(exclude_none=True))

    @router.post("/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        engine = hooks.engine()
        _check_model(engine, hooks.adapter(), body.model)
        prompt_ids = _completion_prompt_ids(engine, body.single_prompt())
        params = body.sampling(body.logprobs, _default_max_tokens(engine, prompt_ids))
        output = await run(request, prompt_ids, params)
        if output is None:
            return Response(status_code=CLIENT_CLOSED)
        with_ids = body.return_token_ids
        choices = [CompletionChoice(index=index, text=choice.text, finish_reason=choice.finish_reason,
                                    logprobs=(_completion_logprobs(engine, choice, body.logprobs)
                                              if body.logprobs is not None else None),
                                    token_ids=list(choice.token_ids) if with_ids else None,
                                    prompt_token_ids=prompt_ids if with_ids else None)
                   for index, choice in enumerate(output.outputs)]
        answer = CompletionResponse(model=body.model or _served_name(engine), choices=choices, usage=_usage(output))
        return JSONResponse(answer.model_dump(exclude_none=True))

    return router
