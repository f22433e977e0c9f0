"""Any Hugging Face dataset as an environment: prompts from one column, rewards from the registry.

Each item is a row's ``prompt_field`` (optionally after a ``system_prompt``; with a ``prefill``
the model continues an assistant turn that starts with it). One completion request with
``n = group_size`` is rendered through the tokenizer's chat template; every completion is
scored by the reward functions named in the config (`atroposlib.envs.reward_fns.registry`):
``reward_functions`` (names or ``{type, weight, params}`` dicts, several combined with their
weights normalised by the weights' sum) or the legacy ``reward_funcs`` (names, summed). The
rewards see the row's ``answer_field`` as ``solution`` and ``ground_truth_field`` as
``ground_truth``. With ``length_warmup_steps`` the generation budget grows linearly from
``min_tokens`` to ``max_tokens`` over that many trainer steps. Evaluation (``eval_dataset_*``)
scores one completion for each of the first ``max_eval_workers`` rows (at most 100) and reports
``eval/mean_score``, ``eval/max_score`` and ``eval/min_score``.

Data: ``dataset_name`` / ``dataset_config`` / ``split`` from the hub, or ``dataset_path``: a
local JSONL/JSON/CSV/Parquet file (or a dataset folder) in the same column layout; likewise
``eval_dataset_path`` for the evaluation split. Without flags it is GSM8K (``gsm8k``/``main``,
accuracy and format rewards). The YAML files in ``configs/`` use the launchers' layout
(`config_from_yaml`), read by ``dataset_local_server.py``.

    # offline, with the project's GSM8K-style fixture
    python environments/dataset_environment/dataset_env.py process \\
        --env.dataset_path environments/fixtures/dataset/train.jsonl \\
        --env.eval_dataset_path environments/fixtures/dataset/test.jsonl \\
        --openai.base_url http://localhost:9001/v1 --openai.model_name MODEL --env.tokenizer_name MODEL
    # for real: any dataset, rewards by name
    python environments/dataset_environment/dataset_env.py serve --env.dataset_name gsm8k \\
        --env.dataset_config main --env.prompt_field question --env.answer_field answer \\
        --env.reward_functions accuracy,format --openai.base_url http://localhost:9001/v1
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import yaml
from pydantic import Field, field_validator

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup, ScoredDataItem
from atroposlib.envs.local_data import read_local_rows
from atroposlib.envs.reward_fns import registry
from atroposlib.envs.reward_fns.combined_reward import CombinedReward
from atroposlib.type_definitions import Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

logger = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
DEFAULT_MODEL = "NousResearch/DeepHermes-3-Llama-3-8B-Preview"
DEFAULT_BASE_URL = "http://localhost:9004/v1"
EVAL_ROW_LIMIT = 100
THINKING_PROMPT = (
    "Reason about the problem step by step inside <think> </think> tags before you answer; take as "
    "long as you need there. After </think>, state the final answer on its own, in \\boxed{}."
)
ENV_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _name_list(value: Any) -> Any:
    """A command-line string as a list: JSON (``'["a", {"type": "b"}]'``) or comma-separated names."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        return json.loads(text)
    return [name.strip() for name in text.split(",") if name.strip()]


