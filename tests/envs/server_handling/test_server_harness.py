"""The testing harness answers what tests script, and --testing needs no model."""

from __future__ import annotations

import asyncio

import pytest

from atroposlib.envs.server_handling.configs import ServerBaseline
from atroposlib.envs.server_handling.server_harness import (
    TESTING_RESPONSE,
    ServerHarness,
    create_chat_completion,
    create_completion,
)
from atroposlib.envs.server_handling.server_manager import ServerManager


def test_scripted_responses_and_missing_keys() -> None:
    harness = ServerHarness()
    messages = [{"role": "user", "content": "hi"}]
    harness.set_desired_response(messages, create_chat_completion(["a", "b"], n=2, finish_reason=["stop", "length"]))
    harness.set_desired_completion("2+2=", create_completion("4"))
    harness.set_tokens_and_logprobs_response("p", [1, 2], [[3]], [[-0.1]], ["stop"])

    async def scenario():
        chat = await harness.chat_completion(messages=messages)
        text = await harness.completion(prompt="2+2=")
        tokens = await harness.tokens_and_logprobs_completion(prompt="p")
        with pytest.raises(KeyError, match="no chat response"):
            await harness.chat_completion(messages=[{"role": "user", "content": "other"}])
        return chat, text, tokens

    chat, text, tokens = asyncio.run(scenario())
    assert [c.message.content for c in chat.choices] == ["a", "b"] and chat.choices[1].finish_reason == "length"
    assert text.choices[0].text == "4" and tokens == ([1, 2], [[3]], [[-0.1]], ["stop"])


def test_testing_manager_answers_with_the_default() -> None:
    manager = ServerManager(ServerBaseline(), testing=True)
    response = asyncio.run(manager.chat_completion(messages=[{"role": "user", "content": "x"}], n=3))
    assert [c.message.content for c in response.choices] == [TESTING_RESPONSE] * 3
