"""Single tool call: think, then answer with the right call(s) in ``<tool_call>`` JSON blocks.

Each item is a Hermes-format function-calling conversation from XLAM: a system message
listing the available tools (prefixed with our instruction to reason inside ``<think>``),
a user request, and the gold assistant reply made of ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`` blocks. The prompt is rendered with the tokenizer's chat template and
sampled ``group_size`` times through the plain completions route (temperature 0.8, up to 15360
new tokens or what ``max_token_length`` leaves after the prompt), so any OpenAI-compatible
server works; tokens and masks come from `tokenize_for_trainer`.

Reward: every closed ``<tool_call>`` block of the reply is parsed as JSON (blocks that do not
parse are ignored); the reply scores +1 when its calls pair up one-to-one with the gold calls,
a call matching a gold call when it has every gold key with the same value (for a nested
object such as ``arguments``, every gold argument with the same value; extra keys are
allowed), else -1. No parsable call, a missing call or an unmatched extra call scores -1.
Rollouts with fewer than 10 trained tokens are dropped. When the whole group is right,
sequences longer than half of ``max_token_length`` lose score linearly (down to 0 at the
limit); a group whose scores are all equal yields nothing. Evaluation: 100 held-out
conversations, one sample each at temperature 1.0, ``eval/percent_correct``.

Data: the Hugging Face ``NousResearch/XLAM-Atropos`` (``default`` config, train split),
shuffled with seed 42, of which 100 rows (``train_test_split(test_size=100, seed=42)``) are
held out for evaluation. ``--env.train_file`` / ``--env.test_file`` read local files with the
same ``conversations`` column (``from``: system/human/gpt, ``value``); a train file alone is
shuffled and split the same way (keeping at most a fifth of it for the test split). Tiny
ones ship in ``environments/fixtures/tool_calling/``.

    # offline, with the bundled conversations
    python environments/tool_calling_server.py process \\
        --env.train_file environments/fixtures/tool_calling/train.jsonl \\
        --env.test_file environments/fixtures/tool_calling/test.jsonl --env.group_size 4 --env.total_steps 4 \\
        --env.data_path_to_save_groups tool_calling.jsonl --openai.base_url http://localhost:9004/v1 \\
        --openai.model_name MODEL --env.tokenizer_name MODEL --env.use_wandb false
    # for real
    python environments/tool_calling_server.py serve --openai.base_url http://localhost:9004/v1 \\
        --openai.model_name MODEL
"""

import asyncio
import json
import logging
import random
import re
import time
from typing import Any, Dict, List, Optional, Tuple

from pydantic import Field

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, EvalHandlingEnum, Item, ScoredDataGroup
from atroposlib.envs.local_data import load_rows
from atroposlib.utils.length_penalty import all_right_length_scaled
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

system_prompt = (
    "You are a deliberate assistant that reasons before it acts. Think the request through step by step, "
    "as long as you need, inside <think> </think> tags; after the closing tag, give your response."
)

logger = logging.getLogger(__name__)
TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
HELD_OUT = 100
MIN_TRAINED_TOKENS = 10
MAX_NEW_TOKENS = 1024 * 15


def extract_tool_calls(text: str) -> List[Any]:
    """The JSON value of every closed ``<tool_call>`` block in `text`, in order; blocks that
    are not valid JSON are skipped."""
    calls = []
    for body in TOOL_CALL_BLOCK.findall(text or ""):
        try:
            calls.append(json.loads(body))
        except json.JSONDecodeError:
            continue
    return calls


def call_matches(call: Any, gold: Any) -> bool:
    """Whether `call` has every key of the `gold` call with the gold value; for a value that is
    an object on both sides (the arguments), every gold entry must be present and equal."""
    if not isinstance(call, dict) or not isinstance(gold, dict):
        return False
    for key, gold_value in gold.items():
        if key not in call:
            return False
        value = call[key]
        if isinstance(gold_value, dict) and isinstance(value, dict):
            if any(name not in value or value[name] != expected for name, expected in gold_value.items()):
                return False
        elif value != gold_value:
            return False
    return True


def tool_calls_match(response: str, expected_response: str) -> bool:
    """Whether the calls of `response` pair up one-to-one with those of `expected_response`."""
    calls, remaining = extract_tool_calls(response), extract_tool_calls(expected_response)
    if not calls or not remaining:
        return False
    for call in calls:
        partner = next((i for i, gold in enumerate(remaining) if call_matches(call, gold)), None)
        if partner is None:
            return False
        remaining.pop(partner)
    return not remaining


def split_conversation(conversations: List[Dict[str, str]]) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """The first system, human and gpt values of a ShareGPT-style conversation."""
    def first(role: str) -> Optional[str]:
        return next((turn["value"] for turn in conversations if turn["from"] == role), None)

    return first("system"), first("human"), first("gpt")


