"""Reasoning Gym: more than a hundred procedurally generated reasoning tasks, each with its own scorer.

Training items come from the installed ``reasoning-gym`` package (or a checkout in
``reasoning-gym/`` beside this file): each item picks a task at random from every task
that reasoning-gym registers and can build (``--env.tasks a,b`` narrows the list), and
generates one problem with a fresh seed. ``complexity_mode`` sets the difficulty:
``None`` uses each task's default settings, ``random`` a random difficulty per item, and
``curriculum`` one difficulty per task (starting at 0.3 of the range) that moves by steps
of 0.05 (0.1 when far off) so that the task's recent group accuracy stays near
``curriculum_target_accuracy``. A difficulty in [0, 1] is turned into task settings by the
task's own reasoning-gym curriculum (its levels), where the task has one. Some tasks take
minutes to generate at their top levels: an item that takes over 10 s is made with the
task's default settings instead, and that task's levels are capped below the slow one.

The model reasons in ``<think> ... </think>`` and gives one answer in ``<answer> ... </answer>``
after it. Reward: the task's own ``score_answer`` on the ``<answer>`` content (tried bare
and wrapped in ``<answer>`` tags, the better counts; clipped to [0, 1]); 0 when no answer
or more than one follows the thinking. When every rollout of a group scores at least 0.5,
those longer than 75 % of ``max_token_length`` lose score linearly. Rollouts cut off by
the length limit get ``set_advantage_to_zero`` (``mask_too_long_completions``); rollouts
with fewer than 10 generated tokens are not trained on; groups whose scores are all equal
are dropped. Text completions and `tokenize_for_trainer`: any OpenAI-compatible server.

Evaluation: the hub dataset ``dataset`` (``NousResearch/reasoning_gym``, split ``test``;
rows with ``question``, ``answer`` and ``metadata`` whose ``source_dataset`` names the
task, scored by that task's scorer) or ``--env.test_file`` in that layout
(``environments/fixtures/reasoning_gym/test.jsonl`` was generated with reasoning-gym);
when neither loads, ``num_eval_samples_per_task`` problems of up to 20 tasks are generated
with ``eval_seed``.

    python environments/reasoning_gym_environment/reasoning_gym_environment.py process \\
        --env.tasks chain_sum,leg_counting --env.total_steps 4 --env.tokenizer_name MODEL \\
        --env.test_file environments/fixtures/reasoning_gym/test.jsonl \\
        --openai.base_url http://localhost:9001/v1 --openai.model_name MODEL

    python environments/reasoning_gym_environment/reasoning_gym_environment.py serve \\
        --openai.base_url http://localhost:9004/v1 --openai.model_name MODEL --env.tokenizer_name MODEL
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import sys
import threading
import time
import uuid
from typing import Any, Literal, Optional

from pydantic import Field, field_validator

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, EvalHandlingEnum, ScoredDataGroup
from atroposlib.envs.local_data import load_rows
from atroposlib.type_definitions import Item
from atroposlib.utils.length_penalty import length_scaled_score
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

# A reasoning-gym checkout beside this file (Atropos keeps one as a git submodule) wins over
# the installed package.
_SUBMODULE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reasoning-gym")
if os.path.isdir(_SUBMODULE_DIR) and _SUBMODULE_DIR not in sys.path:
    sys.path.insert(0, _SUBMODULE_DIR)

try:
    import reasoning_gym
    from reasoning_gym import factory as rg_factory
except ImportError as _import_error:  # setup() says how to install it
    reasoning_gym = None
    rg_factory = None
    _REASONING_GYM_ERROR: Optional[ImportError] = _import_error
else:
    _REASONING_GYM_ERROR = None

MIN_TRAINABLE_TOKENS = 10
EVAL_TASKS = 20
EVAL_TEMPERATURE = 0.1
LENGTH_PENALTY_START = 0.75
CURRICULUM_START = 0.3
GENERATION_TIME_LIMIT = 10.0

system_prompt = (
    "You are a deliberate reasoner. Before answering, think the problem through as thoroughly as you need "
    "inside <think> </think> tags. When you are done thinking, state your final answer exactly once, inside "
    "<answer> </answer> tags. You may add explanation outside the tags, but there must be a single <answer> "
    "block after your thinking, and it must contain only the answer."
)


class ReasoningGymEnvConfig(BaseEnvConfig):
    """Settings of `ReasoningGymEnv` (Atropos's fields and defaults, plus `tasks` and `test_file`)."""

    dataset: str = Field(default="NousResearch/reasoning_gym", description="Hub dataset whose test split is the evaluation set.")
    max_eval_samples: Optional[int] = Field(default=None, description="Evaluate on at most this many items (sampled).")
    eval_sample_seed: int = Field(default=42, description="Seed of that sample.")
    dump_rollouts: bool = Field(default=False, description="Save groups with a rollout above rollout_save_score_threshold to data_dumps/.")
    dump_failed_rollouts: bool = Field(default=False, description="Save groups that scored 0 everywhere to data_dumps/ (debugging).")
    seed: int = Field(default=42, description="Seed of task choice; item i is generated with seed + i.")
    debug_logging: bool = Field(default=False, description="Log every scoring decision at DEBUG level.")
    suppress_base_env_logs: bool = Field(default=True, description="Raise the framework's env logger to WARNING.")
    mask_too_long_completions: bool = Field(default=True, description="Zero the advantage of rollouts cut off by the length limit.")
    rollout_save_score_threshold: float = Field(default=0.7, description="Score a rollout needs for its group to be dumped.")
    num_eval_samples_per_task: int = Field(default=5, description="Generated evaluation problems per task.")
    eval_seed: int = Field(default=123, description="Seed of the generated evaluation problems.")
    complexity_mode: Optional[Literal["curriculum", "random"]] = Field(
        default=None, description="None: task defaults; random: random difficulty; curriculum: per-task adaptive difficulty.")
    curriculum_target_accuracy: float = Field(default=0.7, description="Accuracy the curriculum steers each task towards.")
    tasks: Optional[list[str]] = Field(
        default=None, description="Only these reasoning-gym tasks (comma-separated or a YAML list); default: all.")
    test_file: Optional[str] = Field(
        default=None, description="Local evaluation file (question, answer, metadata) instead of the hub dataset.")

    @field_validator("tasks", mode="before")
    @classmethod
    def _split_tasks(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()] or None
        return value

    def validate_config(self) -> None:
        if not 0.0 <= self.rollout_save_score_threshold <= 1.0:
            raise ValueError(f"rollout_save_score_threshold must be in [0, 1], not {self.rollout_save_score_threshold}")
        if self.rollout_save_score_threshold == 1.0:
            logging.getLogger(__name__).warning("rollout_save_score_threshold 1.0 may keep no rollouts at all")
        if self.num_eval_samples_per_task <= 0:
            raise ValueError(f"num_eval_samples_per_task must be positive, not {self.num_eval_samples_per_task}")


def answer_outside_thinking(text: str) -> Optional[str]:
    """The content of the single ``<answer>`` block outside ``<think>`` blocks, or None when
    there is none or more than one."""
    outside = re.sub(r"<think>.*?</think>", "", text, flags=re.DOTALL | re.IGNORECASE)
    if re.search(r"<think>", outside, re.IGNORECASE):  # thinking never closed: no final answer
        outside = outside[: re.search(r"<think>", outside, re.IGNORECASE).start()]
    found = re.findall(r"<answer>(.*?)</answer>", outside, flags=re.DOTALL | re.IGNORECASE)
    return found[0].strip() if len(found) == 1 else None


def _metadata(entry: dict[str, Any]) -> dict[str, Any]:
    metadata = entry.get("metadata") or {}
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except ValueError:
            metadata = {}
    return metadata if isinstance(metadata, dict) else {}


def task_of(entry: dict[str, Any], default: str = "unknown") -> str:
    return str(_metadata(entry).get("source_dataset") or entry.get("task_name") or default)


class ReasoningGymEnv(BaseEnv):
    """reasoning-gym's tasks, answered in ``<answer>`` and scored by each task's scorer."""

    name = "reasoning_gym"
    env_config_cls = ReasoningGymEnvConfig

    def __init__(self, config: ReasoningGymEnvConfig, server_configs: list[APIServerConfig], slurm=True, testing=False):
        config.validate_config()
        super().__init__(config, server_configs, slurm, testing)
        self.logger = logging.getLogger(type(self).__name__)
        if not self.logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s"))
            self.logger.addHandler(handler)
        self.logger.setLevel(logging.DEBUG if config.debug_logging else logging.INFO)
        if config.suppress_base_env_logs:
            logging.getLogger("atroposlib.envs.base").setLevel(logging.WARNING)
        self.percent_correct_buffer: list[float] = []
        self.eval_metrics: list[tuple[str, float]] = []
        self.task_names: list[str] = []
        self.test_items_with_scorers: list[tuple[dict[str, Any], Any]] = []
        self.rng = random.Random()
        self.iter = 0
        self.run_uuid = str(uuid.uuid4())
        self.datadumps_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data_dumps")
        self.rollouts_to_save_buffer: list[dict[str, Any]] = []
        self.processed_item_count = 0
        self.save_file_batch_num = 0
        self.failed_rollouts_to_save_buffer: list[dict[str, Any]] = []
        self.failed_processed_item_count = 0
        self.failed_save_file_batch_num = 0
        # difficulty per task (0 easiest .. 1 hardest), recent group accuracies, reasoning-gym curricula
        self.task_complexity_levels: dict[str, float] = {}
        self.task_performance_history: dict[str, list[float]] = {}
        self.task_curricula: dict[str, Any] = {}
        self.task_group_counts: dict[str, int] = {}
        self.task_level_caps: dict[str, int] = {}
        self._scorers: dict[str, Any] = {}

    @classmethod
    def config_init(cls) -> tuple[ReasoningGymEnvConfig, list[APIServerConfig]]:
        env_config = ReasoningGymEnvConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview", group_size=8, use_wandb=True,
            rollout_server_url="http://localhost:8000", total_steps=250, seed=1918, batch_size=1024,
            steps_per_eval=25, max_token_length=1024 * 8, inference_weight=4.0, wandb_name="reasoning_gym_think",
            eval_handling=EvalHandlingEnum.NONE, eval_limit_ratio=0.1, num_rollouts_per_group_for_logging=4,
            num_rollouts_to_keep=50, dump_rollouts=False, dump_failed_rollouts=False, debug_logging=False,
            suppress_base_env_logs=True, rollout_save_score_threshold=0.51, num_eval_samples_per_task=5,
            eval_seed=123, complexity_mode="random", curriculum_target_accuracy=0.7, min_batch_allocation=0.1,
        )
        server_configs = [APIServerConfig(model_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
                                          base_url="http://localhost:9004/v1", api_key="x",
                                          num_max_requests_at_once=128, num_requests_for_eval=256)]
        return env_config, server_configs

    # -- tasks ------------------------------------------------------------------------------------
    def _get_task_names(self) -> list[str]:
        """The tasks to train on: ``tasks`` or every registered one, keeping those that build."""
        candidates = list(self.config.tasks or rg_factory.DATASETS)
        unknown = [name for name in candidates if name not in rg_factory.DATASETS]
        if unknown:
            raise ValueError(f"reasoning-gym has no task {', '.join(unknown)}")
        return self._validate_discovered_tasks(candidates)

    def _validate_discovered_tasks(self, names: list[str]) -> list[str]:
        valid = []
        for name in names:
            try:
                reasoning_gym.create_dataset(name, size=1, seed=0)
                valid.append(name)
            except Exception as exc:  # e.g. `composite`, which needs a list of tasks
                self.logger.debug("task %s is left out: it cannot be built with its defaults (%s)", name, exc)
        return valid

    def _scorer_for(self, task: str) -> Any:
        """A reasoning-gym dataset object of `task` for its ``score_answer`` (cached; None when
        reasoning-gym has no such task or cannot build it)."""
        if task not in self._scorers:
            try:
                self._scorers[task] = rg_factory.get_score_answer_fn(task).__self__
            except Exception as exc:
                self.logger.warning("no scorer for task %r (%s): its answers are compared exactly", task, exc)
                self._scorers[task] = None
        return self._scorers[task]

    # -- setup ------------------------------------------------------------------------------------
    async def setup(self):
        if reasoning_gym is None:
            raise ImportError(f"reasoning-gym is not installed ({_REASONING_GYM_ERROR}): pip install reasoning-gym "
                              "(the `quickstart` extra has it)")
        self.task_names = self._get_task_names()
        if not self.task_names:
            raise ValueError("no reasoning-gym task could be built")
        self.rng.seed(self.config.seed)
        self.iter = 0
        self.logger.info("%d reasoning-gym tasks (%s%s); complexity mode %s", len(self.task_names),
                         ", ".join(self.task_names[:5]), ", ..." if len(self.task_names) > 5 else "",
                         self.config.complexity_mode)
        hub_items = self._load_hf_test_dataset()
        self.test_items_with_scorers = hub_items if hub_items is not None else self._generate_test_items()
        self._initialize_complexity_mapping()

    def _load_hf_test_dataset(self) -> Optional[list[tuple[dict[str, Any], Any]]]:
        """The evaluation rows of ``test_file`` or the hub's test split; None when they cannot be loaded."""
        try:
            rows = load_rows(self.config.dataset, split="test", local_file=self.config.test_file)
        except Exception as exc:
            if self.config.test_file:
                raise
            self.logger.info("cannot load %s (%s): generating the evaluation set instead", self.config.dataset, exc)
            return None
        items = []
        for row in rows:
            entry = dict(row)
            entry["metadata"] = _metadata(row)
            task = task_of(entry, "")
            items.append((entry, self._scorer_for(task)))
        if self.config.max_eval_samples and len(items) > self.config.max_eval_samples:
            items = random.Random(self.config.eval_sample_seed).sample(items, self.config.max_eval_samples)
        self.logger.info("evaluation: %d items from %s", len(items), self.config.test_file or self.config.dataset)
        return items

    def _generate_test_items(self) -> list[tuple[dict[str, Any], Any]]:
        items = []
        for task in self.rng.sample(self.task_names, min(len(self.task_names), EVAL_TASKS)):
            try:
                dataset = reasoning_gym.create_dataset(task, size=self.config.num_eval_samples_per_task,
                                                       seed=self.config.eval_seed)
                items.extend((entry, dataset) for entry in dataset)
            except Exception as exc:
                self.logger.warning("no evaluation items for %s: %s", task, exc)
        if self.config.max_eval_samples and len(items) > self.config.max_eval_samples:
            items = random.Random(self.config.eval_sample_seed).sample(items, self.config.max_eval_samples)
        self.logger.info("evaluation: %d generated items", len(items))
        return items

    # -- difficulty ---------------------------------------------------------------------------------
    def _initialize_complexity_mapping(self) -> None:
        for task in self.task_names:
            self.task_complexity_levels.setdefault(task, CURRICULUM_START)
            self.task_performance_history.setdefault(task, [])
            self.task_group_counts.setdefault(task, 0)

    def _get_task_complexity_level(self, task: str) -> float:
        if self.config.complexity_mode == "random":
            return self.rng.random()
        if self.config.complexity_mode == "curriculum":
            return self.task_complexity_levels.get(task, CURRICULUM_START)
        return 0.5

    def _curriculum_for(self, task: str) -> Any:
        if task not in self.task_curricula:
            self.task_curricula[task] = rg_factory.create_curriculum(task) if rg_factory.has_curriculum(task) else None
        return self.task_curricula[task]

    def _curriculum_level(self, task: str) -> Optional[int]:
        """The reasoning-gym curriculum level matching the task's difficulty now (None: use the
        task's default settings), never above a level found too slow to generate."""
        if self.config.complexity_mode is None:
            return None
        curriculum = self._curriculum_for(task)
        if curriculum is None or not curriculum.attributes:
            return None
        top = max(len(attribute.levels) - 1 for attribute in curriculum.attributes.values())
        complexity = min(1.0, max(0.0, self._get_task_complexity_level(task)))
        return min(round(complexity * top), self.task_level_caps.get(task, top))

    def _build_dataset(self, task: str, level: Optional[int], seed: int) -> Any:
        """A one-item dataset of `task` with its curriculum's settings at `level` (defaults for None,
        or when those settings are invalid)."""
        if level is not None:
            try:
                curriculum = rg_factory.create_curriculum(task)  # a fresh one: this may run in a thread
                curriculum.set_global_level(level)
                config = curriculum.generate_configuration({"seed": seed, "size": 1})
                if hasattr(config, "validate"):
                    config.validate()
                dataset_cls, _ = rg_factory.DATASETS[task]
                return dataset_cls(config=config)
            except Exception as exc:
                self.logger.debug("level %d settings of %s are unusable (%s): using its defaults", level, task, exc)
        return reasoning_gym.create_dataset(task, size=1, seed=seed)

    def _create_dataset_with_complexity(self, task: str, seed: int) -> Any:
        """A one-item dataset of `task` at the task's current difficulty."""
        return self._build_dataset(task, self._curriculum_level(task), seed)

    async def _generate(self, task: str, seed: int) -> tuple[Any, dict[str, Any]]:
        """(dataset, its item) at the task's difficulty, built off the event loop.

        Some tasks take minutes at their hardest curriculum levels (zebra puzzles, jugs, 12
        queens): after `GENERATION_TIME_LIMIT` seconds the item is made with the task's default
        settings instead and the task's levels are capped below the slow one from then on
        (the abandoned generation finishes in a daemon thread).
        """
        level = self._curriculum_level(task)
        if level is None:
            dataset = self._build_dataset(task, None, seed)
            return dataset, next(iter(dataset))
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def settle(result: tuple) -> None:
            if not done.done():
                done.set_result(result)

        def work() -> None:
            try:
                dataset = self._build_dataset(task, level, seed)
                result: tuple = (dataset, next(iter(dataset)), None)
            except Exception as exc:
                result = (None, None, exc)
            try:
                loop.call_soon_threadsafe(settle, result)
            except RuntimeError:  # the loop is gone
                pass

        threading.Thread(target=work, name=f"reasoning-gym {task}", daemon=True).start()
        try:
            dataset, entry, error = await asyncio.wait_for(asyncio.shield(done), GENERATION_TIME_LIMIT)
        except asyncio.TimeoutError:
            self.task_level_caps[task] = max(0, level - 1)
            self.logger.warning("%s at level %d took over %.0f s to generate: its levels are capped at %d",
                                task, level, GENERATION_TIME_LIMIT, self.task_level_caps[task])
            dataset = self._build_dataset(task, None, seed)
            return dataset, next(iter(dataset))
        if error is not None:
            raise error
        return dataset, entry

    def _update_task_performance(self, task: str, score: float) -> None:
        if self.config.complexity_mode != "curriculum":
            return
        history = self.task_performance_history.setdefault(task, [])
        history.append(score)
        del history[:-10]
        self.task_group_counts[task] = self.task_group_counts.get(task, 0) + 1
        self._adjust_task_complexity(task)

    def _adjust_task_complexity(self, task: str) -> None:
        """Step the task's difficulty towards the target accuracy: after 3 groups, compare the
        mean of the last 5 with the target (+-0.05); steps shrink when results scatter."""
        history = self.task_performance_history.get(task, [])
        if len(history) < 3:
            return
        recent = history[-5:]
        accuracy = sum(recent) / len(recent)
        spread = (sum((s - accuracy) ** 2 for s in recent) / len(recent)) ** 0.5
        stability = max(0.5, 1.0 - spread)
        current = self.task_complexity_levels.get(task, CURRICULUM_START)
        target = self.config.curriculum_target_accuracy
        step = 0.0
        if accuracy > target + 0.05:
            step = 0.05 * stability
            if accuracy > 0.9 and current < 0.5 and stability > 0.8:
                step = 0.1 * stability
        elif accuracy < target - 0.05:
            step = -0.05 * stability
            if accuracy < 0.3 and current > 0.5 and stability > 0.8:
                step = -0.1 * stability
        new = min(1.0, max(0.0, current + step))
        if new != current:
            self.task_complexity_levels[task] = new
            self.logger.info("%s: difficulty %.2f -> %.2f (accuracy %.2f, target %.2f)", task, current, new,
                             accuracy, target)

    def get_curriculum_stats(self) -> dict[str, Any]:
        if self.config.complexity_mode != "curriculum":
            return {"curriculum_mode": False}
        details = {}
        for task, complexity in self.task_complexity_levels.items():
            history = self.task_performance_history.get(task, [])
            details[task] = {"complexity": complexity, "groups_processed": self.task_group_counts.get(task, 0),
                             "recent_accuracy": sum(history[-5:]) / len(history[-5:]) if len(history) >= 3 else None,
                             "history_length": len(history), "adjustable": len(history) >= 3}
        return {"curriculum_mode": True, "target_accuracy": self.config.curriculum_target_accuracy,
                "total_tasks_tracked": len(self.task_complexity_levels),
                "tasks_with_adjustments": sum(1 for n in self.task_group_counts.values() if n >= 3),
                "task_details": details}

    # -- items, rollouts, scores -----------------------------------------------------------------------
    async def get_next_item(self) -> Optional[Item]:
        if not self.task_names:
            return None
        for _ in range(5):  # a generator that fails on a seed is skipped, not the end of the data
            task = self.rng.choice(self.task_names)
            seed = self.config.seed + self.iter
            self.iter += 1
            try:
                dataset, entry = await self._generate(task, seed)
                break
            except Exception as exc:
                self.logger.warning("could not generate a %s problem with seed %d: %s", task, seed, exc)
        else:
            return None
        prompt = (frozenset({"role": "system", "content": system_prompt}.items()),
                  frozenset({"role": "user", "content": entry["question"]}.items()))
        return prompt, entry, dataset

    def _extract_final_answer(self, text: str) -> Optional[str]:
        return answer_outside_thinking(text)

    def _score_answer_with_both_formats(self, model_answer: str, entry: dict[str, Any], scorer: Any) -> float:
        """The task's score of the answer, bare or in ``<answer>`` tags (the better one), in [0, 1]."""
        if scorer is None:  # a hub row of a task this reasoning-gym does not know: exact match
            return float(model_answer.strip().lower() == str(entry.get("answer", "")).strip().lower())
        best = 0.0
        for candidate in (model_answer, f"<answer>{model_answer}</answer>"):
            try:
                best = max(best, min(1.0, max(0.0, float(scorer.score_answer(answer=candidate, entry=entry)))))
            except Exception as exc:
                self.logger.debug("%s scorer failed on %r: %s", task_of(entry), candidate[:80], exc)
        return best

    async def collect_trajectories(self, item: Item) -> tuple[Optional[ScoredDataGroup], list[Item]]:
        prompt_messages, entry, dataset = item
        messages = [dict(message) for message in prompt_messages]
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        max_tokens = self.config.max_token_length - len(self.tokenizer.encode(prompt, add_special_tokens=False))
        if max_tokens <= 0:
            return None, []
        completions = await self.server.completion(prompt=prompt, n=self.config.group_size, max_tokens=max_tokens,
                                                   temperature=1.0, top_p=0.95)
        to_score = [(tuple(messages + [{"role": "assistant", "content": choice.text or ""}]), entry, dataset,
                     choice.finish_reason) for choice in completions.choices]
        scored = await self.score(to_score)
        if scored is not None and self.config.dump_rollouts:
            await self._buffer_for_dump(scored, entry)
        return scored, []

    async def score(self, rollout_group_data: list[tuple]) -> Optional[ScoredDataGroup]:
        if not rollout_group_data:
            return None
        entry, scorer = rollout_group_data[0][1], rollout_group_data[0][2]
        task = task_of(entry)
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], overrides=[], messages=[])
        rollouts = list(rollout_group_data)
        random.shuffle(rollouts)
        for messages, _, _, finish_reason in rollouts:
            answer = self._extract_final_answer(messages[-1]["content"])
            reward = 0.0 if answer is None else self._score_answer_with_both_formats(answer, entry, scorer)
            if self.config.debug_logging:
                self.logger.debug("%s: answer %r scored %.2f", task, None if answer is None else answer[:80], reward)
            tokenized = tokenize_for_trainer(self.tokenizer, list(messages), finish_reason=finish_reason or "")
            if sum(1 for label in tokenized["masks"] if label != -100) < MIN_TRAINABLE_TOKENS:
                continue
            group["tokens"].append(tokenized["tokens"])
            group["masks"].append(tokenized["masks"])
            group["scores"].append(reward)
            group["messages"].append(list(messages))
            too_long = finish_reason == "length" and self.config.mask_too_long_completions
            group["overrides"].append({"set_advantage_to_zero": True} if too_long else {})
            if len(group["tokens"]) >= self.config.group_size:
                break
        if not group["tokens"]:
            self.logger.warning("%s: no rollout had %d generated tokens", task, MIN_TRAINABLE_TOKENS)
            return None
        scores = group["scores"]
        self.percent_correct_buffer.extend(1.0 if s >= 0.5 else 0.0 for s in scores)
        if task != "unknown":
            self._update_task_performance(task, sum(scores) / len(scores))
        self.logger.info("%s: group average %.3f", task, sum(scores) / len(scores))
        if all(s >= 0.5 for s in scores):
            self._apply_length_penalty(group)
        if len(set(group["scores"])) == 1:
            if self.config.dump_failed_rollouts and all(s == 0.0 for s in group["scores"]):
                await self._buffer_failed_group(group, entry)
            return None
        return group

    def _apply_length_penalty(self, group: ScoredDataGroup) -> None:
        """All good: scores of sequences above 75 % of max_token_length fall linearly to 0 at the maximum."""
        group["scores"] = [length_scaled_score(score, len(tokens), self.config.max_token_length, LENGTH_PENALTY_START)
                           for score, tokens in zip(group["scores"], group["tokens"])]

    # -- data dumps -----------------------------------------------------------------------------------
    async def _buffer_for_dump(self, group: ScoredDataGroup, entry: dict[str, Any]) -> None:
        if not any(score > self.config.rollout_save_score_threshold for score in group["scores"]):
            return
        self.rollouts_to_save_buffer.append({
            "item_id": task_of(entry, "unknown_task"),
            "rollouts": [{"conversation": m, "score": s} for m, s in zip(group["messages"], group["scores"])],
        })
        self.processed_item_count += 1
        if self.processed_item_count % 100 == 0:
            await self._save_rollouts_to_jsonl()

    async def _buffer_failed_group(self, group: ScoredDataGroup, entry: dict[str, Any]) -> None:
        self.failed_rollouts_to_save_buffer.append({
            "item_id": task_of(entry, "unknown_task"),
            "rollouts": [{"conversation": m, "score": s} for m, s in zip(group["messages"], group["scores"])],
        })
        self.failed_processed_item_count += 1
        if self.failed_processed_item_count % 50 == 0:
            await self._save_failed_rollouts_to_jsonl()

    def _write_dump(self, entries: list[dict[str, Any]], kind: str, batch: int) -> None:
        os.makedirs(self.datadumps_dir, exist_ok=True)
        path = os.path.join(self.datadumps_dir, f"reasoning_gym_environment_{kind}rollouts_{self.run_uuid}_{batch:04d}.jsonl")
        with open(path, "w", encoding="utf-8") as out:
            for data in entries:
                out.write(json.dumps(data) + "\n")
        self.logger.info("saved %d groups to %s", len(entries), path)

    async def _save_rollouts_to_jsonl(self) -> None:
        if self.rollouts_to_save_buffer:
            self._write_dump(self.rollouts_to_save_buffer, "", self.save_file_batch_num)
            self.rollouts_to_save_buffer.clear()
            self.save_file_batch_num += 1

    async def _save_failed_rollouts_to_jsonl(self) -> None:
        if self.failed_rollouts_to_save_buffer:
            self._write_dump(self.failed_rollouts_to_save_buffer, "FAILED_", self.failed_save_file_batch_num)
            self.failed_rollouts_to_save_buffer.clear()
            self.failed_save_file_batch_num += 1

    async def close(self) -> None:
        """Write whatever the dump buffers hold."""
        if self.config.dump_rollouts:
            await self._save_rollouts_to_jsonl()
        if self.config.dump_failed_rollouts:
            await self._save_failed_rollouts_to_jsonl()

    # -- evaluation ---------------------------------------------------------------------------------------
    async def rollout_and_score_eval(self, test_item: tuple[dict[str, Any], Any]) -> dict[str, Any]:
        entry, scorer = test_item
        messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": entry["question"]}]
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        max_tokens = 2 * self.config.max_token_length - len(self.tokenizer.encode(prompt, add_special_tokens=False))
        if max_tokens <= 0:
            return {"score": 0.0, "sample": None}
        completion = await self.server.completion(prompt=prompt, n=1, max_tokens=max_tokens,
                                                  temperature=EVAL_TEMPERATURE, split="eval")
        reply = completion.choices[0].text or ""
        answer = self._extract_final_answer(reply)
        score = 0.0 if answer is None else self._score_answer_with_both_formats(answer, entry, scorer)
        return {"score": score, "sample": {
            "messages": messages + [{"role": "assistant", "content": reply}], "question": entry["question"],
            "expected_answer": str(entry.get("answer", "")), "extracted_answer": answer, "score": score,
            "correct": score > 0, "finish_reason": completion.choices[0].finish_reason, "task_name": task_of(entry),
        }}

    async def evaluate(self, *args, **kwargs):
        if not self.test_items_with_scorers:
            self.logger.warning("no evaluation items: skipping evaluation")
            self.eval_metrics.append(("eval/percent_correct", 0.0))
            return
        start = time.time()
        results = await asyncio.gather(*(self.rollout_and_score_eval(item) for item in self.test_items_with_scorers))
        scores = [r["score"] for r in results]
        percent_correct = sum(scores) / len(scores)
        self.eval_metrics.append(("eval/percent_correct", percent_correct))
        self.logger.info("evaluation: %.4f", percent_correct)
        self.evaluate_log({"eval/percent_correct": percent_correct},
                          samples=[r["sample"] for r in results if r["sample"] is not None], start_time=start,
                          end_time=time.time(), generation_parameters={"temperature": EVAL_TEMPERATURE,
                                                                       "max_tokens": 2 * self.config.max_token_length})

    # -- checkpoints and logging ------------------------------------------------------------------------------
    def save_checkpoint(self, step, data=None):
        data = dict(data or {})
        version, state, gauss = self.rng.getstate()
        data.update({
            "iter": self.iter, "rng_state": [version, list(state), gauss],
            "processed_item_count": self.processed_item_count, "save_file_batch_num": self.save_file_batch_num,
            "failed_processed_item_count": self.failed_processed_item_count,
            "failed_save_file_batch_num": self.failed_save_file_batch_num,
            "task_complexity_levels": self.task_complexity_levels,
            "task_performance_history": self.task_performance_history, "task_group_counts": self.task_group_counts,
            "task_level_caps": self.task_level_caps,
        })
        super().save_checkpoint(step, data)

    def load_checkpoint(self):
        super().load_checkpoint()
        state = self.__dict__.pop("rng_state", None)
        if isinstance(state, list) and len(state) == 3:
            self.rng.setstate((state[0], tuple(state[1]), state[2]))

    async def wandb_log(self, wandb_metrics: Optional[dict] = None):
        metrics = dict(wandb_metrics or {})
        if self.percent_correct_buffer:
            metrics["train/percent_correct"] = sum(self.percent_correct_buffer) / len(self.percent_correct_buffer)
        self.percent_correct_buffer = []
        metrics.update(dict(self.eval_metrics))
        self.eval_metrics = []
        if self.config.complexity_mode == "curriculum":
            stats = self.get_curriculum_stats()
            metrics["curriculum/total_tasks_tracked"] = stats["total_tasks_tracked"]
            metrics["curriculum/tasks_with_adjustments"] = stats["tasks_with_adjustments"]
            metrics["curriculum/target_accuracy"] = stats["target_accuracy"]
            complexities = [d["complexity"] for d in stats["task_details"].values()]
            if complexities:
                metrics["curriculum/avg_complexity"] = sum(complexities) / len(complexities)
                metrics["curriculum/min_complexity"] = min(complexities)
                metrics["curriculum/max_complexity"] = max(complexities)
            accuracies = [d["recent_accuracy"] for d in stats["task_details"].values() if d["recent_accuracy"] is not None]
            if accuracies:
                metrics["curriculum/avg_recent_accuracy"] = sum(accuracies) / len(accuracies)
        await super().wandb_log(metrics)


if __name__ == "__main__":
    ReasoningGymEnv.cli()
