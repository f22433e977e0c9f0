"""Answer-format adherence: the model is told how to present its answer and is scored on doing so.

Each item is a question from a mix of datasets with one answer format drawn at random from the
catalogue in `answer_formats` (170 formats: XML and HTML tags, nested tags, lead-in phrases, line
prefixes, delimiters, LaTeX, Markdown, JSON/YAML/TOML/INI/XML/CSV documents, code-style answers,
multi-section layouts; LaTeX mathematics only for math datasets, some code layouts only for code
datasets; when more than ten formats apply, multi-section ones are drawn 30 % of the time). The
system prompt asks for one ``<think>`` block and then the answer in that format. A completion
scores 1.0 when it has exactly one ``<think>`` and one ``</think>`` and the text after them uses
the format exactly once, else 0.0; correctness of the answer is not judged. Rollouts with fewer
than 10 trainable tokens are left out and groups whose scores are all equal (all right or all
wrong: no learning signal) are dropped. ``ensure_equivalent_ratios`` rests a format once it has
``format_group_threshold`` successful groups until the others catch up. Evaluation: one
completion (temperature 0.1) for each of the first 50 held-out items, ``eval/percent_correct``.

Data: ``dataset_configs`` (default: AcademicMCQA and GSM8K; each ``name``, ``split``,
``sample_size``, ``prompt_field``, ``answer_field``, ``metadata_fields``, ``dataset_type``), mixed,
shuffled with ``seed`` and split by ``eval_set_percentage``. Offline: ``--env.local_data_dir DIR``
reads ``DIR/<name with / as __>.jsonl`` for every dataset (or a ``local_file`` key in its config)
in the hub layout; the project ships such files in ``environments/fixtures/answer_format/``.

    python environments/answer_format_environment/answer_format_environment.py process \\
        --env.local_data_dir environments/fixtures/answer_format --openai.base_url http://localhost:9004/v1
    python environments/answer_format_environment/answer_format_environment.py serve \\
        --openai.base_url http://localhost:9004/v1 --openai.model_name NousResearch/DeepHermes-3-Llama-3-8B-Preview
"""

import asyncio
import json
import logging
import os
import random
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from pydantic import Field, field_validator

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, EvalHandlingEnum, ScoredDataGroup
from atroposlib.envs.local_data import load_rows
from atroposlib.type_definitions import Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

try:
    from .answer_formats import AnswerFormat, extract_answer, spec_of
except ImportError:  # run as a script: the catalogue is next to this file
    from answer_formats import AnswerFormat, extract_answer, spec_of

DATASET_TYPES = ("generic", "math_only", "code_only")
MIN_TRAINABLE_TOKENS = 10
EVAL_ITEMS = 50
EVAL_TEMPERATURE = 0.1
TRAIN_TEMPERATURE = 0.9
ROLLOUT_DUMP_EVERY = 100
FAILED_DUMP_EVERY = 50
SYSTEM_PROMPT = (
    "You are a helpful assistant. Before answering, think the question through inside a single "
    "<think> </think> block: open it once, close it once, and take as long as you need in between. "
    "After </think>, give your reply in the answer format described below, using that format exactly "
    "once and nowhere else in the reply."
)


def _decoded(value: Any) -> Any:
    """A JSON string from the command line as the list it holds."""
    return json.loads(value) if isinstance(value, str) and value.strip().startswith("[") else value


