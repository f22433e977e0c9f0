"""Predict whether a company's fundamental metric is maintained, raised or reduced next quarter.

Each item gives a company's fundamentals, news and macroeconomic context and names a
metric (a dividend, a guidance figure, ...). The model reasons inside exactly one
``<think> ... </think>`` block and then states, once, ``The <metric> will be: <maintained |
raised | reduced> and the magnitude will be: <percentage>%``. The right direction is
worth 1 plus a magnitude bonus (1.0 exact, 0.9 within 1 point, 0.7 within 5, 0.5 within
10, 0.3 within 20, else 0); a wrong direction or a broken format is worth 0; a response
longer than 95 % of ``max_token_length`` tokens loses ``0.5 x length / max_token_length``.
The reward sent is binary: 1 for a positive total, else -1. Rollouts with fewer than 10
completion tokens are dropped, as are groups whose scores are all equal. Evaluation
reports direction accuracy, magnitude accuracy (over right directions) and the mean
combined score.

Generation uses `managed_server()` on the completion endpoint, so it needs a token-level
backend: ``--openai.server_type vllm`` (or sglang).

Data: ``NousResearch/company-fundamentals-prediction-lite`` (``default``, train: ``context``,
``fundamental_metric``, ``answer``, ``magnitude``), shuffled with seed 42 and split 95/5
(seed 42). Offline: ``--env.train_file`` in that layout, split the same way, or with
``--env.test_file`` as the test set.

    # offline, with the fixtures
    python environments/fundamental_prediction_environment.py process --openai.server_type vllm \\
        --openai.base_url http://localhost:9001/v1 --openai.model_name MODEL --env.tokenizer_name MODEL \\
        --env.train_file environments/fixtures/fundamental_prediction/fundamentals.jsonl --env.total_steps 4
    # for real
    python environments/fundamental_prediction_environment.py serve --openai.server_type vllm \\
        --openai.base_url http://localhost:9004/v1
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

system_prompt = (
    "You are a careful financial analyst. Before giving a prediction, reason through the evidence step "
    "by step, for as long as you need, inside <think> and </think> tags. After the closing tag, give your "
    "final prediction."
)

user_message_template = """Read the company data below (fundamentals, recent news and the \
macroeconomic backdrop) and predict what happens to the company's {fundamental_metric} next quarter: \
is it maintained, raised or reduced, and by how much?

End with your prediction in exactly this form:
"The {fundamental_metric} will be: {{answer}} and the magnitude will be: {{percentage}}%"
where {{answer}} is maintained, raised or reduced, and {{percentage}} is the expected change in \
percent (0% when maintained).

Data:

