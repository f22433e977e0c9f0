"""GSM8K: grade-school math word problems, reasoned in ``<think>`` and answered in ``\\boxed{}``.

The canonical Atropos example. Each group comes from a `managed_server()` chat call with
``n = group_size``, so every rollout carries the exact prompt/completion token ids, a
-100 prompt mask and the sampler's logprobs. Rollouts with fewer than 10 completion tokens
are not trained on; the few missing ones are sampled again (twice at most), so a group is
not thrown away for one short answer. A rollout scores 1 when the text after
``</think>`` verifies (math-verify) against the gold answer, else -1; when a whole group
is right, longer answers are penalised linearly above half of ``max_token_length``.

Data: the Hugging Face ``gsm8k`` (``main``) train/test splits, shuffled with seed 42. With
``--env.train_file`` / ``--env.test_file`` (JSONL with GSM8K's ``question`` and ``answer``
fields, the answer ending in ``#### <number>``) it runs offline.

    python environments/gsm8k_server.py serve --openai.server_type vllm \\
        --openai.base_url http://localhost:9001/v1 --openai.model_name MODEL
"""

import asyncio
import random
import time
from typing import Optional

from pydantic import Field

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.local_data import load_rows
from atroposlib.utils.length_penalty import all_right_length_scaled
from atroposlib.utils.math_answers import check_math_answer
from atroposlib.utils.reasoning_text import text_after_thinking

SYSTEM_PROMPT = (
    "You are a deep thinking AI. You may use extremely long chains of thought to deeply consider the problem "
    "and deliberate with yourself via systematic reasoning processes to help come to a correct solution prior "
    "to answering. You should enclose your thoughts and internal monologue inside <think> </think> tags, and "
    "then provide your solution or response to the problem.\n\n"
    "You are allocated a maximum of 2048 tokens, please strive to use less.\n\n"
    "You will then provide your answer like this: \\boxed{your answer here}\n"
    "It is important that you provide your answer in the correct format.\n"
    "If you do not, you will not receive credit for your answer.\n"
    "So please end your answer with \\boxed{your answer here}"
)
MIN_TRAINABLE_TOKENS = 10
TOP_UP_ATTEMPTS = 2


class GSM8kConfig(BaseEnvConfig):
    train_file: Optional[str] = Field(default=None, description="Local GSM8K-format JSONL used instead of the hub's train split.")
    test_file: Optional[str] = Field(default=None, description="Local GSM8K-format JSONL used instead of the hub's test split.")
    eval_limit: int = Field(default=-1, description="Evaluate on at most this many test problems; -1: all.")


def gold_answer(answer_field: str) -> str:
    """The number after ``####`` in a GSM8K answer, without thousands separators."""
    return answer_field.split("#")[-1].strip().replace(",", "")


def answer_is_correct(completion: str, gold: str) -> bool:
    """Whether the text after ``</think>`` states the gold answer (checked by math-verify)."""
    return check_math_answer(gold, text_after_thinking(completion)) is True


def _usable(rollout: dict) -> bool:
    """Whether a rollout has enough completion tokens to train on."""
    return sum(1 for mask in rollout["masks"] if mask != -100) >= MIN_TRAINABLE_TOKENS