class AnswerFormatEnvConfig(BaseEnvConfig):
    """AnswerFormatEnv's settings."""

    dataset_configs: List[Dict[str, Any]] = Field(
        default=[
            {"name": "teknium/OpenHermes-2.5", "split": "train", "sample_size": 1000,
             "prompt_field": "conversations", "answer_field": "conversations", "metadata_fields": ["source"],
             "dataset_type": "generic"},
            {"name": "gsm8k", "split": "train", "sample_size": 2000, "prompt_field": "question",
             "answer_field": "answer", "metadata_fields": [], "dataset_type": "math_only"},
        ],
        description="Datasets mixed into the items: name, split, sample_size, prompt_field, answer_field, "
                    "metadata_fields, dataset_type (generic, math_only or code_only), optional local_file",
    )
    debug_logging: bool = Field(default=True, description="Log every item, format and group at DEBUG level")
    suppress_base_env_logs: bool = Field(default=True, description="Keep the framework's INFO logs quiet")
    dump_rollouts: bool = Field(default=False, description="Save scored groups to datadumps/ as JSONL")
    dump_failed_rollouts: bool = Field(default=False, description="Save groups with failed rollouts to datadumps/")
    rollout_save_score_threshold: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Save a group only if a rollout scores above this"
    )
    eval_set_percentage: float = Field(default=0.1, ge=0.0, le=1.0, description="Share of items held out for eval")
    supported_formats: Optional[List[AnswerFormat]] = Field(
        default=None, description="Formats to draw from (names, comma-separated on the command line); None: all"
    )
    ensure_equivalent_ratios: bool = Field(
        default=False, description="Rest formats that reached format_group_threshold successful groups"
    )
    format_group_threshold: int = Field(default=50, ge=1, le=1000, description="Successful groups per format")
    seed: int = Field(default_factory=lambda: random.randint(20, 9999), ge=1, le=99999,
                      description="Seed of sampling, shuffling and format draws")
    local_data_dir: Optional[str] = Field(
        default=None, description="Folder of <dataset name with / as __>.jsonl files used instead of the hub"
    )

    @field_validator("dataset_configs", mode="before")
    @classmethod
    def _configs_from_json(cls, value: Any) -> Any:
        return _decoded(value)

    @field_validator("supported_formats", mode="before")
    @classmethod
    def _formats_from_text(cls, value: Any) -> Any:
        value = _decoded(value)
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()]
        return value


def _first_exchange(conversations: Any) -> Tuple[Optional[str], Optional[str]]:
    """The first user turn and the first assistant turn of a ShareGPT or OpenAI conversation."""
    prompt = answer = None
    for message in conversations if isinstance(conversations, list) else []:
        if not isinstance(message, dict):
            continue
        role = message.get("from", message.get("role"))
        content = message.get("value", message.get("content"))
        if role in ("human", "user") and prompt is None:
            prompt = content
        elif role in ("gpt", "assistant") and answer is None:
            answer = content
    return prompt, answer


