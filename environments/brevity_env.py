"""Brevity: answer a question in as few tokens as possible (a task a tiny model learns in minutes).

Every rollout scores ``1 - completion_tokens / max_token_length``, so the scores in a group
differ from the first step on (unlike GSM8K, where a 135M model gets every answer wrong and
every group's advantages are zero): GRPO pushes towards the shorter answers, and on a CPU
the mean score rises within a few dozen steps. The prompts are generated, so it runs
offline. It samples through `managed_server()`, so the groups carry the sampler's logprobs.

    python environments/brevity_env.py serve --openai.server_type vllm \\
        --openai.base_url http://127.0.0.1:9001/v1 --openai.model_name MODEL --env.tokenizer_name MODEL
"""

from __future__ import annotations

import random
from typing import Optional

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.type_definitions import Item
from atroposlib.utils.length_penalty import length_overrun

TOPICS = ["the sea", "grass", "bread", "snow", "a banana", "the moon", "coffee", "a tomato",
          "rain clouds", "a lemon", "charcoal", "milk", "a carrot", "the sky", "sand", "a plum"]
QUESTIONS = ["What colour is {}?", "Which colour does {} have?", "Name the colour of {}.", "Is {} dark or light?"]


class BrevityEnv(BaseEnv):
    name = "brevity"
    env_config_cls = BaseEnvConfig

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, list[APIServerConfig]]:
        config = BaseEnvConfig(group_size=8, max_token_length=64, total_steps=1000, steps_per_eval=-1,
                               batch_size=-1, use_wandb=False, ensure_scores_are_not_same=True)
        return config, [APIServerConfig(model_name="default", base_url="http://localhost:9001/v1",
                                        api_key="x", server_type="vllm")]

    async def setup(self) -> None:
        self.rng = random.Random(0)
        self.mean_scores: list[float] = []

    async def get_next_item(self) -> Item:
        return {"question": self.rng.choice(QUESTIONS).format(self.rng.choice(TOPICS))}

    async def collect_trajectories(self, item: Item) -> tuple[Optional[ScoredDataGroup], list[Item]]:
        prompt = [{"role": "user", "content": item["question"]}]
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(messages=prompt, n=self.config.group_size,
                                                       max_tokens=self.config.max_token_length, temperature=1.0)
            nodes = managed.get_state()["nodes"]
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], inference_logprobs=[], messages=[])
        for choice, node in zip(completion.choices, nodes):
            group["tokens"].append(node.tokens)
            group["masks"].append(node.masked_tokens)
            group["inference_logprobs"].append(node.logprobs)
            group["messages"].append(prompt + [{"role": "assistant", "content": choice.message.content}])
            group["scores"].append(self.length_score(node.masked_tokens))
        self.mean_scores.append(sum(group["scores"]) / len(group["scores"]))
        if self.config.ensure_scores_are_not_same and len(set(group["scores"])) == 1:
            return None, []
        return group, []

    def length_score(self, masks: list[int]) -> float:
        """1.0 for an empty answer, falling linearly to 0.0 at max_token_length completion tokens."""
        completion_tokens = sum(mask != -100 for mask in masks)
        return 1.0 - length_overrun(completion_tokens, self.config.max_token_length, 0.0)

    async def rescore_group(self, group: ScoredDataGroup, item: Item) -> list[float]:
        return [self.length_score(masks) for masks in group["masks"]]

    async def score(self, question: str) -> float:
        """One greedy answer to `question`, scored."""
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            await managed.chat_completion(messages=[{"role": "user", "content": question}], n=1,
                                          max_tokens=self.config.max_token_length, temperature=0.0)
            node = managed.get_state()["nodes"][0]
        completion_tokens = sum(mask != -100 for mask in node.masked_tokens)
        return 1.0 - min(completion_tokens, self.config.max_token_length) / self.config.max_token_length

    async def wandb_log(self, metrics: Optional[dict] = None) -> None:
        metrics = dict(metrics or {})
        if self.mean_scores:
            metrics["train/mean_score"] = sum(self.mean_scores) / len(self.mean_scores)
            self.mean_scores = []
        await super().wandb_log(metrics)

    async def evaluate(self, *args, **kwargs) -> None:
        """Greedy answers to one question per topic."""
        scores = [await self.score(QUESTIONS[0].format(topic)) for topic in TOPICS]
        self.evaluate_log({"eval/mean_score": sum(scores) / len(scores)})


if __name__ == "__main__":
    BrevityEnv.cli()
