"""An environment file in the shape Atropos users write: a Hugging Face dataset, math-verify, W&B tables.

It imports what such files import at the top (``datasets``, ``wandb``, ``tqdm``, ``math_verify``)
and uses only names Atropos 0.4.0 exposes, so it runs on either library. The dataset is a
local JSONL file (``--env.dataset_path``) loaded through ``datasets.load_dataset("json")``.
"""

import random
from typing import Optional

import wandb
from datasets import load_dataset
from math_verify import parse, verify
from tqdm.asyncio import tqdm_asyncio

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


class DatasetEnvConfig(BaseEnvConfig):
    dataset_path: str = "problems.jsonl"


class DatasetEnv(BaseEnv):
    name = "dataset_env"
    env_config_cls = DatasetEnvConfig

    @classmethod
    def config_init(cls):
        config = DatasetEnvConfig(group_size=4, total_steps=4, max_token_length=256, use_wandb=False)
        return config, [APIServerConfig(model_name="default", base_url="http://localhost:9001/v1", api_key="x")]

    async def setup(self):
        self.train = load_dataset("json", data_files=self.config.dataset_path, split="train")
        self.iter = 0

    async def get_next_item(self):
        row = self.train[self.iter % len(self.train)]
        self.iter += 1
        return row

    async def collect_trajectories(self, item) -> tuple[Optional[ScoredDataGroup], list]:
        messages = [{"role": "user", "content": item["question"]}]
        completion = await self.server.chat_completion(messages=messages, n=self.config.group_size, max_tokens=64)
        group = ScoredDataGroup(tokens=[], masks=[], scores=[])
        gold = parse("$" + str(item["answer"]) + "$")
        for choice in completion.choices:
            chat = messages + [{"role": "assistant", "content": choice.message.content}]
            tokenized = tokenize_for_trainer(self.tokenizer, chat)
            group["tokens"].append(tokenized["tokens"])
            group["masks"].append(tokenized["masks"])
            group["scores"].append(1.0 if verify(gold, parse(choice.message.content)) else -1.0)
        return group, []

    async def evaluate(self, *args, **kwargs):
        await tqdm_asyncio.gather(*[self.get_next_item() for _ in range(2)])

    async def create_rollout_table(self, wandb_metrics):
        wandb_metrics["train/rollouts"] = wandb.Table(columns=["text"])
        return wandb_metrics


if __name__ == "__main__":
    random.seed(0)
    DatasetEnv.cli()