class DatasetEnvConfig(BaseEnvConfig):
    dataset_name: str = Field(..., description="Hugging Face dataset name")
    dataset_config: Optional[str] = Field(None, description="Dataset configuration name")
    split: str = Field("train", description="Dataset split to use")
    dataset_path: Optional[str] = Field(
        None, description="Local dataset (a JSONL/JSON/CSV/Parquet file or a dataset folder) used instead of the hub"
    )
    prompt_field: str = Field(..., description="Column holding the prompt")
    answer_field: Optional[str] = Field(None, description="Column holding the answer (passed to rewards as solution)")
    ground_truth_field: Optional[str] = Field(
        None, description="Column holding the canonical answer (passed to rewards as ground_truth)"
    )
    system_prompt: Optional[str] = Field(None, description="System prompt to use")
    prefill: Optional[str] = Field(None, description="Text the assistant turn starts with (e.g. '<think>\\n')")
    shuffle_dataset: bool = Field(True, description="Shuffle the training rows (seed 42)")
    max_generations_per_prompt: int = Field(
        1, description="Completions per prompt for collect_trajectory (groups always hold group_size)"
    )
    include_messages_in_scoring: bool = Field(False, description="Keep the conversations in the scored groups")
    reward_funcs: List[str] = Field(default_factory=list, description="Reward names, summed (legacy)")
    reward_functions: List[Union[str, Dict[str, Any]]] = Field(
        default_factory=list,
        description="Rewards: names or {type, weight, params} dicts; several are weighted and normalised",
    )
    temperature: float = Field(0.7, description="Sampling temperature")
    top_p: float = Field(0.9, description="Top-p for generation")
    max_tokens: int = Field(4096, description="Maximum tokens per completion")
    length_warmup_steps: int = Field(0, description="Trainer steps over which max_tokens grows from min_tokens")
    min_tokens: int = Field(0, description="Generation budget at step 0 when length_warmup_steps > 0")
    eval_dataset_name: Optional[str] = Field(None, description="Evaluation dataset name")
    eval_dataset_config: Optional[str] = Field(None, description="Evaluation dataset config")
    eval_split: Optional[str] = Field(None, description="Evaluation dataset split")
    eval_dataset_path: Optional[str] = Field(None, description="Local evaluation dataset used instead of the hub")

    @field_validator("reward_funcs", "reward_functions", mode="before")
    @classmethod
    def _names_from_text(cls, value: Any) -> Any:
        return [] if value is None else _name_list(value)


@dataclass
class Rollout:
    """One sampled conversation (prompt and completion) and why its generation stopped."""

    messages: List[Dict[str, str]]
    finish_reason: str


class _RewardLogger:
    """Lets reward functions log to the environment's W&B run at the current step."""

    def __init__(self, env: "DatasetEnv") -> None:
        self.env = env

    def log(self, metrics: Dict[str, Any]) -> None:
        self.env.wandb.log(metrics, step=self.env.curr_step)


def _rows(name: Optional[str], config: Optional[str], split: Optional[str], path: Optional[str]) -> Any:
    """A split's rows (random access): a local file, a dataset folder, or the hub."""
    from datasets import load_dataset

    if path and Path(path).expanduser().is_file():
        return read_local_rows(path)
    if path:
        return load_dataset(path, split=split)
    if not name:
        raise ValueError("no dataset: set dataset_name (hub) or dataset_path (local file)")
    return load_dataset(name, config, split=split)


