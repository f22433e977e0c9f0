import asyncio
import random
from collections import Counter
from types import SimpleNamespace
from typing import Any

from atroposlib.utils.force_diverse_samples import generate_with_diverse_first_tokens, sample_distinct

CANDIDATES = [("A", -0.1), ("B", -1.0), ("C", -2.0), ("D", -3.0)]


def _response(contents: list[str], top: Any = None) -> Any:
    logprobs = SimpleNamespace(content=[SimpleNamespace(top_logprobs=top)]) if top is not None else None
    return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=c), logprobs=logprobs)
                                    for c in contents])


class RecordingServer:
    def __init__(self, with_logprobs: bool = True) -> None:
        self.calls: list[dict[str, Any]] = []
        self.with_logprobs = with_logprobs

    async def chat_completion(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        if kwargs.get("logprobs"):
            top = [SimpleNamespace(token=t, logprob=lp) for t, lp in CANDIDATES] if self.with_logprobs else None
            return _response(["A"], top)
        return _response([f" rest{i}" for i in range(kwargs["n"])])


def test_sampling_is_distinct_and_follows_the_tempered_distribution() -> None:
    rng = random.Random(0)
    firsts = Counter(sample_distinct(CANDIDATES, 1, 1.0, rng)[0] for _ in range(4000))
    assert firsts["A"] > firsts["B"] > firsts["C"] > firsts["D"] > 0
    assert abs(firsts["A"] / 4000 - 0.5953) < 0.03  # exp(-0.1) / sum(exp(lp))
    assert sorted(sample_distinct(CANDIDATES, 10, 1.0, rng)) == ["A", "B", "C", "D"]
    assert sample_distinct(CANDIDATES, 2, 0.0) == ["A", "B"]


def test_each_completion_starts_with_its_own_forced_token() -> None:
    server = RecordingServer()
    env = SimpleNamespace(server=server)
    messages = [{"role": "user", "content": "hi"}]
    out = asyncio.run(generate_with_diverse_first_tokens(env, messages, prefill="<think>", n=3, max_tokens=50))
    assert len(out) == 3 and len({o[0] for o in out}) == 3 and all(o.endswith(" rest0") for o in out)
    probe, *continuations = server.calls
    assert probe["max_tokens"] == 1 and probe["top_logprobs"] == 20 and probe["temperature"] == 0.0
    assert probe["messages"][-1] == {"role": "assistant", "content": "<think>"}
    for call in continuations:
        assert call["max_tokens"] == 49 and call["top_p"] == 0.3
        assert call["extra_body"] == {"min_p": 0.5, "repetition_penalty": 1.05}
        assert call["messages"][-1]["content"].startswith("<think>")


def test_falls_back_to_plain_samples_without_logprobs() -> None:
    server = RecordingServer(with_logprobs=False)
    out = asyncio.run(generate_with_diverse_first_tokens(SimpleNamespace(server=server),
                                                         [{"role": "user", "content": "hi"}], n=4))
    assert out == [" rest0", " rest1", " rest2", " rest3"]
    assert server.calls[-1]["n"] == 4
