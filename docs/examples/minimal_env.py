"""A complete environment in one file: additions, answered in \\boxed{}, scored +1 or -1.

    python docs/examples/minimal_env.py process --env.total_steps 4 --env.tokenizer_name TOKENIZER \\
        --openai.base_url http://localhost:9001/v1 --openai.model_name MODEL
"""

import random
import re
from typing import Optional

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.type_definitions import Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


class AdditionConfig(BaseEnvConfig):
    largest_number: int = 99  # a new field is a new flag: --env.largest_number 999


class AdditionEnv(BaseEnv):
    name = "addition"  # the default wandb_name, and the env's name at the trajectory API
    env_config_cls = AdditionConfig  # the class --env.* flags and YAML env: keys fill in

    @classmethod
    def config_init(cls) -> tuple[AdditionConfig, list[APIServerConfig]]:
        """Defaults for this env; flags and YAML override them (and --help shows them)."""
        config = AdditionConfig(group_size=4, max_token_length=256, total_steps=8, use_wandb=False)
        return config, [APIServerConfig(model_name="default", base_url="http://localhost:9001/v1", api_key="x")]

    async def setup(self) -> None:
        self.rng = random.Random(0)

    async def get_next_item(self) -> Item:
        a, b = self.rng.randint(0, self.config.largest_number), self.rng.randint(0, self.config.largest_number)
        return {"question": f"What is {a} + {b}? Answer in \\boxed{{}}.", "answer": a + b}

    async def collect_trajectories(self, item: Item) -> tuple[Optional[ScoredDataGroup], list[Item]]:
        """One group of `group_size` rollouts of `item`, scored; and items to try later (none here)."""
        prompt = [{"role": "user", "content": item["question"]}]
        completion = await self.server.chat_completion(messages=prompt, n=self.config.group_size, max_tokens=64)
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
        for choice in completion.choices:
            chat = prompt + [{"role": "assistant", "content": choice.message.content}]
            tokenized = tokenize_for_trainer(self.tokenizer, chat, finish_reason=choice.finish_reason)
            boxed = re.findall(r"\\boxed\{(-?\d+)\}", choice.message.content)
            group["tokens"].append(tokenized["tokens"])
            group["masks"].append(tokenized["masks"])  # -100 on the prompt: only the answer is trained
            group["scores"].append(1.0 if boxed and int(boxed[-1]) == item["answer"] else -1.0)
            group["messages"].append(chat)
        return group, []

    async def evaluate(self, *args, **kwargs) -> None:
        items = [await self.get_next_item() for _ in range(4)]
        correct = 0
        for item in items:
            group, _ = await self.collect_trajectories(item)
            correct += group["scores"][0] > 0
        self.evaluate_log({"eval/percent_correct": correct / len(items)})


if __name__ == "__main__":
    AdditionEnv.cli()
