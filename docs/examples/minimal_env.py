"""A complete environment in one file: additions, answered in \\boxed{}, scored +1 or -1, with
the token ids and sampler logprobs a trainer needs (`managed_server()`, on a vLLM server).

    python docs/examples/minimal_env.py process --env.total_steps 4 --env.tokenizer_name TOKENIZER \\
        --openai.base_url http://localhost:9001/v1 --openai.model_name MODEL
"""

import random
import re
from typing import Optional

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.type_definitions import Item


class AdditionConfig(BaseEnvConfig):
    largest_number: int = 99  # a new field is a new flag: --env.largest_number 999


class AdditionEnv(BaseEnv):
    name = "addition"  # the default wandb_name, and the env's name at the trajectory API
    env_config_cls = AdditionConfig  # the class --env.* flags and YAML env: keys fill in

    @classmethod
    def config_init(cls) -> tuple[AdditionConfig, list[APIServerConfig]]:
        """Defaults for this env; flags and YAML override them (and --help shows them)."""
        config = AdditionConfig(group_size=4, max_token_length=256, total_steps=8, use_wandb=False)
        server = APIServerConfig(model_name="smollm2", base_url="http://localhost:9001/v1", api_key="x",
                                 server_type="vllm")  # vLLM returns token ids and logprobs; plain OpenAI does not
        return config, [server]

    async def setup(self) -> None:
        self.rng = random.Random(0)

    async def get_next_item(self) -> Item:
        a, b = self.rng.randint(0, self.config.largest_number), self.rng.randint(0, self.config.largest_number)
        return {"question": f"What is {a} + {b}? Answer in \\boxed{{}}.", "answer": a + b}

    async def collect_trajectories(self, item: Item) -> tuple[Optional[ScoredDataGroup], list[Item]]:
        """One group of `group_size` rollouts of `item`, scored; and items to try later (none here).
        `managed_server()` records each rollout's exact tokens, its mask (-100 on the prompt: only
        the answer is trained) and the sampler's logprobs, which the trainer's importance ratio needs."""
        prompt = [{"role": "user", "content": item["question"]}]
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(messages=prompt, n=self.config.group_size, max_tokens=64)
            nodes = managed.get_state()["nodes"]
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], inference_logprobs=[], messages=[])
        for choice, node in zip(completion.choices, nodes):
            boxed = re.findall(r"\\boxed\{(-?\d+)\}", choice.message.content)
            group["tokens"].append(node.tokens)
            group["masks"].append(node.masked_tokens)
            group["inference_logprobs"].append(node.logprobs)
            group["scores"].append(1.0 if boxed and int(boxed[-1]) == item["answer"] else -1.0)
            group["messages"].append(prompt + [{"role": "assistant", "content": choice.message.content}])
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