def prompt_messages(system: Optional[str], human: Optional[str]) -> List[Dict[str, str]]:
    messages = []
    if system is not None:
        messages.append({"role": "system", "content": system_prompt + "\n\n" + system})
    if human is not None:
        messages.append({"role": "user", "content": human})
    return messages


class ToolCallingConfig(BaseEnvConfig):
    train_file: Optional[str] = Field(
        default=None, description="Local file in XLAM-Atropos's layout ('conversations'), used instead of the hub."
    )
    test_file: Optional[str] = Field(
        default=None, description="Local evaluation file in the same layout (default: held out from the train data)."
    )


class SingleToolCallingEnv(BaseEnv):
    env_config_cls = ToolCallingConfig

    def __init__(self, config: ToolCallingConfig, server_configs: List[APIServerConfig], slurm=True, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        self.percent_correct_buffer = []
        self.eval_metrics = []
        self.rollouts_for_wandb = []
        self.completion_lengths = []
        self.iter = 0

    @classmethod
    def config_init(cls) -> Tuple[ToolCallingConfig, List[APIServerConfig]]:
        env_config = ToolCallingConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
            group_size=16,
            use_wandb=True,
            max_num_workers_per_node=16,
            rollout_server_url="http://localhost:8000",
            total_steps=2000,
            batch_size=1024,
            steps_per_eval=25,
            max_token_length=1024 * 16,
            inference_weight=1.0,
            wandb_name="toolcall_think",
            eval_handling=EvalHandlingEnum.LIMIT_TRAIN,
            eval_limit_ratio=0.1,
            min_batch_allocation=0.1,
        )
        server_configs = [
            APIServerConfig(
                model_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
                base_url="http://localhost:9004/v1",
                api_key="x",
                num_max_requests_at_once=32,
                num_requests_for_eval=256,
            ),
        ]
        return env_config, server_configs

    async def setup(self):
        from datasets import Dataset

        rows = load_rows("NousResearch/XLAM-Atropos", "default", split="train", local_file=self.config.train_file)
        if self.config.test_file:
            order = Dataset.from_dict({"row": list(range(len(rows)))}).shuffle(seed=42)["row"]
            self.train = [rows[i] for i in order]
            self.test = load_rows("NousResearch/XLAM-Atropos", local_file=self.config.test_file)
        else:
            # The same permutation and held-out rows as shuffling and splitting the hub dataset itself.
            held_out = HELD_OUT if not self.config.train_file else min(HELD_OUT, len(rows) // 5)
            indices = Dataset.from_dict({"row": list(range(len(rows)))}).shuffle(seed=42)
            if held_out:
                split = indices.train_test_split(test_size=held_out, seed=42)
                self.train = [rows[i] for i in split["train"]["row"]]
                self.test = [rows[i] for i in split["test"]["row"]]
            else:
                self.train, self.test = [rows[i] for i in indices["row"]], []
        if not self.train:
            raise ValueError("the tool-calling dataset has no training rows")
        self.iter = 0

    def save_checkpoint(self, step, data=None):
        data = {} if data is None else data
        data["iter"] = self.iter
        super().save_checkpoint(step, data)

    async def get_next_item(self):
        row = self.train[self.iter % len(self.train)]
        self.iter += 1
        system, human, gpt = split_conversation(row["conversations"])
        prompt = tuple(frozenset(message.items()) for message in prompt_messages(system, human))
        return (prompt, gpt or "")

    async def collect_trajectories(self, item) -> Tuple[Optional[ScoredDataGroup], List]:
        messages = [dict(message) for message in item[0]]
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        completions = await self.server.completion(
            prompt=prompt, n=self.config.group_size, max_tokens=self._room(prompt), temperature=0.8
        )
        to_score = [
            (tuple(messages + [{"role": "assistant", "content": choice.text}]), item[1])
            for choice in completions.choices
        ]
        return await self.score(to_score), []

    def _room(self, prompt: str) -> int:
        """15360 new tokens, or fewer when the prompt leaves less room in max_token_length."""
        used = len(self.tokenizer.encode(prompt, add_special_tokens=False))
        return max(1, min(MAX_NEW_TOKENS, self.config.max_token_length - used))

    @staticmethod
    def correctness(reply: str, expected: str) -> float:
        """1.0 when the reply's tool calls pair up with the gold ones, else -1.0."""
        return 1.0 if tool_calls_match(reply, expected) else -1.0

    def with_length_penalty(self, scores: List[float], tokens: List[List[int]]) -> List[float]:
        """All right: 1.0 up to half of max_token_length, then linearly down to 0.0 at max_token_length."""
        return all_right_length_scaled(scores, tokens, self.config.max_token_length, 0.5)

    def item_for_saving(self, item: Item) -> Dict[str, str]:
        """What scoring needs of an item (its prompt is a tuple of frozensets, which JSON cannot hold)."""
        return {"expected": item[1]}

    async def rescore_group(self, group, item) -> List[float]:
        scores = [self.correctness(reply, item["expected"]) for reply in self.completions(group)]
        return self.with_length_penalty(scores, group["tokens"])

    async def score(self, rollout_group_data) -> Optional[ScoredDataGroup]:
        if not extract_tool_calls(rollout_group_data[0][1]):
            logger.info("group left out: the row's gold answer has no usable tool call")
            return None
        rollout_group_data = list(rollout_group_data)
        random.shuffle(rollout_group_data)
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
        for chat, expected in rollout_group_data:
            chat = [dict(message) for message in chat]
            tokenized = tokenize_for_trainer(self.tokenizer, chat)
            if sum(1 for mask in tokenized["masks"] if mask != -100) < MIN_TRAINED_TOKENS:
                continue
            group["tokens"].append(tokenized["tokens"])
            group["masks"].append(tokenized["masks"])
            group["messages"].append(chat)
            group["scores"].append(self.correctness(chat[-1]["content"], expected))
            if len(group["tokens"]) >= self.config.group_size:
                break
        if not group["tokens"]:
            logger.info("group left out: no answer has %d trained tokens or more", MIN_TRAINED_TOKENS)
            return None
        self.percent_correct_buffer.extend(max(score, 0.0) for score in group["scores"])
        group["scores"] = self.with_length_penalty(group["scores"], group["tokens"])
        if all(score == group["scores"][0] for score in group["scores"]):
            logger.info("group left out: all %d answers scored %g (%s), so it carries no learning signal",
                        len(group["scores"]), group["scores"][0],
                        "every tool call right" if group["scores"][0] > 0 else "no tool call matched the gold calls")
            return None
        return group

    async def rollout_and_score_eval(self, test_item) -> Dict[str, Any]:
        system, human, gpt = split_conversation(test_item["conversations"])
        if human is None or gpt is None:
            return {"score": 0, "sample": None}
        messages = prompt_messages(system, human)
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        completion = await self.server.completion(
            prompt=prompt, n=1, max_tokens=self._room(prompt), temperature=1.0, split="eval"
        )
        response = completion.choices[0].text
        correct = tool_calls_match(response, gpt)
        sample = {
            "messages": messages + [{"role": "assistant", "content": response}],
            "expected_tool_calls": gpt,
            "model_tool_calls": response,
            "score": int(correct),
            "correct": correct,
            "finish_reason": completion.choices[0].finish_reason,
        }
        return {"score": int(correct), "sample": sample}

    async def evaluate(self, *args, **kwargs):
        start = time.time()
        results = await asyncio.gather(*(self.rollout_and_score_eval(row) for row in self.test))
        results = [result for result in results if result["sample"] is not None]
        percent_correct = sum(result["score"] for result in results) / len(results) if results else 0.0
        self.eval_metrics.append(("eval/percent_correct", percent_correct))
        self.evaluate_log(
            metrics={"eval/percent_correct": percent_correct},
            samples=[result["sample"] for result in results],
            start_time=start,
            end_time=time.time(),
            generation_parameters={"temperature": 1.0, "max_tokens": MAX_NEW_TOKENS},
        )

    async def add_rollouts_for_wandb(self, scored_data: ScoredDataGroup, item: Item = None):
        keep = self.config.num_rollouts_per_group_for_logging
        count = len(scored_data["tokens"]) if keep == -1 else min(keep, len(scored_data["tokens"]))
        expected = item[1] if item is not None else ""
        self.rollouts_for_wandb.append(
            [(self.tokenizer.decode(scored_data["tokens"][i]), scored_data["scores"][i], expected)
             for i in range(count)]
        )
        while len(self.rollouts_for_wandb) > self.config.num_rollouts_to_keep:
            self.rollouts_for_wandb.pop(0)

    async def create_rollout_table(self, wandb_metrics: Dict) -> Dict:
        if self.rollouts_for_wandb and self.wandb.active:
            rows = [list(entry) for group in self.rollouts_for_wandb for entry in group]
            wandb_metrics["train/rollouts"] = self.wandb.table(["text", "score", "expected_tool_call"], rows)
        self.rollouts_for_wandb = []
        return wandb_metrics

    async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
        wandb_metrics = dict(wandb_metrics or {})
        if self.percent_correct_buffer:
            wandb_metrics["train/percent_correct"] = sum(self.percent_correct_buffer) / len(self.percent_correct_buffer)
        self.percent_correct_buffer = []
        for key, value in self.eval_metrics:
            wandb_metrics[key] = value
        self.eval_metrics = []
        wandb_metrics = await self.create_rollout_table(wandb_metrics)
        await super().wandb_log(wandb_metrics)


if __name__ == "__main__":
    SingleToolCallingEnv.cli()
