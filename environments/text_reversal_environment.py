"""Reverse a text character by character, answering inside ``<reversed_text>`` tags.

Each item is one text from the dataset; the expected answer is that text reversed. A
rollout scores 1.0 when the content of its single ``<reversed_text> ... </reversed_text>``
block (stripped) equals the expected reversal, else 0.0 (also for no block or several).
With ``thinking_mode`` (on in `config_init`) the response must hold exactly one
``<think> ... </think>`` block and only the part after it is read. Completions shorter than
``min_response_length`` characters are discarded; the request is repeated (up to
``max_retries``, ``retry_delay`` seconds apart) while fewer than half are usable. Rollouts
with fewer than 10 completion tokens are dropped, as are groups whose scores are all equal.

Data: ``NousResearch/TextReversalDataset`` (``text`` column; train split ``train``,
shuffled with seed 42, evaluation split ``test``). ``--env.train_dataset`` /
``--env.eval_dataset`` also take a local JSON Lines, JSON, CSV or Parquet file with a
``text`` column.

    # offline, with the fixtures
    python environments/text_reversal_environment.py process --openai.base_url http://localhost:9001/v1 \\
        --openai.model_name MODEL --env.tokenizer_name MODEL \\
        --env.train_dataset environments/fixtures/text_reversal/train.jsonl \\
        --env.eval_dataset environments/fixtures/text_reversal/test.jsonl --env.total_steps 4
    # for real
    python environments/text_reversal_environment.py serve --openai.base_url http://localhost:9004/v1
"""

import asyncio
import logging
import os
import random
import re
import time
from typing import Dict, List, Optional, Tuple

from pydantic import Field

from atroposlib.envs.base import (
    APIServerConfig,
    BaseEnv,
    BaseEnvConfig,
    EvalHandlingEnum,
    ScoredDataGroup,
)
from atroposlib.envs.local_data import load_rows
from atroposlib.utils.reasoning_text import text_after_single_think_block, text_after_thinking, thinking_content
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

log = logging.getLogger(__name__)

DEFAULT_THINKING_PROMPT = (
    "Work through the problem carefully before you answer. Reason step by step, for as long as you "
    "need, inside <think> and </think> tags; check your work there. After the closing tag, write your "
    "solution."
)
MIN_TRAINABLE_TOKENS = 10


class TextReversalConfig(BaseEnvConfig):
    thinking_mode: bool = Field(default=False, description="Ask for one <think></think> block before the answer.")
    custom_base_system_prompt: Optional[str] = Field(
        default=None, description="System prompt text (after the thinking prompt in thinking mode)."
    )
    custom_thinking_prompt: Optional[str] = Field(
        default=None, description="Thinking instructions replacing the default ones."
    )
    eval_temperature: float = Field(default=0.6, description="Sampling temperature of evaluation.")
    rollout_temperature: float = Field(default=1.0, description="Sampling temperature of training rollouts.")
    eval_max_tokens: int = Field(default=1024 * 16, description="Completion budget of evaluation.")
    train_max_tokens: int = Field(default=1024 * 7, description="Completion budget of training rollouts.")
    max_retries: int = Field(default=3, ge=1, description="Attempts per request when the server fails or answers emptily.")
    retry_delay: float = Field(default=1.0, ge=0.0, description="Seconds between attempts.")
    min_response_length: int = Field(
        default=5, ge=1, description="Responses shorter than this (characters) are treated as empty."
    )
    train_dataset: str = Field(
        default="NousResearch/TextReversalDataset", description="Hub dataset or local file for training."
    )
    eval_dataset: str = Field(
        default="NousResearch/TextReversalDataset", description="Hub dataset or local file for evaluation."
    )
    train_split: str = Field(default="train", description="Hub split for training.")
    eval_split: str = Field(default="test", description="Hub split for evaluation.")
    full_debug: bool = Field(default=False, description="Log every request and response (shortened).")


def _short(text: Optional[str]) -> str:
    text = (text or "").strip()
    return text if len(text) <= 200 else f"{text[:100]}...{text[-100:]} ({len(text)} chars)"


