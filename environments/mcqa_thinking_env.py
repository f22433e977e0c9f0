"""Academic multiple-choice questions, reasoned in ``<think>`` and answered with a letter.

The model reasons inside one ``<think> ... </think>`` block and then states its choice
once, as ``The best answer is: X`` (also accepted: ``The correct answer is``, ``The
answer is``, ``Thus, final answer: X)``, ``\\boxed{X}``, or the option's full text after
one of those phrases). A rollout scores 1 for the right letter and -1 otherwise: a wrong
letter, a malformed think block, no answer statement or more than one, or a completion
cut off by the token limit. Rollouts with fewer than 10 completion tokens are dropped, as
are groups whose scores are all equal. Completions come from the plain completion
endpoint (the chat rendered by the tokenizer's template), so any OpenAI-compatible
server works.

Data: ``NousResearch/AcademicMCQA`` (``default``, train), shuffled with seed 42 and split
98/2 into train and test (seed 42). Offline: ``--env.train_file`` (rows with AcademicMCQA's
``prompt``, ``options``, ``answer`` (option index) and ``ground_truth`` (letter)), split the
same way, or with ``--env.test_file`` used as the test set as it is.

    # offline, with the fixtures
    python environments/mcqa_thinking_env.py process --openai.base_url http://localhost:9001/v1 \\
        --openai.model_name MODEL --env.tokenizer_name MODEL \\
        --env.train_file environments/fixtures/mcqa_thinking/academic_mcqa.jsonl --env.total_steps 4
    # for real
    python environments/mcqa_thinking_env.py serve --openai.base_url http://localhost:9004/v1
"""

import asyncio
import random
import re
import time
from typing import Dict, List, Optional, Tuple

from datasets import Dataset
from pydantic import Field

from atroposlib.envs.base import (
    APIServerConfig,
    BaseEnv,
    BaseEnvConfig,
    EvalHandlingEnum,
    ScoredDataGroup,
)
from atroposlib.envs.local_data import load_rows
from atroposlib.utils.reasoning_text import text_after_single_think_block
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

system_prompt = (
    "Work through the problem carefully before you answer. Reason step by step, for as long as you "
    "need, inside <think> and </think> tags; check your work there. After the closing tag, write your "
    "solution."
)

ANSWER_INSTRUCTION = (
    '\n\nAfter your reasoning, give your choice once, in the form "The best answer is: X", where X is the '
    "letter of the option you choose."
)
MAX_TOKENS = 1024 * 15
MIN_TRAINABLE_TOKENS = 10

_PHRASE = r"(?:the (?:correct |best )?answer is:?|thus,? final answer:)"
_LETTER_STATEMENT = re.compile(_PHRASE + r"\s*(?:\*\*)?\(?(?-i:([A-J]))\)?(?:\*\*)?(?![A-Za-z])", re.IGNORECASE)
_BOXED_LETTER = re.compile(r"\\boxed\{\s*([A-J])\s*\}")


class MCQAThinkingEnvConfig(BaseEnvConfig):
    train_file: Optional[str] = Field(
        None, description="Local AcademicMCQA-layout file used instead of the hub's train split."
    )
    test_file: Optional[str] = Field(
        None, description="Local AcademicMCQA-layout test set (default: 2% split off the training rows)."
    )


def extract_mcqa_answer(text: str, ground_truth_text: str, ground_truth_letter: str) -> Optional[str]:
    """The letter the response commits to, or None when the format is broken: not exactly
    one ``<think>`` before exactly one ``</think>``, or not exactly one answer statement
    after it."""
    answer = text_after_single_think_block(text)
    if answer is None:
        return None
    statements = [(m.start(), m.end(), m.group(1)) for m in _LETTER_STATEMENT.finditer(answer)]
    statements += [(m.start(), m.end(), m.group(1)) for m in _BOXED_LETTER.finditer(answer)]
    if ground_truth_text.strip():
        by_text = re.compile(_PHRASE + r"\s*(?:\*\*)?" + re.escape(ground_truth_text.strip()), re.IGNORECASE)
        statements += [(m.start(), m.end(), ground_truth_letter) for m in by_text.finditer(answer)]
    # one statement may be matched twice (a letter that is also the option's text): merge overlaps
    merged: List[Tuple[int, int, set]] = []
    for start, end, letter in sorted(statements):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]), merged[-1][2] | {letter})
        else:
            merged.append((start, end, {letter}))
    if len(merged) != 1 or len(merged[0][2]) != 1:
        return None
    return next(iter(merged[0][2]))


