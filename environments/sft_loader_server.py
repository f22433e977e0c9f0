"""Supervised examples into an RL run: each row of a dataset becomes a one-sequence group marked SFT.

No inference: every item is a dataset row turned into tokens and label masks, scored 1.0 with
per-token advantages of 1.0 and flagged ``{"sft": true}`` in ``overrides`` and
``group_overrides`` (with ``group_size: 1``), so a trainer can take an SFT step on it (the
example trainer does) and the trajectory API pools these single-sequence groups as it pools
any partial group. Row formats (``dataset_format``):

* ``completion``: ``dataset_column_name`` is plain text, all of it trained on;
* ``prefix_completion``: ``prefix_column_name`` + ``dataset_column_name``, only the latter trained;
* ``oai_format``: a list of ``{role, content}`` messages, rendered by the chat template;
* ``sharegpt_format``: a list of ``{from, value}`` turns (``human``/``gpt``/``system``), likewise.

For chats, ``mask_everything_but_last_step`` trains on the last message only,
``mask_everything_but_assistant_answer`` (default) on every assistant turn, neither on the whole
conversation. In ``serve`` mode, when the trainer reaches a step that is a multiple of
``add_every_n_steps``, up to ``max_batches_offpolicy x batch_size - queue_size`` examples
(at most ``max_sft_per_step`` unless -1) are sent for that step; ``process`` writes
``total_steps`` examples.

Data: ``dataset_name``'s train split from the hub, shuffled (seed 42), or ``--env.train_file`` (a
local JSONL/JSON/CSV/Parquet file with the same columns).

    # offline, with the project's ShareGPT fixture
    python environments/sft_loader_server.py process --env.train_file environments/fixtures/sft_loader/sharegpt.jsonl
    # for real, beside an RL environment
    python environments/sft_loader_server.py serve --env.rollout_server_url http://localhost:8000
"""

import logging
import random
from enum import Enum
from typing import Any, Dict, List, Optional, Tuple

from pydantic import Field

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.local_data import read_local_rows
from atroposlib.type_definitions import Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

logger = logging.getLogger(__name__)

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "tool": "tool"}


class DatasetFormat(Enum):
    COMPLETION = "completion"
    PREFIXED_COMPLETION = "prefix_completion"
    OAI_FORMAT = "oai_format"
    SHAREGPT_FORMAT = "sharegpt_format"


class SFTConfig(BaseEnvConfig):
    dataset_name: str = Field(default="gsm8k", description="Hugging Face dataset whose train split is sent")
    dataset_format: DatasetFormat = Field(default=DatasetFormat.COMPLETION, description="How a row is laid out")
    dataset_column_name: str = Field(default="text", description="Column holding the text or the conversation")
    prefix_column_name: Optional[str] = Field(
        default=None, description="Column holding the untrained prefix (prefix_completion)"
    )
    mask_everything_but_assistant_answer: bool = Field(
        default=True, description="Chats: train on the assistant turns only"
    )
    mask_everything_but_last_step: bool = Field(default=False, description="Chats: train on the last message only")
    max_sft_per_step: int = Field(default=-1, description="Examples sent per trainer step at most; -1: no cap")
    add_every_n_steps: int = Field(default=1, description="Send examples on trainer steps that are multiples of this")
    train_file: Optional[str] = Field(
        default=None, description="Local JSONL/JSON/CSV/Parquet file used instead of the hub dataset"
    )