class DatasetEnv(BaseEnv):
    name = "dataset"
    env_config_cls = DatasetEnvConfig

    def __init__(self, config: DatasetEnvConfig, server_configs, slurm=True, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        self.config = config
        self.dataset: Any = None
        self.eval_dataset: Any = None
        self.iter = 0
        self.metric_buffer: Dict[str, List[float]] = {}
        self.current_item: Optional[Item] = None
        self.reward_function = self._initialize_reward_function()
        if self.reward_function is None:
            logger.warning("DatasetEnv: no reward_functions or reward_funcs configured; every score is 0.0")

    @classmethod
    def config_init(cls) -> Tuple[DatasetEnvConfig, List[APIServerConfig]]:
        env_config = DatasetEnvConfig(
            tokenizer_name=DEFAULT_MODEL, group_size=8, use_wandb=True, rollout_server_url="http://localhost:8000",
            total_steps=1000, batch_size=1024, steps_per_eval=100, max_token_length=4096, wandb_name="dataset",
            dataset_name="gsm8k", dataset_config="main", split="train", prompt_field="question",
            answer_field="answer", system_prompt=THINKING_PROMPT,
            reward_functions=[
                {"type": "accuracy", "weight": 1.0, "params": {"split_on_think_tag": True}},
                {"type": "format", "weight": 0.2, "params": {"preferred_tags": ["think"]}},
            ],
            eval_dataset_name="gsm8k", eval_dataset_config="main", eval_split="test",
        )
        servers = [APIServerConfig(model_name=DEFAULT_MODEL, base_url=DEFAULT_BASE_URL, api_key="x",
                                   num_requests_for_eval=256)]
        return env_config, servers

    def _initialize_reward_function(self) -> Any:
        if self.config.reward_functions:
            if len(self.config.reward_functions) == 1:
                return registry.create(self.config.reward_functions[0])
            return CombinedReward(rewards=self.config.reward_functions, normalization="sum")
        if self.config.reward_funcs:
            if len(self.config.reward_funcs) == 1:
                return registry.create(self.config.reward_funcs[0])
            return CombinedReward(rewards=self.config.reward_funcs, normalization="none")
        return None

    # -- data -----------------------------------------------------------------------------------
    async def setup(self):
        config = self.config
        self.dataset = _rows(config.dataset_name, config.dataset_config, config.split, config.dataset_path)
        if len(self.dataset) == 0:
            raise ValueError(f"the training split of {config.dataset_path or config.dataset_name} is empty")
        if config.prompt_field not in self.dataset[0]:
            raise ValueError(f"prompt_field {config.prompt_field!r} is not a column of the dataset "
                             f"(columns: {', '.join(self.dataset[0])})")
        if config.shuffle_dataset:
            if isinstance(self.dataset, list):
                random.Random(42).shuffle(self.dataset)
            else:
                self.dataset = self.dataset.shuffle(seed=42)
        logger.info("dataset loaded: %d rows, columns %s", len(self.dataset), list(self.dataset[0]))
        self.iter = 0
        self.metric_buffer = {}

    def _item_from_row(self, row: Dict[str, Any]) -> Item:
        prompt = (frozenset({"role": "user", "content": row[self.config.prompt_field]}.items()),)
        answer = row.get(self.config.answer_field) if self.config.answer_field else None
        ground_truth = row.get(self.config.ground_truth_field) if self.config.ground_truth_field else None
        return (prompt, answer, ground_truth)

    async def get_next_item(self) -> Item:
        if self.dataset is None:
            await self.setup()
        row = self.dataset[self.iter % len(self.dataset)]
        self.iter += 1
        return self._item_from_row(row)

    def save_checkpoint(self, step, data=None):
        super().save_checkpoint(step, {"iter": self.iter} if data is None else data)

    # -- generation -----------------------------------------------------------------------------
    def _prompt_messages(self, user_content: str) -> List[Dict[str, str]]:
        messages = [{"role": "system", "content": self.config.system_prompt}] if self.config.system_prompt else []
        messages.append({"role": "user", "content": user_content})
        if self.config.prefill:
            messages.append({"role": "assistant", "content": self.config.prefill})
        return messages

    def _prompt_text(self, user_content: str) -> str:
        """The completion prompt: the chat rendered up to where the model writes (after the prefill)."""
        prefill = bool(self.config.prefill)
        return self.tokenizer.apply_chat_template(
            self._prompt_messages(user_content), tokenize=False,
            add_generation_prompt=not prefill, continue_final_message=prefill,
        )

    def generation_budget(self) -> int:
        """``max_tokens``, or during the length warm-up its linear ramp from ``min_tokens``."""
        config = self.config
        if config.length_warmup_steps <= 0:
            return config.max_tokens
        progress = min(1.0, self.curr_step / config.length_warmup_steps)
        return int(config.min_tokens + progress * (config.max_tokens - config.min_tokens))

    async def _sample(self, item: Item, n: int, split: str = "train") -> List[Rollout]:
        user_content = dict(item[0][0])["content"]
        completions = await self.server.completion(
            prompt=self._prompt_text(user_content), n=n, max_tokens=self.generation_budget(),
            temperature=self.config.temperature, top_p=self.config.top_p, split=split,
        )
        rollouts = []
        for choice in completions.choices:
            text = choice.text if getattr(choice, "text", None) is not None else choice.message.content
            response = (self.config.prefill or "") + (text or "")
            messages = [m for m in self._prompt_messages(user_content) if m["role"] != "assistant"]
            messages.append({"role": "assistant", "content": response})
            rollouts.append(Rollout(messages, choice.finish_reason or ""))
        return rollouts

    def _trainer_tokens(self, rollout: Rollout) -> Dict[str, List[int]]:
        """Tokens and masks; a prefill is part of the prompt, so it is not trained on."""
        out = tokenize_for_trainer(self.tokenizer, rollout.messages, finish_reason=rollout.finish_reason)
        if self.config.prefill:
            prompt_ids = self.tokenizer.encode(self._prompt_text(rollout.messages[-2]["content"]),
                                               add_special_tokens=False)
            if out["tokens"][: len(prompt_ids)] == prompt_ids:
                out["masks"] = [-100] * len(prompt_ids) + out["masks"][len(prompt_ids):]
        return out

    def _rewards(self, rollouts: List[Rollout], item: Item) -> List[float]:
        if self.reward_function is None or not rollouts:
            return [0.0] * len(rollouts)
        completions = [[rollout.messages[-1]] for rollout in rollouts]
        values = self.reward_function(completions, solution=item[1], ground_truth=item[2] if len(item) > 2 else None,
                                      item=item, config=self.config)
        return [float(v) for v in values]

    # -- scoring --------------------------------------------------------------------------------
    async def score(self, rollout_group_data: List[Rollout], item: Optional[Item] = None) -> Optional[ScoredDataGroup]:
        item = item if item is not None else self.current_item
        if not rollout_group_data or item is None:
            return None
        group = ScoredDataGroup(tokens=[], masks=[], scores=[])
        keep_messages = self.config.include_messages_in_scoring or self.config.include_messages
        if keep_messages:
            group["messages"] = []
        for rollout, reward in zip(rollout_group_data, self._rewards(rollout_group_data, item)):
            tokenized = self._trainer_tokens(rollout)
            group["tokens"].append(tokenized["tokens"])
            group["masks"].append(tokenized["masks"])
            group["scores"].append(reward)
            if keep_messages:
                group["messages"].append(rollout.messages)
        self.metric_buffer.setdefault("mean_score", []).append(statistics.fmean(group["scores"]))
        return group

    async def collect_trajectories(self, item: Item) -> Tuple[Optional[ScoredDataGroup], List[Item]]:
        self.current_item = item
        rollouts = await self._sample(item, self.config.group_size)
        return await self.score(rollouts, item), []

    async def collect_trajectory(self, item: Item) -> Tuple[Optional[ScoredDataItem], List[Item]]:
        rollouts = await self._sample(item, 1)
        if not rollouts:
            return None, []
        tokenized = self._trainer_tokens(rollouts[0])
        scored = ScoredDataItem(tokens=tokenized["tokens"], masks=tokenized["masks"],
                                scores=self._rewards(rollouts, item)[0], messages=rollouts[0].messages)
        return scored, []

    # -- evaluation and logging -------------------------------------------------------------------
    def _load_eval_items(self) -> List[Item]:
        config = self.config
        rows = _rows(config.eval_dataset_name, config.eval_dataset_config, config.eval_split or "test",
                     config.eval_dataset_path)
        count = min(EVAL_ROW_LIMIT, len(rows), config.max_eval_workers)
        return [self._item_from_row(rows[i]) for i in range(count)]

    async def _evaluate_item(self, item: Item) -> Dict[str, Any]:
        rollout = (await self._sample(item, 1, split="eval"))[0]
        score = self._rewards([rollout], item)[0]
        return {"messages": rollout.messages, "answer": item[1], "ground_truth": item[2], "score": score,
                "finish_reason": rollout.finish_reason}

    async def evaluate(self, *args, **kwargs):
        if not (self.config.eval_dataset_name or self.config.eval_dataset_path):
            return
        if self.eval_dataset is None:
            self.eval_dataset = self._load_eval_items()
        start = time.time()
        samples = await asyncio.gather(*(self._evaluate_item(item) for item in self.eval_dataset))
        scores = [sample["score"] for sample in samples]
        if not scores:
            return
        metrics = {"eval/mean_score": statistics.fmean(scores), "eval/max_score": max(scores),
                   "eval/min_score": min(scores)}
        self.evaluate_log(metrics, samples=list(samples), start_time=start, end_time=time.time(),
                          generation_parameters={"temperature": self.config.temperature, "top_p": self.config.top_p,
                                                 "max_tokens": self.generation_budget()})

    async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
        metrics = dict(wandb_metrics or {})
        for key, values in self.metric_buffer.items():
            if values:
                metrics[f"train/{key}"] = sum(values) / len(values)
        self.metric_buffer = {key: [] for key in self.metric_buffer}
        if self.wandb.active and self.reward_function is not None and self.reward_function.wandb_logger is None:
            self.reward_function.set_wandb_logger(_RewardLogger(self))
        await super().wandb_log(metrics)


# -- the launchers' YAML layout ------------------------------------------------------------------
def resolve_config_path(name_or_path: str) -> Path:
    """A config name (``gsm8k``), a file name in ``configs/``, or a path to a YAML file."""
    candidate = Path(name_or_path).expanduser()
    if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
        return candidate
    in_configs = CONFIG_DIR / (name_or_path if candidate.suffix in (".yaml", ".yml") else f"{name_or_path}.yaml")
    if in_configs.is_file():
        return in_configs
    known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
    raise FileNotFoundError(f"no dataset config {name_or_path!r} (a YAML path, or one of: {known})")


def _expand_env_vars(value: Any) -> Any:
    """``${VAR}`` in YAML strings replaced by the environment's value (empty when unset)."""
    if isinstance(value, str):
        return ENV_VAR.sub(lambda match: os.environ.get(match.group(1), ""), value)
    if isinstance(value, list):
        return [_expand_env_vars(v) for v in value]
    if isinstance(value, dict):
        return {k: _expand_env_vars(v) for k, v in value.items()}
    return value


def _server_config(entry: Dict[str, Any]) -> APIServerConfig:
    settings = {key: value for key, value in entry.items() if key in APIServerConfig.model_fields}
    ignored = sorted(set(entry) - set(settings))
    if ignored:
        logger.warning("server_configs: ignoring %s (not server settings)", ", ".join(ignored))
    settings.setdefault("model_name", os.environ.get("OPENAI_MODEL", DEFAULT_MODEL))
    settings.setdefault("base_url", os.environ.get("OPENAI_API_BASE", DEFAULT_BASE_URL))
    settings["api_key"] = settings.get("api_key") or os.environ.get("OPENAI_API_KEY") or "x"
    settings.setdefault("num_requests_for_eval", 256)
    return APIServerConfig(**settings)


def config_from_yaml(name_or_path: str) -> Tuple[DatasetEnvConfig, List[APIServerConfig]]:
    """Read a dataset config: environment fields at the top level, a ``dataset:`` block of
    `DatasetEnvConfig` fields (which win), and ``server_configs:`` (a default server when absent)."""
    path = resolve_config_path(name_or_path)
    document = _expand_env_vars(yaml.safe_load(path.read_text()) or {})
    if not isinstance(document, dict):
        raise ValueError(f"{path} must hold a mapping")
    fields = {k: v for k, v in document.items() if k not in ("dataset", "server_configs")}
    fields.update(document.get("dataset") or {})
    unknown = sorted(set(fields) - set(DatasetEnvConfig.model_fields))
    if unknown:
        logger.warning("%s: ignoring %s (not DatasetEnvConfig fields)", path.name, ", ".join(unknown))
    env_config = DatasetEnvConfig(**{k: v for k, v in fields.items() if k in DatasetEnvConfig.model_fields})
    servers = [_server_config(entry or {}) for entry in document.get("server_configs") or [{}]]
    return env_config, servers


if __name__ == "__main__":
    DatasetEnv.cli()