class MCQAThinkingEnv(BaseEnv):
    env_config_cls = MCQAThinkingEnvConfig

    def __init__(self, config: MCQAThinkingEnvConfig, server_configs: List[APIServerConfig], slurm=True, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        self.percent_correct_buffer = []
        self.eval_metrics = []
        self.iter = 0

    @classmethod
    def config_init(cls) -> Tuple[MCQAThinkingEnvConfig, List[APIServerConfig]]:
        env_config = MCQAThinkingEnvConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
            group_size=32,
            use_wandb=True,
            max_num_workers=128,
            rollout_server_url="http://localhost:8000",
            total_steps=2000,
            batch_size=1024,
            steps_per_eval=20,
            max_token_length=1024 * 15,
            inference_weight=1.0,
            wandb_name="mcqa_deep_thinking",
            data_path_to_save_groups=None,
            eval_handling=EvalHandlingEnum.LIMIT_TRAIN,
            eval_limit_ratio=0.1,
        )
        server_configs = [
            APIServerConfig(
                model_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
                base_url="http://localhost:9004/v1",
                api_key="x",
                num_max_requests_at_once=32,
                num_requests_for_eval=256,
            )
        ]
        return env_config, server_configs

    async def setup(self):
        rows = load_rows("NousResearch/AcademicMCQA", "default", split="train", local_file=self.config.train_file)
        full = Dataset.from_list(rows).shuffle(seed=42)
        if self.config.test_file:
            self.train = full
            self.test = Dataset.from_list(load_rows("NousResearch/AcademicMCQA", local_file=self.config.test_file))
        else:
            split = full.train_test_split(test_size=0.02, seed=42)
            self.train, self.test = split["train"], split["test"]
        self.iter = 0

    def save_checkpoint(self, step, data=None):
        super().save_checkpoint(step, {"iter": self.iter} if data is None else data)

    @staticmethod
    def _messages(row: Dict) -> List[Dict[str, str]]:
        return [{"role": "system", "content": system_prompt},
                {"role": "user", "content": row["prompt"] + ANSWER_INSTRUCTION}]

    async def get_next_item(self):
        row = self.train[self.iter % len(self.train)]
        self.iter += 1
        return {"messages": self._messages(row), "letter": row["ground_truth"],
                "answer_text": row["options"][row["answer"]]}

    def _prompt(self, messages: List[Dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    async def collect_trajectories(self, item) -> Tuple[Optional[ScoredDataGroup], List]:
        completions = await self.server.completion(
            prompt=self._prompt(item["messages"]), n=self.config.group_size, max_tokens=MAX_TOKENS, temperature=1.0,
        )
        rollouts = [(item["messages"] + [{"role": "assistant", "content": choice.text}], choice.finish_reason)
                    for choice in completions.choices]
        return await self.score(rollouts, item), []

    async def score(self, rollouts: List[Tuple[List[Dict], str]], item) -> Optional[ScoredDataGroup]:
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[], rescore_facts=[])
        random.shuffle(rollouts)
        for messages, finish_reason in rollouts:
            tokenized = tokenize_for_trainer(self.tokenizer, messages, finish_reason=finish_reason or "")
            if sum(1 for label in tokenized["masks"] if label != -100) < MIN_TRAINABLE_TOKENS:
                continue
            group["tokens"].append(tokenized["tokens"])
            group["masks"].append(tokenized["masks"])
            group["messages"].append(messages)
            group["scores"].append(self.correctness(messages[-1]["content"], finish_reason, item))
            group["rescore_facts"].append({"finish_reason": finish_reason})
            if len(group["tokens"]) >= self.config.group_size:
                break
        self.percent_correct_buffer.extend(max(score, 0.0) for score in group["scores"])
        if not group["scores"] or len(set(group["scores"])) == 1:
            return None
        return group

    @staticmethod
    def correctness(reply: str, finish_reason: Optional[str], item) -> float:
        """1.0 for the item's letter in a reply that was not cut off, else -1.0."""
        right = finish_reason != "length" and extract_mcqa_answer(
            reply, item["answer_text"], item["letter"]) == item["letter"]
        return 1.0 if right else -1.0

    async def rescore_group(self, group, item) -> List[float]:
        return [self.correctness(reply, finish_reason, item)
                for reply, finish_reason in zip(self.completions(group), self.saved_facts(group, "finish_reason"))]

    async def rollout_and_score_eval(self, row: Dict) -> dict:
        messages = self._messages(row)
        completion = await self.server.completion(
            prompt=self._prompt(messages), n=1, max_tokens=MAX_TOKENS, temperature=0.5, split="eval",
        )
        text = completion.choices[0].text
        chosen = extract_mcqa_answer(text, row["options"][row["answer"]], row["ground_truth"])
        correct = chosen is not None and chosen == row["ground_truth"]
        return {"messages": messages + [{"role": "assistant", "content": text}], "gold_answer": row["ground_truth"],
                "model_parsed": chosen or "", "score": 1.0 if correct else 0.0, "correct": correct,
                "finish_reason": completion.choices[0].finish_reason}

    async def evaluate(self, *args, **kwargs):
        start = time.time()
        samples = await asyncio.gather(*(self.rollout_and_score_eval(row) for row in self.test))
        if not samples:
            return
        percent_correct = sum(sample["score"] for sample in samples) / len(samples)
        self.eval_metrics.append(("eval/percent_correct", percent_correct))
        self.evaluate_log({"eval/percent_correct": percent_correct}, samples=list(samples), start_time=start,
                          end_time=time.time(), generation_parameters={"temperature": 0.5, "max_tokens": MAX_TOKENS})

    async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
        metrics = dict(wandb_metrics or {})
        if self.percent_correct_buffer:
            metrics["train/percent_correct"] = sum(self.percent_correct_buffer) / len(self.percent_correct_buffer)
        self.percent_correct_buffer = []
        metrics.update(dict(self.eval_metrics))
        self.eval_metrics = []
        await super().wandb_log(metrics)


if __name__ == "__main__":
    MCQAThinkingEnv.cli()