class SFTEnv(BaseEnv):
    name = "sft_loader"
    env_config_cls = SFTConfig

    def __init__(self, config: SFTConfig, server_configs: List[APIServerConfig], slurm=True, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        if config.ensure_scores_are_not_same:
            logger.warning("sft_loader: an SFT group holds one example, so ensure_scores_are_not_same would drop "
                           "every group; turning it off")
            config.ensure_scores_are_not_same = False
        self.train: Any = []
        self.idx = 0
        self.last_step = -1
        self.step_budget = 0

    @classmethod
    def config_init(cls) -> Tuple[BaseEnvConfig, List[APIServerConfig]]:
        env_config = SFTConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview", group_size=8, use_wandb=True,
            rollout_server_url="http://localhost:8000", total_steps=1000, batch_size=12, steps_per_eval=100,
            max_token_length=2048, ensure_scores_are_not_same=False, wandb_name="sft",
            dataset_name="AlignmentLab-AI/open-instruct-sharegpt", dataset_format=DatasetFormat.SHAREGPT_FORMAT,
            dataset_column_name="conversations", inference_weight=-1, max_sft_per_step=8,
        )
        server_configs = [APIServerConfig(model_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
                                          base_url="http://localhost:9001/v1", api_key="x", num_requests_for_eval=256)]
        return env_config, server_configs

    async def setup(self):
        if self.config.train_file:
            self.train = read_local_rows(self.config.train_file)
            random.Random(42).shuffle(self.train)
        else:
            from datasets import load_dataset

            self.train = load_dataset(self.config.dataset_name, split="train").shuffle(seed=42)
        if len(self.train) == 0:
            raise ValueError(f"no rows in {self.config.train_file or self.config.dataset_name}")
        needed = [self.config.dataset_column_name]
        if self.config.dataset_format == DatasetFormat.PREFIXED_COMPLETION:
            needed.append(self.config.prefix_column_name or "(prefix_column_name is not set)")
        missing = [column for column in needed if column not in self.train[0]]
        if missing:
            raise ValueError(f"column {missing[0]!r} is not in the dataset (columns: {', '.join(self.train[0])})")
        self.idx = 0

    # -- how many examples go out ----------------------------------------------------------------
    def _remaining_for_this_step(self) -> Optional[int]:
        """Examples still allowed at the trainer's current step; None when unlimited (process mode)."""
        status = self.status_dict
        if not status:
            return None
        step = status["current_step"]
        if step != self.last_step:
            self.last_step = step
            self.step_budget = self._examples_for_step(step, status["queue_size"])
        return self.step_budget

    def _examples_for_step(self, step: int, queue_size: int) -> int:
        config = self.config
        if step % max(1, config.add_every_n_steps):
            return 0
        if config.max_batches_offpolicy > 0:
            room = config.max_batches_offpolicy * config.batch_size - queue_size
        else:
            room = config.batch_size
        if config.max_sft_per_step != -1:
            room = min(room, config.max_sft_per_step)
        return max(0, room)

    async def get_next_item(self) -> Optional[Item]:
        remaining = self._remaining_for_this_step()
        if remaining is not None:
            if remaining <= 0:
                return None
            self.step_budget -= 1
        item = self.train[self.idx % len(self.train)]
        self.idx += 1
        return item

    # -- formatting ------------------------------------------------------------------------------
    def _conversation(self, item: Dict[str, Any]) -> List[Dict[str, str]]:
        turns = item[self.config.dataset_column_name]
        if self.config.dataset_format == DatasetFormat.OAI_FORMAT:
            return [{"role": turn["role"], "content": turn["content"]} for turn in turns]
        messages = []
        for turn in turns:
            role = SHAREGPT_ROLES.get(turn["from"])
            if role is None:
                raise ValueError(f"unknown ShareGPT speaker {turn['from']!r} (known: {', '.join(SHAREGPT_ROLES)})")
            messages.append({"role": role, "content": turn["value"]})
        return messages

    def _tokens_and_masks(self, item: Dict[str, Any]) -> Tuple[List[int], List[int], List[Dict[str, str]]]:
        config, tokenizer = self.config, self.tokenizer
        if config.dataset_format == DatasetFormat.COMPLETION:
            text = item[config.dataset_column_name]
            tokens = tokenizer.encode(text)
            return tokens, list(tokens), [{"role": "assistant", "content": text}]
        if config.dataset_format == DatasetFormat.PREFIXED_COMPLETION:
            prefix, completion = item[config.prefix_column_name], item[config.dataset_column_name]
            tokens = tokenizer.encode(prefix + completion)
            prefix_tokens = tokenizer.encode(prefix)
            if prefix_tokens and prefix_tokens[-1] == tokenizer.eos_token_id:
                prefix_tokens = prefix_tokens[:-1]
            masks = [-100] * len(prefix_tokens) + tokens[len(prefix_tokens):]
            return tokens, masks, [{"role": "user", "content": prefix}, {"role": "assistant", "content": completion}]
        messages = self._conversation(item)
        if config.mask_everything_but_last_step:
            out = tokenize_for_trainer(tokenizer, messages)
        elif config.mask_everything_but_assistant_answer:
            out = tokenize_for_trainer(tokenizer, messages, train_on_all_assistant_turns=True)
        else:
            out = tokenize_for_trainer(tokenizer, messages)
            out["masks"] = list(out["tokens"])
        return out["tokens"], out["masks"], messages

    async def format_item(self, item: Item) -> ScoredDataGroup:
        """One example as a schema-valid single-sequence group flagged for SFT."""
        tokens, masks, messages = self._tokens_and_masks(item)
        return ScoredDataGroup(
            tokens=[tokens], masks=[masks], scores=[1.0], advantages=[[1.0] * len(tokens)],
            messages=[messages], overrides=[{"sft": True}], group_overrides={"sft": True, "group_size": 1},
        )

    async def collect_trajectories(self, item: Item) -> Tuple[Optional[ScoredDataGroup], List[Item]]:
        return await self.format_item(item), []

    async def evaluate(self, *args, **kwargs):
        """SFT data has nothing to evaluate."""

    async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
        wandb_metrics = dict(wandb_metrics or {})
        wandb_metrics["train/idx"] = self.idx
        wandb_metrics["train/epoch"] = self.idx // max(1, len(self.train))
        await super().wandb_log(wandb_metrics)


if __name__ == "__main__":
    SFTEnv.cli()