class TextReversalEnv(BaseEnv):
    name = "text_reversal"
    env_config_cls = TextReversalConfig

    def __init__(self, config: TextReversalConfig, server_configs: List[APIServerConfig], slurm=True, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        self.config: TextReversalConfig = config
        self.percent_correct_buffer = []
        self.eval_metrics = []
        self.successful_reversals = 0
        self.failed_reversals = 0
        self.format_errors = 0
        self.total_attempts = 0
        self.iter = 0
        self.thinking_system_prompt = config.custom_thinking_prompt or DEFAULT_THINKING_PROMPT
        self.base_system_prompt = config.custom_base_system_prompt or ""

    @classmethod
    def config_init(cls) -> Tuple[TextReversalConfig, List[APIServerConfig]]:
        env_config = TextReversalConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
            group_size=8,
            use_wandb=True,
            max_num_workers_per_node=8,
            rollout_server_url="http://localhost:8000",
            total_steps=2000,
            batch_size=1024,
            steps_per_eval=25,
            train_max_tokens=1024 * 7,
            eval_max_tokens=1024 * 8,
            inference_weight=1.0,
            wandb_name="text_reversal",
            eval_handling=EvalHandlingEnum.LIMIT_TRAIN,
            eval_limit_ratio=0.1,
            min_batch_allocation=0.1,
            thinking_mode=True,
            custom_base_system_prompt=None,
            full_debug=False,
            max_retries=3,
            retry_delay=1.0,
            min_response_length=5,
        )
        server_configs = [
            APIServerConfig(
                model_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
                base_url="http://localhost:9004/v1",
                api_key="x",
            )
        ]
        return env_config, server_configs

    # -- data ----------------------------------------------------------------------------------
    @staticmethod
    def _load(source: str, split: str) -> List[Dict]:
        """A hub dataset's split, or every row of a local file."""
        if os.path.exists(source):
            return load_rows(source, local_file=source)
        return load_rows(source, split=split)

    async def setup(self):
        train = self._load(self.config.train_dataset, self.config.train_split)
        random.Random(42).shuffle(train)
        self.train = [row for row in train if row.get("text")]
        self.test = [row for row in self._load(self.config.eval_dataset, self.config.eval_split) if row.get("text")]
        if not self.train:
            raise RuntimeError(f"no row with a 'text' value in {self.config.train_dataset}")
        self.iter = 0

    def save_checkpoint(self, step, data=None):
        super().save_checkpoint(step, {"iter": self.iter} if data is None else data)

    def _system_content(self) -> str:
        if self.config.thinking_mode:
            return f"{self.thinking_system_prompt}\n\n{self.base_system_prompt}"
        return self.base_system_prompt

    @staticmethod
    def _task(text: str) -> str:
        return ("Write the text below backwards, character by character (the last character first), and put "
                "only the result between <reversed_text> and </reversed_text> tags.\n\n"
                f"Text:\n{text}")

    def _item(self, text: str) -> dict:
        return {"messages": [{"role": "system", "content": self._system_content()},
                             {"role": "user", "content": self._task(text)}],
                "expected": text[::-1], "text": text}

    async def get_next_item(self):
        row = self.train[self.iter % len(self.train)]
        self.iter += 1
        return self._item(row["text"])

    # -- scoring ----------------------------------------------------------------------------------
    def extract_reversed_text(self, response: Optional[str]) -> Optional[str]:
        """The content of the single reversed_text block (after the think block in thinking
        mode), or None when the format is not met."""
        response = response or ""
        if self.config.thinking_mode:
            response = text_after_single_think_block(response)
            if response is None:
                return None
        blocks = re.findall(r"<reversed_text>\s*(.*?)\s*</reversed_text>", response, re.DOTALL)
        return blocks[0].strip() if len(blocks) == 1 else None

    @staticmethod
    def reward(extracted: Optional[str], expected: str) -> float:
        """1.0 for exactly the reversed text, else 0.0."""
        return 1.0 if extracted == expected else 0.0

    async def rescore_group(self, group, item) -> list[float]:
        return [self.reward(self.extract_reversed_text(reply), item["expected"]) for reply in self.completions(group)]

    def _debug(self, context: str, messages: List[Dict], choices=None) -> None:
        if not self.config.full_debug:
            return
        for message in messages:
            log.info("[%s] %s: %s", context, message["role"], _short(message["content"]))
        for i, choice in enumerate(choices or []):
            log.info("[%s] choice %d (%s): %s", context, i, choice.finish_reason, _short(choice.message.content))

    async def _complete(self, messages: List[Dict], context: str, usable_share: float, **params) -> List:
        """Usable choices of a chat completion, retried while fewer than `usable_share` of
        them are usable (at most max_retries attempts); [] if every attempt failed."""
        usable = []
        for attempt in range(self.config.max_retries):
            try:
                completion = await self.server.chat_completion(messages=messages, **params)
            except Exception as exc:
                log.warning("%s: request failed (attempt %d/%d): %s", context, attempt + 1, self.config.max_retries, exc)
                completion = None
            choices = completion.choices if completion is not None else []
            self._debug(context, messages, choices)
            usable = [c for c in choices if isinstance(c.message.content, str)
                      and len(c.message.content.strip()) >= self.config.min_response_length]
            if choices and len(usable) >= len(choices) * usable_share:
                return usable
            if attempt + 1 < self.config.max_retries:
                await asyncio.sleep(self.config.retry_delay)
        return usable

    async def collect_trajectories(self, item) -> Tuple[Optional[ScoredDataGroup], List]:
        choices = await self._complete(
            item["messages"], "train", 0.5, n=self.config.group_size, max_tokens=self.config.train_max_tokens,
            temperature=self.config.rollout_temperature,
        )
        if not choices:
            return None, []
        rollouts = [(item["messages"] + [{"role": "assistant", "content": c.message.content}], c.finish_reason)
                    for c in choices]
        return await self.score(rollouts, item["expected"]), []

    async def score(self, rollouts: List[Tuple[List[Dict], str]], expected: str) -> Optional[ScoredDataGroup]:
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
        random.shuffle(rollouts)
        for messages, finish_reason in rollouts:
            extracted = self.extract_reversed_text(messages[-1]["content"])
            reward = self.reward(extracted, expected)
            self.total_attempts += 1
            if reward:
                self.successful_reversals += 1
            else:
                self.failed_reversals += 1
                self.format_errors += extracted is None
            tokenized = tokenize_for_trainer(self.tokenizer, messages, finish_reason=finish_reason or "")
            if sum(1 for label in tokenized["masks"] if label != -100) < MIN_TRAINABLE_TOKENS:
                continue
            group["tokens"].append(tokenized["tokens"])
            group["masks"].append(tokenized["masks"])
            group["messages"].append(messages)
            group["scores"].append(reward)
            if len(group["tokens"]) >= self.config.group_size:
                break
        if not group["tokens"]:
            return None
        self.percent_correct_buffer.extend(group["scores"])
        if len(set(group["scores"])) == 1:
            return None
        return group

    # -- evaluation -------------------------------------------------------------------------------
    async def rollout_and_score_eval(self, row: Dict) -> Optional[dict]:
        item = self._item(row["text"])
        choices = await self._complete(
            item["messages"], "eval", 1.0, n=1, max_tokens=self.config.eval_max_tokens,
            temperature=self.config.eval_temperature, split="eval",
        )
        if not choices:
            return None
        response = choices[0].message.content
        extracted = self.extract_reversed_text(response)
        correct = extracted == item["expected"]
        sample = {
            "messages": item["messages"] + [{"role": "assistant", "content": response}],
            "original_text": row["text"], "expected_reversed": item["expected"], "extracted_reversed": extracted,
            "score": int(correct), "correct": correct, "finish_reason": choices[0].finish_reason,
            "thinking_mode": self.config.thinking_mode, "format_compliant": extracted is not None,
        }
        if self.config.thinking_mode:
            thinking = thinking_content(response)
            sample["response_after_think"] = text_after_thinking(response).strip()
            sample["thinking_content"] = thinking.strip() if thinking is not None else None
        return sample

    async def evaluate(self, *args, **kwargs):
        start = time.time()
        samples = [s for s in await asyncio.gather(*(self.rollout_and_score_eval(row) for row in self.test)) if s]
        if not samples:
            log.warning("text reversal evaluation: no usable responses")
            return
        lengths = [len(sample["messages"][-1]["content"]) for sample in samples]
        mean_length = sum(lengths) / len(lengths)
        metrics = {
            "eval/percent_correct": sum(s["score"] for s in samples) / len(samples),
            "eval/total_samples": len(samples),
            "eval/correct_samples": sum(s["score"] for s in samples),
            "eval/format_compliance_rate": sum(s["format_compliant"] for s in samples) / len(samples),
            "eval/avg_response_length": mean_length,
            "eval/response_length_std": (sum((x - mean_length) ** 2 for x in lengths) / len(lengths)) ** 0.5,
        }
        if self.config.thinking_mode:
            metrics["eval/thinking_utilization_rate"] = sum(bool(s["thinking_content"]) for s in samples) / len(samples)
        self.eval_metrics.extend(metrics.items())
        self.evaluate_log(metrics, samples=samples, start_time=start, end_time=time.time(),
                          generation_parameters={"temperature": self.config.eval_temperature,
                                                 "max_tokens": self.config.eval_max_tokens,
                                                 "thinking_mode": self.config.thinking_mode})

    async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
        metrics = dict(wandb_metrics or {})
        if self.percent_correct_buffer:
            metrics["train/percent_correct"] = sum(self.percent_correct_buffer) / len(self.percent_correct_buffer)
        if self.total_attempts:
            metrics["train/success_rate"] = self.successful_reversals / self.total_attempts
            metrics["train/failure_rate"] = self.failed_reversals / self.total_attempts
            metrics["train/format_error_rate"] = self.format_errors / self.total_attempts
            metrics["train/format_compliance_rate"] = 1.0 - self.format_errors / self.total_attempts
        metrics.update({
            "train/thinking_mode_enabled": 1.0 if self.config.thinking_mode else 0.0,
            "train/total_attempts": self.total_attempts,
            "train/successful_reversals": self.successful_reversals,
            "train/failed_reversals": self.failed_reversals,
            "train/format_errors": self.format_errors,
            "config/group_size": self.config.group_size,
            "config/train_max_tokens": self.config.train_max_tokens,
            "config/eval_max_tokens": self.config.eval_max_tokens,
        })
        self.percent_correct_buffer = []
        self.successful_reversals = self.failed_reversals = self.format_errors = self.total_attempts = 0
        metrics.update(dict(self.eval_metrics))
        self.eval_metrics = []
        await super().wandb_log(metrics)


if __name__ == "__main__":
    TextReversalEnv.cli()
