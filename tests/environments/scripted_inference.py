"""An OpenAI-compatible inference server whose answers a test scripts, for environment tests.

The test gives a function ``answer(prompt, index) -> str``: `prompt` is the request's text
(chat messages' contents joined by newlines, or the completion prompt) and `index` the
choice number within the request, so one group can hold right and wrong answers. The
server speaks ``/v1/chat/completions``, ``/v1/completions`` and vLLM's ``/generate`` (the
answer encoded with the tokenizer given, logprob -0.1 per token), so environments that use
``managed_server()`` with ``server_type vllm`` run against it too. It runs in a thread of
the test process on a free loopback port. Set `policy_version` to have every answer say
which weights sampled it (header ``X-Atropos-Policy-Version``, as the trainer's vLLM server
does), and `generate_body_version` to put ``"policy_version"`` in ``/generate`` answers.

    with ScriptedInference(lambda prompt, i: "\\\\boxed{4}" if i % 2 == 0 else "5", tokenizer) as server:
        ... --openai.base_url {server.url}/v1 ...
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Awaitable, Callable, Optional

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from atroposlib.policy_version import POLICY_VERSION_HEADER

from tests.helpers import free_port

Answer = Callable[[str, int], str]


def _prompt_text(messages: list[dict[str, Any]]) -> str:
    parts = []
    for message in messages:
        content = message.get("content", "")
        if isinstance(content, list):  # multimodal parts: keep the text ones
            content = "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        parts.append(str(content))
    return "\n".join(parts)


class ScriptedInference:
    """The server (a context manager); `requests` keeps every request body it answered."""

    def __init__(self, answer: Answer, tokenizer: Any = None, finish_reason: str = "stop",
                 only_model: Optional[str] = None) -> None:
        self.answer = answer
        self.only_model = only_model  # when set, requests naming another model get vLLM's 404
        self.tokenizer = tokenizer
        self.finish_reason = finish_reason
        self.requests: list[dict[str, Any]] = []
        self.policy_version: Optional[int] = None
        self.generate_body_version: Optional[int] = None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self._app(), host="127.0.0.1", port=self.port, log_level="warning", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def _choices(self, prompt: str, n: int) -> list[str]:
        return [self.answer(prompt, i) for i in range(n)]

    def _app(self) -> FastAPI:
        app = FastAPI()

        @app.middleware("http")
        async def version_header(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
            response = await call_next(request)
            if self.policy_version is not None:
                response.headers[POLICY_VERSION_HEADER] = str(self.policy_version)
            return response

        @app.get("/health")
        async def health() -> dict[str, str]:
            return {"status": "ok"}

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": self.only_model or "scripted", "object": "model", "created": 0,
                                                "owned_by": "tests"}]}

        def unknown_model(body: dict[str, Any]) -> Optional[Response]:
            """vLLM's 404 for a request naming a model other than `only_model` (when set)."""
            if self.only_model is None or body.get("model") == self.only_model:
                return None
            return JSONResponse({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                           "type": "NotFoundError", "code": 404}}, status_code=404)

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await request.json()
            self.requests.append(body)
            refused = unknown_model(body)
            if refused is not None:
                return refused
            texts = self._choices(_prompt_text(body.get("messages", [])), int(body.get("n") or 1))
            choices = [{"index": i, "finish_reason": self.finish_reason, "logprobs": None,
                        "message": {"role": "assistant", "content": text}} for i, text in enumerate(texts)]
            return _envelope("chat.completion", body, choices)

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            body = await request.json()
            self.requests.append(body)
            refused = unknown_model(body)
            if refused is not None:
                return refused
            texts = self._choices(str(body.get("prompt", "")), int(body.get("n") or 1))
            choices = [{"index": i, "finish_reason": self.finish_reason, "logprobs": None, "text": text}
                       for i, text in enumerate(texts)]
            return _envelope("text_completion", body, choices)

        @app.post("/generate")
        async def generate(request: Request) -> dict[str, Any]:
            body = await request.json()
            self.requests.append(body)
            if self.tokenizer is None:
                raise RuntimeError("ScriptedInference needs a tokenizer to answer /generate")
            prompt_ids = body["prompt"]["prompt_token_ids"]
            texts = self._choices(self.tokenizer.decode(prompt_ids), int(body.get("n") or 1))
            token_ids = [list(self.tokenizer.encode(text, add_special_tokens=False)) or [0] for text in texts]
            answer = {
                "prompt_token_ids": prompt_ids, "token_ids": token_ids,
                "logprobs": [[[{str(t): -0.1}] for t in ids] for ids in token_ids],
                "finish_reasons": [self.finish_reason] * len(texts),
            }
            if self.generate_body_version is not None:
                answer["policy_version"] = self.generate_body_version
            return answer

        return app

    def __enter__(self) -> "ScriptedInference":
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the scripted inference server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)


def _envelope(kind: str, body: dict[str, Any], choices: list[dict[str, Any]]) -> dict[str, Any]:
    text = choices[0].get("text") or choices[0].get("message", {}).get("content", "") if choices else ""
    return {"id": f"scripted-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
            "model": body.get("model", "scripted"), "choices": choices,
            "usage": {"prompt_tokens": 1, "completion_tokens": max(1, len(text) // 4), "total_tokens": 1 + len(text) // 4}}


def answers_for(script: dict[str, list[str]], default: Optional[str] = None) -> Answer:
    """An `answer` function from ``{substring of the prompt: [answer for choice 0, 1, ...]}``
    (choices past the list's end cycle through it)."""
    def answer(prompt: str, index: int) -> str:
        for needle, texts in script.items():
            if needle in prompt:
                return texts[index % len(texts)]
        if default is None:
            raise KeyError(f"no scripted answer for a prompt ending {prompt[-200:]!r}")
        return default
    return answer