class GSM8kEnv(BaseEnv):
    name = "gsm8k"
    env_config_cls = GSM8kConfig

    def __init__(self, config, server_configs, slurm=True, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        self.percent_correct_buffer = []
        self.eval_metrics = []
        self.iter = 0

    @classmethod
    def config_init(cls):
        env_config = GSM8kConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-3B-Preview", group_size=8, use_wandb=True,
            rollout_server_url="http://localhost:8000", total_steps=1000, batch_size=12, steps_per_eval=100,
            max_token_length=2048, wandb_name="gsm8k",
        )
        servers = [APIServerConfig(model_name="NousResearch/DeepHermes-3-Llama-3-3B-Preview",
                                   base_url="http://localhost:9001/v1", api_key="x", num_requests_for_eval=256)]
        return env_config, servers

    def _load_split(self, split: str, local_file: Optional[str]) -> list[dict]:
        rows = load_rows("gsm8k", "main", split=split, local_file=local_file)
        random.Random(42).shuffle(rows)
        return rows

    async def setup(self):
        self.train = self._load_split("train", self.config.train_file)
        test_rows = self._load_split("test", self.config.test_file)
        if self.config.eval_limit >= 0:
            test_rows = test_rows[: self.config.eval_limit]
        self.test = [{"question": row["question"], "gold_answer": gold_answer(row["answer"])} for row in test_rows]
        self.iter = 0

    def save_checkpoint(self, step, data=None):
        super().save_checkpoint(step, {"iter": self.iter} if data is None else data)

    async def get_next_item(self):
        row = self.train[self.iter % len(self.train)]
        self.iter += 1
        return {"question": row["question"], "answer": gold_answer(row["answer"])}

    def _prompt(self, question: str) -> list[dict]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]

    async def _sample(self, item, n: int) -> list[dict]:
        """`n` rollouts of `item` from one chat call, with their exact tokens, masks and logprobs."""
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=self._prompt(item["question"]), n=n, max_tokens=self.config.max_token_length,
                temperature=1.0,
            )
            nodes = managed.get_state()["nodes"]
        return [{
            "messages": self._prompt(item["question"]) + [{"role": "assistant", "content": choice.message.content}],
            "tokens": node.tokens, "masks": node.masked_tokens, "logprobs": node.logprobs,
            "finish_reason": choice.finish_reason,
        } for choice, node in zip(completion.choices, nodes)]

    async def collect_trajectories(self, item):
        rollouts = [r for r in await self._sample(item, self.config.group_size) if _usable(r)]
        # A rollout too short to train on would leave the group short, and a short group is
        # dropped whole: sample just the missing ones instead of wasting the others.
        for _ in range(TOP_UP_ATTEMPTS):
            missing = self.config.group_size - len(rollouts)
            if missing <= 0:
                break
            rollouts += [r for r in await self._sample(item, missing) if _usable(r)]
        return await self.score_group(rollouts, item["answer"]), []

    async def score_group(self, rollouts: list[dict], gold: str) -> Optional[ScoredDataGroup]:
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], inference_logprobs=[], messages=[])
        random.shuffle(rollouts)
        for rollout in rollouts:
            if not _usable(rollout):
                continue
            group["tokens"].append(rollout["tokens"])
            group["masks"].append(rollout["masks"])
            group["inference_logprobs"].append(rollout["logprobs"])
            group["messages"].append(rollout["messages"])
            group["scores"].append(self.correctness(rollout["messages"][-1]["content"], gold))
            if len(group["tokens"]) >= self.config.group_size:
                break
        if not group["tokens"]:
            return None
        self.percent_correct_buffer.extend(score > 0 for score in group["scores"])
        group["scores"] = self.with_length_penalty(group["scores"], group["tokens"])
        if self.config.ensure_scores_are_not_same and len(set(group["scores"])) == 1:
            return None
        return group

    @staticmethod
    def correctness(reply: str, gold: str) -> float:
        """1.0 when `reply` states the gold answer after its thinking, else -1.0."""
        return 1.0 if answer_is_correct(reply, gold) else -1.0

    def with_length_penalty(self, scores: list[float], tokens: list[list[int]]) -> list[float]:
        """All correct: keep 1.0 up to half the token budget, then fall linearly to 0."""
        return all_right_length_scaled(scores, tokens, self.config.max_token_length, 0.5)

    async def rescore_group(self, group, item) -> list[float]:
        scores = [self.correctness(reply, item["answer"]) for reply in self.completions(group)]
        return self.with_length_penalty(scores, group["tokens"])

    async def rollout_and_score_eval(self, problem: dict) -> dict:
        completion = await self.server.chat_completion(
            messages=self._prompt(problem["question"]), n=1, max_tokens=self.config.max_token_length,
            temperature=0.6, split="eval",
        )
        text = completion.choices[0].message.content or ""
        correct = answer_is_correct(text, problem["gold_answer"])
        return {"question": problem["question"], "gold_answer": problem["gold_answer"], "response": text,
                "score": 1.0 if correct else 0.0, "correct": correct, "finish_reason": completion.choices[0].finish_reason}

    async def evaluate(self, *args, **kwargs):
        start = time.time()
        samples = await asyncio.gather(*(self.rollout_and_score_eval(problem) for problem in self.test))
        percent_correct = sum(s["score"] for s in samples) / max(1, len(samples))
        self.eval_metrics.append(("eval/percent_correct", percent_correct))
        self.evaluate_log({"eval/percent_correct": percent_correct}, samples=list(samples), start_time=start,
                          end_time=time.time(), generation_parameters={"temperature": 0.6,
                                                                       "max_tokens": self.config.max_token_length})

    async def wandb_log(self, wandb_metrics=None):
        wandb_metrics = dict(wandb_metrics or {})
        if self.percent_correct_buffer:
            wandb_metrics["train/percent_correct"] = sum(self.percent_correct_buffer) / len(self.percent_correct_buffer)
            self.percent_correct_buffer = []
        for key, value in self.eval_metrics:
            wandb_metrics[key] = value
        self.eval_metrics = []
        await super().wandb_log(wandb_metrics)


if __name__ == "__main__":
    GSM8kEnv.cli()