{context}"""

TRAIN_MAX_TOKENS = 1024 * 15
EVAL_MAX_TOKENS = 1024 * 16
MIN_TRAINABLE_TOKENS = 10
MAGNITUDE_TIERS = ((0.0, 1.0), (1.0, 0.9), (5.0, 0.7), (10.0, 0.5), (20.0, 0.3))


class FundamentalPredictionConfig(BaseEnvConfig):
    train_file: Optional[str] = Field(
        None, description="Local file in the dataset's layout, used instead of the hub's train split."
    )
    test_file: Optional[str] = Field(
        None, description="Local test set in the dataset's layout (default: 5% split off the training rows)."
    )


def magnitude_score(predicted, expected) -> float:
    """How close the predicted percentage is to the real one: 1.0 exact down to 0 beyond 20 points."""
    try:
        difference = abs(float(str(predicted).rstrip("%")) - float(str(expected).rstrip("%")))
    except (TypeError, ValueError):
        return 0.0
    for limit, score in MAGNITUDE_TIERS:
        if difference <= limit:
            return score
    return 0.0


def extract_prediction(text: str, fundamental_metric: str) -> Tuple[Optional[str], Optional[str]]:
    """(direction, magnitude) stated once after a single think block, else (None, None)."""
    answer = text_after_single_think_block(text)
    if answer is None:
        return None, None
    statement = re.compile(
        rf"The {re.escape(fundamental_metric)} will be:\s*(maintained|raised|reduced)\s*and\s*the\s*magnitude"
        r"\s*will\s*be:\s*([-+]?\d+(?:\.\d+)?)%",
        re.IGNORECASE,
    )
    found = statement.findall(answer)
    if len(found) != 1:
        return None, None
    direction, magnitude = found[0]
    return direction.lower(), magnitude


class FundamentalPredictionEnv(BaseEnv):
    env_config_cls = FundamentalPredictionConfig

    def __init__(self, config: FundamentalPredictionConfig, server_configs: List[APIServerConfig], slurm=True,
                 testing=False):
        super().__init__(config, server_configs, slurm, testing)
        self.percent_correct_buffer = []
        self.magnitude_accuracy_buffer = []
        self.eval_metrics = []
        self.iter = 0

    @classmethod
    def config_init(cls) -> Tuple[FundamentalPredictionConfig, List[APIServerConfig]]:
        env_config = FundamentalPredictionConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
            group_size=16,
            use_wandb=True,
            max_num_workers=128,
            rollout_server_url="http://localhost:8000",
            total_steps=2000,
            batch_size=1024,
            steps_per_eval=20,
            max_token_length=1024 * 16,
            inference_weight=1.0,
            wandb_name="fundamental_metric_prediction",
            data_path_to_save_groups=None,
            eval_handling=EvalHandlingEnum.LIMIT_TRAIN,
            eval_limit_ratio=0.1,
        )
        server_configs = [
            APIServerConfig(
                model_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
                base_url="http://localhost:9004/v1",
                api_key="x",
                num_requests_for_eval=256,
            )
        ]
        return env_config, server_configs

    async def setup(self):
        hub = "NousResearch/company-fundamentals-prediction-lite"
        full = Dataset.from_list(load_rows(hub, "default", split="train", local_file=self.config.train_file))
        full = full.shuffle(seed=42)
        if self.config.test_file:
            self.train, self.test = full, Dataset.from_list(load_rows(hub, local_file=self.config.test_file))
        else:
            split = full.train_test_split(test_size=0.05, seed=42)
            self.train, self.test = split["train"], split["test"]
        self.iter = 0

    def save_checkpoint(self, step, data=None):
        super().save_checkpoint(step, {"iter": self.iter} if data is None else data)

    @staticmethod
    def _messages(row: Dict) -> List[Dict[str, str]]:
        user = user_message_template.format(context=row["context"], fundamental_metric=row["fundamental_metric"])
        return [{"role": "system", "content": system_prompt}, {"role": "user", "content": user}]

    async def get_next_item(self):
        row = self.train[self.iter % len(self.train)]
        self.iter += 1
        return {"messages": self._messages(row), "answer": row["answer"], "magnitude": row["magnitude"],
                "fundamental_metric": row["fundamental_metric"]}

    def _room(self, prompt: str, wanted: int) -> int:
        """`wanted` new tokens, or fewer when the prompt leaves less room in max_token_length
        (a server refuses a request longer than its context)."""
        used = len(self.tokenizer.encode(prompt, add_special_tokens=False))
        return max(1, min(wanted, self.config.max_token_length - used))

    async def collect_trajectories(self, item) -> Tuple[Optional[ScoredDataGroup], List]:
        prompt = self.tokenizer.apply_chat_template(item["messages"], add_generation_prompt=True, tokenize=False)
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.completion(
                prompt=prompt, n=self.config.group_size, max_tokens=self._room(prompt, TRAIN_MAX_TOKENS), temperature=0.8,
            )
            nodes = managed.get_state()["nodes"]
        rollouts = [{
            "messages": item["messages"] + [{"role": "assistant", "content": choice.text}],
            "tokens": node.tokens, "masks": node.masked_tokens, "logprobs": node.logprobs,
        } for choice, node in zip(completion.choices, nodes)]
        return await self.score(rollouts, item), []

    def reward(self, response: str, item) -> Tuple[float, Optional[str], Optional[str]]:
        """(total reward before binarisation, predicted direction, predicted magnitude)."""
        direction, magnitude = extract_prediction(response, item["fundamental_metric"])
        total = 0.0
        if direction is not None and direction == item["answer"]:
            total = 1.0 + magnitude_score(magnitude, item["magnitude"])
        response_tokens = len(self.tokenizer.encode(response, add_special_tokens=False))
        if response_tokens > 0.95 * self.config.max_token_length:
            total -= 0.5 * response_tokens / self.config.max_token_length
        return total, direction, magnitude

    @staticmethod
    def binarised(total: float) -> float:
        """A rollout's score from its total reward: 1.0 above 0, else -1.0."""
        return 1.0 if total > 0 else -1.0

    async def rescore_group(self, group, item) -> List[float]:
        return [self.binarised(self.reward(reply, item)[0]) for reply in self.completions(group)]

    async def score(self, rollouts: List[Dict], item) -> Optional[ScoredDataGroup]:
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[], inference_logprobs=[])
        random.shuffle(rollouts)
        for rollout in rollouts:
            total, direction, magnitude = self.reward(rollout["messages"][-1]["content"], item)
            if sum(1 for label in rollout["masks"] if label != -100) < MIN_TRAINABLE_TOKENS:
                continue
            group["tokens"].append(rollout["tokens"])
            group["masks"].append(rollout["masks"])
            group["inference_logprobs"].append(rollout["logprobs"])
            group["messages"].append(rollout["messages"])
            group["scores"].append(self.binarised(total))
            right_direction = direction is not None and direction == item["answer"]
            self.percent_correct_buffer.append(1.0 if right_direction else 0.0)
            if right_direction:
                self.magnitude_accuracy_buffer.append(magnitude_score(magnitude, item["magnitude"]))
            if len(group["tokens"]) >= self.config.group_size:
                break
        if not group["scores"] or len(set(group["scores"])) == 1:
            return None
        return group

    async def rollout_and_score_eval(self, row: Dict) -> dict:
        messages = self._messages(row)
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        completion = await self.server.completion(
            prompt=prompt, n=1, max_tokens=self._room(prompt, EVAL_MAX_TOKENS), temperature=0.2, split="eval",
        )
        text = completion.choices[0].text
        direction, magnitude = extract_prediction(text, row["fundamental_metric"])
        direction_score = 1 if direction is not None and direction == row["answer"] else 0
        magnitude_points = magnitude_score(magnitude, row["magnitude"]) if direction_score else 0.0
        return {"messages": messages + [{"role": "assistant", "content": text}],
                "gold_answer": f"{row['answer']} {row['magnitude']}%",
                "model_parsed": f"{direction} {magnitude}%" if direction else "",
                "direction_score": direction_score, "magnitude_score": magnitude_points,
                "combined_score": (1 + magnitude_points) if direction_score else 0.0,
                "score": float(direction_score), "correct": bool(direction_score),
                "finish_reason": completion.choices[0].finish_reason}

    async def evaluate(self, *args, **kwargs):
        if not len(self.test):
            return
        start = time.time()
        samples = await asyncio.gather(*(self.rollout_and_score_eval(row) for row in self.test))
        directions = [s["direction_score"] for s in samples]
        magnitudes = [s["magnitude_score"] for s in samples if s["direction_score"] == 1]
        metrics = {
            "eval/direction_accuracy": sum(directions) / len(directions),
            "eval/magnitude_accuracy": sum(magnitudes) / len(magnitudes) if magnitudes else 0.0,
            "eval/combined_score": sum(s["combined_score"] for s in samples) / len(samples),
        }
        self.eval_metrics.extend(metrics.items())
        self.evaluate_log(metrics, samples=list(samples), start_time=start, end_time=time.time(),
                          generation_parameters={"temperature": 0.2, "max_tokens": EVAL_MAX_TOKENS})

    async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
        metrics = dict(wandb_metrics or {})
        direction = magnitude = None
        if self.percent_correct_buffer:
            direction = sum(self.percent_correct_buffer) / len(self.percent_correct_buffer)
            metrics["train/direction_accuracy"] = direction
        if self.magnitude_accuracy_buffer:
            magnitude = sum(self.magnitude_accuracy_buffer) / len(self.magnitude_accuracy_buffer)
            metrics["train/magnitude_accuracy"] = magnitude
        if direction is not None:
            metrics["train/combined_score"] = direction + (magnitude or 0.0)
        self.percent_correct_buffer = []
        self.magnitude_accuracy_buffer = []
        metrics.update(dict(self.eval_metrics))
        self.eval_metrics = []
        await super().wandb_log(metrics)


if __name__ == "__main__":
    FundamentalPredictionEnv.cli()
