"""An OpenAI-compatible inference server for tests and benchmarks (no model).

For a prompt containing "A + B", even-numbered choices answer correctly
(``\\boxed{A+B}``) and odd-numbered ones answer one too many, so groups have differing
scores. ``--latency`` adds a fixed delay per request, like a real server's generation time.
Like the trainer's bundled vLLM server, it has ``/bridge/info`` and ``POST /reload_weights
{"weights_path": DIR}`` (404 when DIR is no folder it sees; it prints ``reloaded weights from
DIR``), and with ``--api-key`` every route but ``/health`` wants ``Authorization: Bearer KEY``.

    python -m tests.fake_openai --port 9001 [--latency 0.2] [--api-key KEY]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional

import uvicorn
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse

LATENCY_S = 0.0
API_KEY: Optional[str] = None
POST_IN_FLIGHT = 0  # POST requests being answered now: tests wait for work to be in flight
FIRST_POST_AT: Optional[float] = None  # wall-clock time of the first POST: start-up benchmarks read it
app = FastAPI()


@app.middleware("http")
async def count_in_flight(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    global POST_IN_FLIGHT, FIRST_POST_AT
    if request.method != "POST":
        return await call_next(request)
    FIRST_POST_AT = FIRST_POST_AT or time.time()
    POST_IN_FLIGHT += 1
    try:
        return await call_next(request)
    finally:
        POST_IN_FLIGHT -= 1


@app.middleware("http")
async def require_key(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    if API_KEY and request.url.path != "/health" and request.headers.get("authorization") != f"Bearer {API_KEY}":
        return JSONResponse({"detail": "missing or wrong API key"}, status_code=401)
    return await call_next(request)


@app.get("/stats")
async def stats() -> dict[str, Optional[float]]:
    return {"in_flight": POST_IN_FLIGHT, "first_post_at": FIRST_POST_AT}


@app.post("/stats/reset")
async def reset_stats() -> dict[str, str]:
    """Forget the first POST's time (this request itself does not count)."""
    global FIRST_POST_AT
    FIRST_POST_AT = None
    return {"status": "ok"}


def _answer(prompt: str, index: int) -> str:
    numbers = re.findall(r"(-?\d+)\s*\+\s*(-?\d+)", prompt)
    total = int(numbers[-1][0]) + int(numbers[-1][1]) if numbers else 0
    return f"Let me add them. The answer is \\boxed{{{total + index % 2}}}"


def _usage(prompt: str, completion: str) -> dict[str, int]:
    return {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(completion) // 4,
            "total_tokens": (len(prompt) + len(completion)) // 4}


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@app.get("/v1/models")
async def models() -> dict[str, Any]:
    return {"object": "list", "data": [{"id": "fake-model", "object": "model", "created": 0, "owned_by": "tests"}]}


@app.post("/v1/chat/completions")
async def chat(request: Request) -> dict[str, Any]:
    body = await request.json()
    await asyncio.sleep(LATENCY_S)
    prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
    choices = [
        {"index": i, "finish_reason": "stop", "logprobs": None,
         "message": {"role": "assistant", "content": _answer(prompt, i)}}
        for i in range(int(body.get("n") or 1))
    ]
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "fake-model"), "choices": choices,
            "usage": _usage(prompt, choices[0]["message"]["content"])}


@app.post("/v1/completions")
async def completions(request: Request) -> dict[str, Any]:
    body = await request.json()
    await asyncio.sleep(LATENCY_S)
    prompt = str(body.get("prompt", ""))
    choices = [{"index": i, "finish_reason": "stop", "logprobs": None, "text": _answer(prompt, i)}
               for i in range(int(body.get("n") or 1))]
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": body.get("model", "fake-model"), "choices": choices, "usage": _usage(prompt, choices[0]["text"])}


COMPLETION_IDS = [11, 12, 13]


@app.post("/generate")
async def generate(request: Request) -> Any:
    """Token route, vLLM style (``prompt``) or SGLang style (``input_ids``): every choice
    samples COMPLETION_IDS with logprob -0.1 x position."""
    body = await request.json()
    await asyncio.sleep(LATENCY_S)
    if "input_ids" in body:
        n = int(body["sampling_params"].get("n") or 1)
        triples = [[-0.1 * (k + 1), t, None] for k, t in enumerate(COMPLETION_IDS)]
        return [{"text": "", "meta_info": {"output_token_logprobs": triples, "finish_reason": {"type": "stop"}}}
                for _ in range(n)]
    prompt_ids = body["prompt"]["prompt_token_ids"]
    n = int(body.get("n") or 1)
    result: dict[str, Any] = {
        "prompt_token_ids": prompt_ids,
        "token_ids": [COMPLETION_IDS] * n,
        "logprobs": [[[{str(t): -0.1 * (k + 1)}] for k, t in enumerate(COMPLETION_IDS)] for _ in range(n)],
        "finish_reasons": ["stop"] * n,
    }
    if body.get("prompt_logprobs"):
        result["prompt_logprobs"] = [None] + [{str(t): -1.0} for t in prompt_ids[1:]]
    return result


@app.get("/bridge/info")
async def bridge_info() -> dict[str, Any]:
    return {"enabled": False, "shared_weights": False, "model_name": "fake-model"}


@app.post("/reload_weights")
async def reload_weights(request: Request) -> dict[str, Any]:
    folder = (await request.json())["weights_path"]
    if not Path(folder).is_dir():
        raise HTTPException(status_code=404, detail=f"no weights folder at {folder}")
    print(f"reloaded weights from {folder}", flush=True)
    return {"status": "ok", "seconds": 0.0}


@app.post("/v1/generate/")
async def trl_generate(request: Request) -> dict[str, Any]:
    """TRL vllm-serve style: completion ids only."""
    body = await request.json()
    return {"completion_ids": [COMPLETION_IDS for _ in range(int(body.get("n") or 1)) for _ in body["prompts"]]}


def main() -> None:
    global LATENCY_S, API_KEY
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args()
    LATENCY_S, API_KEY = args.latency, args.api_key
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