def item_from_row(row: Dict[str, Any], dataset_config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """A row as ``{prompt, answer, metadata, dataset_type}``, or None when it lacks either."""
    name = dataset_config["name"]
    prompt_field = dataset_config.get("prompt_field", "prompt")
    answer_field = dataset_config.get("answer_field", "answer")
    metadata: Dict[str, Any] = {}
    if prompt_field == "conversations" and answer_field == "conversations":
        prompt, answer = _first_exchange(row.get("conversations"))
    elif name == "gsm8k":
        prompt, raw = row.get(prompt_field), row.get(answer_field)
        answer = raw.split("#")[-1].strip().replace(",", "") if isinstance(raw, str) and "#" in raw else raw
    elif name == "NousResearch/AcademicMCQA":
        prompt, answer = row.get(prompt_field), row.get("ground_truth")
        options, index = row.get("options") or [], row.get("answer")
        metadata.update(correct_answer_index=index, ground_truth_letter=answer, options=options)
        if isinstance(index, int) and 0 <= index < len(options):
            metadata["correct_answer_text"] = options[index]
    else:
        prompt, answer = row.get(prompt_field), row.get(answer_field)
    for field in dataset_config.get("metadata_fields") or []:
        if field in row:
            metadata[field] = row[field]
    metadata["dataset_name"] = name
    if not prompt or not answer:
        return None
    return {"prompt": prompt, "answer": answer, "metadata": metadata,
            "dataset_type": dataset_config.get("dataset_type", "generic")}


class AnswerFormatEnv(BaseEnv):
    """Training on answer-format adherence."""

    env_config_cls = AnswerFormatEnvConfig

    def __init__(self, config: AnswerFormatEnvConfig, server_configs: List[APIServerConfig], slurm=True,
                 testing=False):
        super().__init__(config, server_configs, slurm, testing)
        self.logger = logging.getLogger(type(self).__name__)
        self.logger.setLevel(logging.DEBUG if config.debug_logging else logging.INFO)
        if config.suppress_base_env_logs:
            logging.getLogger("atroposlib.envs.base").setLevel(logging.WARNING)
        self._validate_config(config)
        self.seed = config.seed
        self.rng = random.Random(config.seed)
        self.base_supported_formats: List[AnswerFormat] = list(config.supported_formats or AnswerFormat)
        self.math_only_formats = {f for f in AnswerFormat if spec_of(f).domain == "math_only"}
        self.code_only_formats = {f for f in AnswerFormat if spec_of(f).domain == "code_only"}
        self.generic_formats = set(AnswerFormat) - self.math_only_formats - self.code_only_formats
        self.format_group_threshold = config.format_group_threshold
        self.ensure_equivalent_ratios = config.ensure_equivalent_ratios
        self.format_success_counts: Dict[str, int] = {}
        self.format_total_counts: Dict[str, int] = {}
        self.format_successful_groups: Dict[str, int] = {}
        self.group_statistics: Dict[str, Any] = {"total_groups": 0, "successful_groups": 0, "failed_groups": 0,
                                                 "average_scores": [], "format_distribution": {}}
        self.percent_correct_buffer: List[float] = []
        self.eval_metrics: List[Tuple[str, float]] = []
        self.train_items: List[Dict[str, Any]] = []
        self.test_items: List[Dict[str, Any]] = []
        self.dataset_items: List[Dict[str, Any]] = []
        self.iter = 0
        self.run_uuid = str(uuid.uuid4())
        self.datadumps_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "datadumps")
        self.rollouts_to_save_buffer: List[Dict[str, Any]] = []
        self.failed_rollouts_to_save_buffer: List[Dict[str, Any]] = []
        self.save_file_batch_num = 0
        self.failed_save_file_batch_num = 0
        self.processed_item_count = 0

    @staticmethod
    def _validate_config(config: AnswerFormatEnvConfig) -> None:
        if not config.dataset_configs:
            raise ValueError("dataset_configs needs at least one dataset")
        for i, dataset_config in enumerate(config.dataset_configs):
            if "name" not in dataset_config:
                raise ValueError(f"dataset_configs[{i}] has no 'name'")
            if dataset_config.get("dataset_type", "generic") not in DATASET_TYPES:
                raise ValueError(f"dataset_configs[{i}]: dataset_type must be one of {', '.join(DATASET_TYPES)}")

    @classmethod
    def config_init(cls) -> Tuple[AnswerFormatEnvConfig, List[APIServerConfig]]:
        env_config = AnswerFormatEnvConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview", group_size=16, use_wandb=True,
            rollout_server_url="http://localhost:8000", total_steps=250, batch_size=1024, steps_per_eval=20,
            max_token_length=1024 * 12, inference_weight=1.0, wandb_name="answer_format_adherence",
            eval_handling=EvalHandlingEnum.LIMIT_TRAIN, eval_limit_ratio=0.1, debug_logging=True,
            dump_rollouts=False, dump_failed_rollouts=False, rollout_save_score_threshold=0.0,
            eval_set_percentage=0.1, ensure_equivalent_ratios=False, format_group_threshold=10,
            suppress_base_env_logs=True, ensure_scores_are_not_same=False,
            dataset_configs=[
                {"name": "NousResearch/AcademicMCQA", "split": "train", "sample_size": 50000,
                 "prompt_field": "prompt", "answer_field": "ground_truth", "metadata_fields": ["answer", "options"],
                 "dataset_type": "generic"},
                {"name": "gsm8k", "split": "train", "sample_size": 20000, "prompt_field": "question",
                 "answer_field": "answer", "metadata_fields": [], "dataset_type": "math_only"},
            ],
        )
        server_configs = [APIServerConfig(model_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
                                          base_url="http://localhost:9004/v1", api_key="x",
                                          num_max_requests_at_once=32, num_requests_for_eval=256)]
        return env_config, server_configs

    # -- data ------------------------------------------------------------------------------------
    def _local_file(self, dataset_config: Dict[str, Any]) -> Optional[str]:
        if dataset_config.get("local_file"):
            return dataset_config["local_file"]
        if self.config.local_data_dir:
            return str(Path(self.config.local_data_dir) / f"{dataset_config['name'].replace('/', '__')}.jsonl")
        return None

    def _load_dataset(self, dataset_config: Dict[str, Any]) -> List[Dict[str, Any]]:
        name, split = dataset_config["name"], dataset_config.get("split", "train")
        sample_size = dataset_config.get("sample_size")
        local_file = self._local_file(dataset_config)
        if local_file:
            rows = load_rows(name, split=split, local_file=local_file)
            if sample_size and len(rows) > sample_size:
                rows = random.Random(self.seed).sample(rows, sample_size)
        else:
            from datasets import load_dataset

            dataset = load_dataset("gsm8k", "main", split=split) if name == "gsm8k" else load_dataset(name, split=split)
            if sample_size and len(dataset) > sample_size:
                dataset = dataset.shuffle(seed=self.seed).select(range(sample_size))
            rows = list(dataset)
        items = [item_from_row(row, dataset_config) for row in rows]
        return [item for item in items if item is not None]

    async def setup(self):
        items: List[Dict[str, Any]] = []
        for dataset_config in self.config.dataset_configs:
            try:
                loaded = self._load_dataset(dataset_config)
            except Exception as exc:  # a dataset that cannot be read is skipped, as long as one loads
                self.logger.error("cannot load dataset %s: %s", dataset_config["name"], exc)
                continue
            self.logger.info("%d items from %s", len(loaded), dataset_config["name"])
            items.extend(loaded)
        if not items:
            raise ValueError("none of the datasets in dataset_configs could be loaded")
        random.Random(self.seed).shuffle(items)
        self.dataset_items = items
        split_at = int(len(items) * (1.0 - self.config.eval_set_percentage))
        self.train_items, self.test_items = items[:split_at], items[split_at:]
        if not self.train_items:
            raise ValueError(f"eval_set_percentage {self.config.eval_set_percentage} leaves no training items")
        self.iter = 0
        self.logger.info("setup: %d training and %d test items", len(self.train_items), len(self.test_items))

    # -- formats ---------------------------------------------------------------------------------
    def _get_balanced_formats(self, formats: List[AnswerFormat]) -> List[AnswerFormat]:
        """Without formats that reached the threshold while some format is still below it."""
        if not self.ensure_equivalent_ratios:
            return formats
        counts = self.format_successful_groups
        lowest = min((counts.get(f.value, 0) for f in self.base_supported_formats), default=0)
        if lowest >= self.format_group_threshold:
            return formats
        balanced = [f for f in formats if counts.get(f.value, 0) < self.format_group_threshold]
        return balanced or formats

    def _get_formats_for_dataset_type(self, dataset_type: str) -> List[AnswerFormat]:
        allowed = set(self.generic_formats)
        if dataset_type == "math_only":
            allowed |= self.math_only_formats
        elif dataset_type == "code_only":
            allowed |= self.code_only_formats
        return self._get_balanced_formats([f for f in self.base_supported_formats if f in allowed])

    def _pick_format(self, formats: List[AnswerFormat]) -> AnswerFormat:
        if len(formats) > 10:
            simple = [f for f in formats if not spec_of(f).complex]
            layered = [f for f in formats if spec_of(f).complex]
            if simple and (not layered or self.rng.random() < 0.7):
                return self.rng.choice(simple)
            return self.rng.choice(layered)
        return self.rng.choice(formats)

    def _generate_system_prompt(self, answer_format: AnswerFormat) -> str:
        spec = spec_of(answer_format)
        return f"{SYSTEM_PROMPT}\n\nAnswer format: {spec.instruction}\nExample:\n{spec.example}"

    async def get_next_item(self) -> Item:
        dataset_item = dict(self.train_items[self.iter % len(self.train_items)])
        self.iter += 1
        formats = self._get_formats_for_dataset_type(dataset_item["dataset_type"])
        if not formats:
            raise ValueError(f"supported_formats leaves no format for {dataset_item['dataset_type']} items")
        dataset_item["selected_format"] = self._pick_format(formats)
        self.logger.debug("item %d: %s format %s", self.iter - 1, dataset_item["dataset_type"],
                          dataset_item["selected_format"].value)
        prompt = (frozenset({"role": "system", "content": self._generate_system_prompt(dataset_item["selected_format"])}.items()),
                  frozenset({"role": "user", "content": dataset_item["prompt"]}.items()))
        return prompt, dataset_item

    # -- rollouts and scores ------------------------------------------------------------------------
    async def collect_trajectories(self, item: Item) -> Tuple[Optional[ScoredDataGroup], List[Item]]:
        prompt_messages, dataset_item = item
        messages = [dict(message) for message in prompt_messages]
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        completions = await self.server.completion(prompt=prompt, n=self.config.group_size,
                                                   max_tokens=self.config.max_token_length,
                                                   temperature=TRAIN_TEMPERATURE)
        rollouts = [(messages + [{"role": "assistant", "content": choice.text or ""}], choice.finish_reason or "")
                    for choice in completions.choices]
        scored = await self.score(rollouts, dataset_item)
        if scored is not None and self.config.dump_rollouts:
            await self._buffer_rollouts(scored, dataset_item)
        return scored, []

    async def score(self, rollout_group_data: List[Tuple[List[Dict[str, str]], str]],
                    dataset_item: Dict[str, Any]) -> Optional[ScoredDataGroup]:
        """Format compliance of each rollout: 1.0 or 0.0, with the group rules of the module docstring."""
        if not rollout_group_data:
            return None
        answer_format = dataset_item["selected_format"]
        name = answer_format.value
        rollouts = list(rollout_group_data)
        self.rng.shuffle(rollouts)
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
        failed = []
        for messages, finish_reason in rollouts:
            extracted = extract_answer(messages[-1]["content"], answer_format)
            reward = 1.0 if extracted is not None else 0.0
            self.format_total_counts[name] = self.format_total_counts.get(name, 0) + 1
            self.format_success_counts[name] = self.format_success_counts.get(name, 0) + int(reward)
            tokenized = tokenize_for_trainer(self.tokenizer, messages, finish_reason=finish_reason)
            if sum(1 for mask in tokenized["masks"] if mask != -100) < MIN_TRAINABLE_TOKENS:
                continue
            group["tokens"].append(tokenized["tokens"])
            group["masks"].append(tokenized["masks"])
            group["scores"].append(reward)
            group["messages"].append(messages)
            self.percent_correct_buffer.append(reward)
            if reward == 0.0:
                failed.append({"conversation": messages, "score": reward, "selected_format": name,
                               "metadata": dataset_item.get("metadata", {})})
            if len(group["tokens"]) >= self.config.group_size:
                break
        if not group["tokens"]:
            return None
        self._record_group(name, group["scores"], dataset_item, failed)
        if len(set(group["scores"])) == 1:
            return None
        if self.ensure_equivalent_ratios:
            self.format_successful_groups[name] = self.format_successful_groups.get(name, 0) + 1
        return group

    def _record_group(self, name: str, scores: List[float], dataset_item: Dict[str, Any],
                      failed: List[Dict[str, Any]]) -> None:
        stats = self.group_statistics
        average = sum(scores) / len(scores)
        stats["total_groups"] += 1
        stats["average_scores"].append(average)
        stats["format_distribution"][name] = stats["format_distribution"].get(name, 0) + 1
        stats["successful_groups" if average > 0 else "failed_groups"] += 1
        self.logger.debug("format %s: %d/%d right", name, sum(1 for s in scores if s == 1.0), len(scores))
        if failed and self.config.dump_failed_rollouts:
            self.failed_rollouts_to_save_buffer.append({
                "item_id": f"failed_group_{stats['total_groups']}", "format": name, "group_average_score": average,
                "rollouts": failed, "dataset_type": dataset_item.get("dataset_type")})
            if len(self.failed_rollouts_to_save_buffer) >= FAILED_DUMP_EVERY:
                self._write_dump(self.failed_rollouts_to_save_buffer, "FAILED_")

    # -- data dumps -------------------------------------------------------------------------------------
    async def _buffer_rollouts(self, group: ScoredDataGroup, dataset_item: Dict[str, Any]) -> None:
        threshold = self.config.rollout_save_score_threshold
        if not any(score > threshold for score in group["scores"]):
            return
        rollouts = [{"conversation": messages, "score": score}
                    for messages, score in zip(group["messages"], group["scores"]) if score >= threshold]
        self.rollouts_to_save_buffer.append({
            "item_id": f"item_{self.iter - 1}", "format": dataset_item["selected_format"].value,
            "rollouts": rollouts, "dataset_type": dataset_item.get("dataset_type")})
        self.processed_item_count += 1
        if self.processed_item_count % ROLLOUT_DUMP_EVERY == 0:
            self._write_dump(self.rollouts_to_save_buffer, "")

    def _write_dump(self, buffer: List[Dict[str, Any]], kind: str) -> None:
        """Write `buffer` to a new JSONL file in ``datadumps/`` and empty it."""
        os.makedirs(self.datadumps_dir, exist_ok=True)
        number = self.failed_save_file_batch_num if kind else self.save_file_batch_num
        path = os.path.join(self.datadumps_dir, f"answer_format_{kind}rollouts_{self.run_uuid}_{number:04d}.jsonl")
        with open(path, "w", encoding="utf-8") as handle:
            for entry in buffer:
                handle.write(json.dumps(entry) + "\n")
        self.logger.info("saved %d groups to %s", len(buffer), path)
        buffer.clear()
        if kind:
            self.failed_save_file_batch_num += 1
        else:
            self.save_file_batch_num += 1

    # -- evaluation and logging ------------------------------------------------------------------------
    async def rollout_and_score_eval(self, test_item: Dict[str, Any]) -> Dict[str, Any]:
        formats = self._get_formats_for_dataset_type(test_item["dataset_type"]) or list(self.generic_formats)
        answer_format = self.rng.choice(formats)
        messages = [{"role": "system", "content": self._generate_system_prompt(answer_format)},
                    {"role": "user", "content": test_item["prompt"]}]
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        completion = await self.server.completion(prompt=prompt, n=1, max_tokens=self.config.max_token_length,
                                                  temperature=EVAL_TEMPERATURE, split="eval")
        response = completion.choices[0].text or ""
        extracted = extract_answer(response, answer_format)
        score = 1.0 if extracted is not None else 0.0
        return {"score": score, "sample": {
            "messages": messages + [{"role": "assistant", "content": response}], "selected_format": answer_format.value,
            "dataset_type": test_item["dataset_type"], "extracted_content": extracted, "score": score,
            "correct": score > 0, "finish_reason": completion.choices[0].finish_reason}}

    async def evaluate(self, *args, **kwargs):
        if not self.test_items:
            self.eval_metrics.append(("eval/percent_correct", 0.0))
            return
        start = time.time()
        results = await asyncio.gather(*(self.rollout_and_score_eval(item) for item in self.test_items[:EVAL_ITEMS]))
        accuracy = sum(r["score"] for r in results) / len(results)
        self.eval_metrics.append(("eval/percent_correct", accuracy))
        self.evaluate_log({"eval/percent_correct": accuracy}, samples=[r["sample"] for r in results],
                          start_time=start, end_time=time.time(),
                          generation_parameters={"temperature": EVAL_TEMPERATURE,
                                                 "max_tokens": self.config.max_token_length})

    async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
        metrics = dict(wandb_metrics or {})
        buffer = self.percent_correct_buffer
        metrics["performance/accuracy"] = sum(buffer) / len(buffer) if buffer else 0.0
        self.percent_correct_buffer = []
        for key, value in self.eval_metrics:
            metrics[key.replace("eval/percent_correct", "performance/eval_accuracy")] = value
        self.eval_metrics = []
        stats = self.group_statistics
        if stats["total_groups"]:
            recent = stats["average_scores"][-50:]
            metrics.update({
                "groups/total_processed": stats["total_groups"], "groups/successful": stats["successful_groups"],
                "groups/failed": stats["failed_groups"],
                "groups/success_rate": stats["successful_groups"] / stats["total_groups"],
                "groups/avg_score_recent": sum(recent) / len(recent)})
        if self.format_total_counts:
            attempts, successes = sum(self.format_total_counts.values()), sum(self.format_success_counts.values())
            metrics.update({"formats/total_attempts": attempts, "formats/total_successes": successes,
                            "formats/overall_success_rate": successes / attempts})
        if self.ensure_equivalent_ratios and self.format_successful_groups:
            done = sum(1 for count in self.format_successful_groups.values() if count >= self.format_group_threshold)
            metrics.update({"balance/formats_completed": done,
                            "balance/completion_percentage": 100 * done / len(self.base_supported_formats)})
        await super().wandb_log(metrics)


if __name__ == "__main__":
    AnswerFormatEnv.cli()
