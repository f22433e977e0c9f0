"""Diverse samples by forcing different first tokens.

A group whose completions all start the same way teaches little. This helper reads the
model's top-20 candidates for the first token, draws up to `n` *distinct* ones from the
tempered distribution, and lets the model continue each of them (conservatively:
``top_p`` 0.3, ``min_p`` 0.5), so the group differs from its first token on.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from typing import Any, Optional

log = logging.getLogger("atroposlib.envs")

TOP_CANDIDATES = 20


def sample_distinct(candidates: list[tuple[str, float]], n: int, temperature: float,
                    rng: Optional[random.Random] = None) -> list[str]:
    """Up to `n` distinct tokens drawn without replacement, weighted by ``exp(logprob / T)``.

    Uses the Gumbel-top-k trick (perturb each tempered logprob with Gumbel noise, keep the
    k largest), which is exactly sequential sampling without replacement. ``T <= 0`` keeps
    the `n` most likely tokens.
    """
    rng = rng or random.Random()
    if temperature <= 0:
        ranked = sorted(candidates, key=lambda c: c[1], reverse=True)
    else:
        keyed = [(lp / temperature - math.log(-math.log(rng.random() or 1e-300)), tok) for tok, lp in candidates]
        ranked = [(tok, key) for key, tok in sorted(keyed, reverse=True)]
    distinct: list[str] = []
    for token, _ in ranked:
        if token not in distinct:
            distinct.append(token)
        if len(distinct) == n:
            break
    return distinct


def _first_token_candidates(response: Any) -> list[tuple[str, float]]:
    top = response.choices[0].logprobs.content[0].top_logprobs
    return [(item.token, item.logprob) for item in top]


async def _continue_from(env: Any, messages: list[dict[str, Any]], prefill: str, token: str,
                         max_tokens: int, temperature: float) -> str:
    response = await env.server.chat_completion(
        messages=messages + [{"role": "assistant", "content": prefill + token}],
        n=1, max_tokens=max(1, max_tokens - 1), temperature=temperature, top_p=0.3,
        extra_body={"min_p": 0.5, "repetition_penalty": 1.05},
    )
    return token + (response.choices[0].message.content or "")


async def _plain_samples(env: Any, messages: list[dict[str, Any]], prefill: str, n: int,
                         max_tokens: int, temperature: float) -> list[str]:
    prompt = messages + [{"role": "assistant", "content": prefill}] if prefill else messages
    response = await env.server.chat_completion(messages=prompt, n=n, max_tokens=max_tokens, temperature=temperature)
    return [choice.message.content or "" for choice in response.choices]


async def generate_with_diverse_first_tokens(env: Any, messages: list[dict[str, Any]], prefill: str = "",
                                             n: int = 8, max_tokens: int = 4096,
                                             temperature: float = 1.0) -> list[str]:
    """Up to `n` completions of `messages` (after `prefill`), each starting with a different token.

    `env` is anything with a ``server`` offering ``chat_completion`` (a `BaseEnv`). When the
    server returns no first-token logprobs, this falls back to `n` ordinary samples. The
    returned strings start with the forced token and exclude `prefill`.
    """
    probe = await env.server.chat_completion(
        messages=messages + [{"role": "assistant", "content": prefill}],
        n=1, max_tokens=1, temperature=0.0, logprobs=True, top_logprobs=TOP_CANDIDATES,
    )
    try:
        candidates = _first_token_candidates(probe)
    except (AttributeError, IndexError, KeyError, TypeError):
        candidates = []
    if not candidates:
        log.warning("the inference server returned no first-token logprobs; sampling %d plain completions", n)
        return await _plain_samples(env, messages, prefill, n, max_tokens, temperature)
    first_tokens = sample_distinct(candidates, n, temperature)
    return list(await asyncio.gather(
        *(_continue_from(env, messages, prefill, token, max_tokens, temperature) for token in first_tokens)
    ))
