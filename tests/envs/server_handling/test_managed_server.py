"""managed_server() records tokens, -100 prompt masks and 1.0 prompt logprobs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import transformers

from atroposlib.envs.server_handling.configs import APIServerConfig, ServerBaseline
from atroposlib.envs.server_handling.managed_server import ManagedServer, SequenceNode
from atroposlib.envs.server_handling.server_harness import ServerHarness
from atroposlib.envs.server_handling.server_manager import ServerManager
from tests.fake_openai import COMPLETION_IDS


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path):
    return transformers.AutoTokenizer.from_pretrained(tokenizer_dir)


class TokenHarness(ServerHarness):
    """A harness whose token route answers every prompt with fixed completion ids."""

    def __init__(self, completion: list[int]) -> None:
        super().__init__()
        self.completion = completion

    async def tokens_and_logprobs_completion(self, **kwargs):
        n = int(kwargs.get("n") or 1)
        return kwargs["input_ids"], [self.completion] * n, [[-0.5] * len(self.completion)] * n, ["stop"] * n


def test_first_turn_masks_the_prompt(tokenizer) -> None:
    completion = tokenizer.encode("The answer is 4.", add_special_tokens=False)
    managed = ManagedServer(TokenHarness(completion), tokenizer)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    response = asyncio.run(managed.chat_completion(messages=messages, n=2))
    assert [c.message.content for c in response.choices] == ["The answer is 4."] * 2
    nodes = managed.get_state()["nodes"]
    assert len(nodes) == 2 and isinstance(nodes[0], SequenceNode)
    prompt_len = len(nodes[0].tokens) - len(completion)
    assert nodes[0].masked_tokens == [-100] * prompt_len + completion
    assert nodes[0].logprobs == [1.0] * prompt_len + [-0.5] * len(completion)
    assert nodes[0].metadata == {"finish_reason": "stop"}


def test_second_turn_extends_and_keeps_earlier_completion_trainable(tokenizer) -> None:
    completion = tokenizer.encode("4", add_special_tokens=False)
    managed = ManagedServer(TokenHarness(completion), tokenizer)
    first = [{"role": "user", "content": "What is 2 + 2?"}]
    asyncio.run(managed.chat_completion(messages=first))
    turn_one = managed.get_state()["nodes"][0]
    second = first + [{"role": "assistant", "content": "4"}, {"role": "user", "content": "And 12 times 3?"}]
    asyncio.run(managed.chat_completion(messages=second))
    nodes = managed.get_state()["nodes"]
    assert len(nodes) == 1, "the extended node is replaced, not duplicated"
    node = nodes[0]
    assert node.tokens[: len(turn_one.tokens)] == turn_one.tokens
    assert node.masked_tokens[: len(turn_one.tokens)] == turn_one.masked_tokens
    trained = [t for t in node.masked_tokens if t != -100]
    assert trained == completion + completion
    managed.reset()
    assert managed.get_state()["nodes"] == []


def test_vllm_backend_through_the_manager(inference_url: str, tokenizer_dir: Path, tokenizer) -> None:
    config = APIServerConfig(base_url=inference_url, api_key="x", server_type="vllm", model_name="m",
                             tokenizer_name=str(tokenizer_dir))

    async def scenario():
        manager = ServerManager(config)
        try:
            prompt_ids, outputs, logprobs, reasons = await manager.tokens_and_logprobs_completion(prompt="2 + 2", n=10)
            scored = await manager.get_logprobs(input_ids=[5, 6, 7], top_k=1)
            async with manager.managed_server(tokenizer=tokenizer) as managed:
                await managed.completion(prompt="What is 2 + 2?", n=1, max_tokens=3)
                state = managed.get_state()
            return prompt_ids, outputs, logprobs, reasons, scored, state
        finally:
            await manager.close()

    prompt_ids, outputs, logprobs, reasons, scored, state = asyncio.run(scenario())
    assert outputs == [COMPLETION_IDS] * 10 and len(logprobs) == 10 and reasons == ["stop"] * 10
    assert logprobs[0] == pytest.approx([-0.1, -0.2, -0.3])
    assert scored["prompt_tokens"] == [5, 6, 7] and scored["prompt_topk_token_ids"] == [[], [6], [7]]
    node = state["nodes"][0]
    assert node.tokens[-3:] == COMPLETION_IDS and node.masked_tokens[-3:] == COMPLETION_IDS
    assert set(node.masked_tokens[:-3]) == {-100} and set(node.logprobs[:-3]) == {1.0}


def test_openai_endpoints_refuse_managed_server_unless_allowed(monkeypatch) -> None:
    manager = ServerManager(APIServerConfig(base_url="http://localhost:1/v1", health_check=False))

    async def enter():
        async with manager.managed_server() as managed:
            return type(managed).__name__

    with pytest.raises(NotImplementedError, match="ATROPOS_ALLOW_DUMMY_MANAGED_SERVER"):
        asyncio.run(enter())
    monkeypatch.setenv("ATROPOS_ALLOW_DUMMY_MANAGED_SERVER", "yes")
    assert asyncio.run(enter()) == "DummyManagedServer"


def test_testing_harness_supports_managed_server(tokenizer) -> None:
    manager = ServerManager(ServerBaseline(), testing=True)

    async def enter():
        async with manager.managed_server(tokenizer=tokenizer) as managed:
            return type(managed).__name__

    assert asyncio.run(enter()) == "ManagedServer"


def test_sglang_and_trl_backends(inference_url: str, tokenizer_dir: Path) -> None:
    sglang = APIServerConfig(base_url=inference_url, server_type="sglang", tokenizer_name=str(tokenizer_dir))
    trl = APIServerConfig(base_url=inference_url, server_type="trl", model_name=str(tokenizer_dir))

    async def scenario():
        results = []
        for config in (sglang, trl):
            manager = ServerManager(config)
            try:
                if config.server_type == "sglang":
                    results.append(await manager.tokens_and_logprobs_completion(input_ids=[1, 2], n=2))
                else:
                    results.append(await manager.chat_completion(messages=[{"role": "user", "content": "hi"}], n=2))
            finally:
                await manager.close()
        return results

    (ids, outputs, logprobs, reasons), chat = asyncio.run(scenario())
    assert ids == [1, 2] and outputs == [COMPLETION_IDS] * 2 and reasons == [{"type": "stop"}] * 2
    assert logprobs[0] == pytest.approx([-0.1, -0.2, -0.3])
    assert len(chat.choices) == 2 and chat.choices[0].finish_reason == "length"


class CharTokenizer:
    """Not a Hugging Face tokenizer: one id per character and a chat format of its own."""

    eos_token_id = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids if i > 1)

    def apply_chat_template(self, messages, tokenize: bool = False, add_generation_prompt: bool = True) -> str:
        return "".join(f"[{m['role']}]{m['content']}" for m in messages) + ("[assistant]" if add_generation_prompt else "")


def test_any_tokenizer_with_a_chat_template_method_renders_prompts() -> None:
    managed = ManagedServer(TokenHarness([ord("!")]), CharTokenizer())
    messages = [{"role": "user", "content": "hi"}]
    assert managed._convert_messages_to_prompt(messages) == "[user]hi[assistant]"
    asyncio.run(managed.chat_completion(messages=messages))
    assert managed.get_state()["nodes"][0].full_text == "[user]hi[assistant]!"


def test_prompt_scoring_needs_a_backend_that_scores() -> None:
    harness = ServerHarness()
    managed = ManagedServer(harness, CharTokenizer())
    with pytest.raises(NotImplementedError, match="does not implement get_logprobs"):
        asyncio.run(managed.get_logprobs(prompt="[user]hi[assistant]"))
    harness.set_logprobs_response("[user]hi[assistant]", {"prompt_tokens": [1, 2]})
    scored = asyncio.run(managed.get_logprobs(messages=[{"role": "user", "content": "hi"}]))
    assert scored == {"prompt_tokens": [1, 2]}
