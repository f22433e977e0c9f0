"""Single-digit sums a small model gets right about half the time: a task RL visibly improves
on a CPU, with a held-out set to show it.

Each item asks "What is A + B? Reply with only the number." for digits A and B; a reply
scores 1 when the last number in it is the sum, else 0 (`small_sums_task`). The 100 pairs
are split once, by ``split_seed``: ``eval_pairs`` of them are held out for `evaluate` and
never trained on.
Rollouts come from `managed_server()` (token ids and the sampler's logprobs, as GRPO needs),
sampled at ``temperature`` (0.7 by default; the evaluation samples the same way, ``eval_samples``
answers per held-out pair, each pair's request seeded from ``eval_seed`` so that two evaluations
of the same weights draw the same answers). SmolLM2-135M-Instruct starts near 50% at 0.7.

    python environments/small_sums_env.py serve --openai.server_type vllm \\
        --openai.base_url http://localhost:9001/v1 --openai.model_name my-model
    python environments/small_sums_env.py evaluate --openai.server_type vllm ...
"""

import asyncio
import random
from typing import Optional

from small_sums_task import PROMPT, messages, score, split_pairs

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup


class SmallSumsEnvConfig(BaseEnvConfig):
    temperature: float = 0.7
    max_answer_tokens: int = 32
    eval_pairs: int = 30
    eval_samples: int = 8
    split_seed: int = 1234
    seed: int = 0
    eval_seed: Optional[int] = 0


class SmallSumsEnv(BaseEnv):
    name = "small_sums"
    env_config_cls = SmallSumsEnvConfig

    @classmethod
    def config_init(cls):
        env_config = SmallSumsEnvConfig(group_size=8, total_steps=64, max_token_length=256, use_wandb=False,
                                        ensure_scores_are_not_same=True)
        server = APIServerConfig(model_name="default", base_url="http://localhost:9001/v1", api_key="x",
                                 server_type="vllm")
        return env_config, [server]

    async def setup(self):
        self.train_pairs, self.eval_pairs = split_pairs(self.config.eval_pairs, self.config.split_seed)
        self.rng = random.Random(self.config.seed)
        self.percent_correct = []

    async def get_next_item(self):
        a, b = self.rng.choice(self.train_pairs)
        return {"a": a, "b": b}

    async def collect_trajectories(self, item) -> tuple[Optional[ScoredDataGroup], list]:
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=messages(item["a"], item["b"]), n=self.config.group_size,
                max_tokens=self.config.max_answer_tokens, temperature=self.config.temperature)
            nodes = managed.get_state()["nodes"]
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], inference_logprobs=[], messages=[])
        for choice, node in zip(completion.choices, nodes):
            group["tokens"].append(node.tokens)
            group["masks"].append(node.masked_tokens)
            group["inference_logprobs"].append(node.logprobs)
            group["scores"].append(self.score_reply(choice.message.content, item))
            group["messages"].append(messages(item["a"], item["b"]) + [{"role": "assistant",
                                                                         "content": choice.message.content}])
        self.percent_correct.extend(s > 0 for s in group["scores"])
        return group, []

    @staticmethod
    def score_reply(reply: str, item: dict) -> float:
        """A rollout's score: 1.0 when the last number of `reply` is the item's sum."""
        return score(reply, item["a"] + item["b"])

    async def rescore_group(self, group, item) -> list[float]:
        return [self.score_reply(reply, item) for reply in self.completions(group)]

    async def evaluate(self, *args, **kwargs):
        async def answers(index: int, a: int, b: int):
            seeded = {} if self.config.eval_seed is None else {"seed": self.config.eval_seed * 1000 + index}
            completion = await self.server.chat_completion(
                messages=messages(a, b), n=self.config.eval_samples, max_tokens=self.config.max_answer_tokens,
                temperature=self.config.temperature, split="eval", **seeded)
            return a, b, completion.choices

        scores, samples = [], []
        pairs = enumerate(self.eval_pairs)
        for a, b, choices in await asyncio.gather(*(answers(index, a, b) for index, (a, b) in pairs)):
            for choice in choices:
                scores.append(score(choice.message.content, a + b))
                samples.append({"question": PROMPT.format(a=a, b=b), "gold_answer": str(a + b),
                                "model_parsed": choice.message.content, "score": scores[-1],
                                "correct": scores[-1] > 0})
        self.evaluate_log({"eval/accuracy": sum(scores) / len(scores), "eval/answers": len(scores)},
                          samples=samples, generation_parameters={"temperature": self.config.temperature,
                                                                  "max_tokens": self.config.max_answer_tokens})

    async def wandb_log(self, metrics=None):
        metrics = dict(metrics or {})
        if self.percent_correct:
            metrics["train/percent_correct"] = sum(self.percent_correct) / len(self.percent_correct)
            self.percent_correct = []
        await super().wandb_log(metrics)


if __name__ == "__main__":
    SmallSumsEnv.cli()
