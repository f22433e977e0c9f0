"""An environment file written the transformers-4 way: ``apply_chat_template`` gives token ids.

Like Atropos's game environments, it tokenizes each chat with ``tokenizer.apply_chat_template``
(no ``return_dict``), measures the prompt with ``len``, slices the answer's tokens off the list,
builds the masks by list arithmetic and logs the ids as JSON. Under transformers 4 that call
returned a ``list[int]``; it uses only names Atropos 0.4.0 exposes.
"""

import json
import logging
from typing import Optional

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup

logger = logging.getLogger(__name__)


class ChatIdsEnv(BaseEnv):
    name = "chat_ids_env"

    @classmethod
    def config_init(cls):
        config = BaseEnvConfig(group_size=2, total_steps=2, max_token_length=256, use_wandb=False)
        return config, [APIServerConfig(model_name="default", base_url="http://localhost:9001/v1", api_key="x")]

    async def setup(self):
        self.iter = 0

    async def get_next_item(self):
        self.iter += 1
        return {"a": self.iter, "b": 2}

    async def collect_trajectories(self, item) -> tuple[Optional[ScoredDataGroup], list]:
        messages = [{"role": "user", "content": f"What is {item['a']} + {item['b']}?"}]
        prompt_ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        completion = await self.server.chat_completion(messages=messages, n=self.config.group_size, max_tokens=16)
        group = ScoredDataGroup(tokens=[], masks=[], scores=[])
        for index, choice in enumerate(completion.choices):
            ids = self.tokenizer.apply_chat_template(messages + [{"role": "assistant",
                                                                  "content": choice.message.content}])
            answer = ids[len(prompt_ids):]
            logger.debug("rollout ids %s", json.dumps(ids))
            group["tokens"].append(ids)
            group["masks"].append([-100] * len(prompt_ids) + answer)
            group["scores"].append(1.0 if index == 0 else 0.0)
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    ChatIdsEnv.cli()
