"""A small environment: two-number additions, answered in ``\\boxed{}``, scored 1 or -1.

Problems are generated offline from a seed, so it runs anywhere. Written only against
the public atroposlib API, the way an Atropos environment file is:

    python environments/arithmetic_env.py process --env.total_steps 8 \\
        --openai.base_url http://localhost:9001/v1 --openai.model_name my-model
"""

import random
import re
from typing import Optional

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

SYSTEM_PROMPT = "Solve the problem. Put the final answer in \\boxed{}."


class ArithmeticEnvConfig(BaseEnvConfig):
    max_operand: int = 100
    seed: int = 0


class ArithmeticEnv(BaseEnv):
    name = "arithmetic"
    env_config_cls = ArithmeticEnvConfig

    @classmethod
    def config_init(cls):
        env_config = ArithmeticEnvConfig(group_size=4, total_steps=16, max_token_length=512, use_wandb=False)
        server = APIServerConfig(model_name="default", base_url="http://localhost:9001/v1", api_key="x")
        return env_config, [server]

    async def setup(self):
        self.rng = random.Random(self.config.seed)
        self.percent_correct = []

    async def get_next_item(self):
        a, b = self.rng.randint(0, self.config.max_operand), self.rng.randint(0, self.config.max_operand)
        return {"question": f"What is {a} + {b}?", "answer": a + b}

    @staticmethod
    def score(text: str, answer: int) -> float:
        found = re.findall(r"\\boxed\{(-?\d+)\}", text)
        return 1.0 if found and int(found[-1]) == answer else -1.0

    async def rescore_group(self, group, item) -> list[float]:
        return [self.score(reply, item["answer"]) for reply in self.completions(group)]

    async def collect_trajectories(self, item) -> tuple[Optional[ScoredDataGroup], list]:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": item["question"]}]
        completion = await self.server.chat_completion(
            messages=messages, n=self.config.group_size, max_tokens=self.config.max_token_length, temperature=1.0
        )
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
        for choice in completion.choices:
            chat = messages + [{"role": "assistant", "content": choice.message.content}]
            tokenized = tokenize_for_trainer(self.tokenizer, chat, finish_reason=choice.finish_reason)
            group["tokens"].append(tokenized["tokens"])
            group["masks"].append(tokenized["masks"])
            group["scores"].append(self.score(choice.message.content, item["answer"]))
            group["messages"].append(chat)
        self.percent_correct.extend(s > 0 for s in group["scores"])
        return group, []

    async def evaluate(self, *args, **kwargs):
        items = [await self.get_next_item() for _ in range(8)]
        scores, samples = [], []
        for item in items:
            messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": item["question"]}]
            completion = await self.server.chat_completion(messages=messages, n=1, max_tokens=64, temperature=0.0, split="eval")
            text = completion.choices[0].message.content
            scores.append(self.score(text, item["answer"]) > 0)
            samples.append({"question": item["question"], "gold_answer": str(item["answer"]), "model_parsed": text,
                            "score": float(scores[-1]), "correct": bool(scores[-1])})
        self.evaluate_log({"eval/percent_correct": sum(scores) / len(scores)}, samples=samples)

    async def wandb_log(self, metrics=None):
        metrics = dict(metrics or {})
        if self.percent_correct:
            metrics["train/percent_correct"] = sum(self.percent_correct) / len(self.percent_correct)
            self.percent_correct = []
        await super().wandb_log(metrics)


if __name__ == "__main__":
    ArithmeticEnv.cli()
