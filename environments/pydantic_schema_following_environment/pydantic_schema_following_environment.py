"""Structured output that must validate against a Pydantic model: generate it, or repair faulty data.

Each dataset row carries a prompt and ``verification_info``: JSON with the model's source code
(``pydantic_config``) and the class to validate against (``model_name``). Every item draws a
structured format (JSON, YAML, TOML or XML) and a container (``<json_output>``-style tags, a
Markdown code block, or nothing) and asks for one ``<think>`` block followed by the data. Rows
whose ``task_type`` (else the config's) is ``editing`` become repair tasks: a valid instance is
generated, `error_introduction` breaks it, and the model must return corrected data. A completion
scores 1.0 when its thinking block is well formed (one ``<think>``, one ``</think>``), the
container holds a document that parses in the requested format, and the model class accepts it;
otherwise 0.0. Rollouts with fewer than 10 trainable tokens are left out; a group whose scores
are all equal and below 1.0 is dropped; when a whole group is right but averages more than 75 %
of ``max_token_length`` tokens, its scores are multiplied by 0.9. Evaluation: one completion
(temperature 0.1) for each of the first 50 held-out rows: ``eval/avg_score``,
``eval/percent_perfect``.

The model code comes from the dataset and is executed to build the class, as Atropos does: use
datasets you trust.

Data: ``dataset_name`` / ``dataset_split`` from the hub (``justus27/pydantic-adherance-test``),
shuffled and split by ``eval_set_percentage``; ``--env.train_file`` reads a local
JSONL/JSON/CSV/Parquet file with the same columns instead (``problem_id``, ``task_type``,
``prompt``, ``verification_info``). The project's schemas are in
``environments/fixtures/pydantic_schema_following/``.

    python environments/pydantic_schema_following_environment/pydantic_schema_following_environment.py process \\
        --env.train_file environments/fixtures/pydantic_schema_following/train.jsonl \\
        --openai.base_url http://localhost:9004/v1 --openai.model_name MODEL --env.tokenizer_name MODEL
    python environments/pydantic_schema_following_environment/pydantic_schema_following_environment.py serve \\
        --openai.base_url http://localhost:9004/v1 --openai.model_name NousResearch/DeepHermes-3-Llama-3-8B-Preview
"""

import asyncio
import json
import logging
import os
import random
import re
import time
import tomllib
import typing
import uuid
import xml.etree.ElementTree as ElementTree
from datetime import date, datetime, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any, Dict, List, Optional, Tuple, Type, Union
from uuid import UUID

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    EmailStr,
    Field,
    HttpUrl,
    ValidationError,
    field_validator,
    model_validator,
)

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, EvalHandlingEnum, ScoredDataGroup
from atroposlib.envs.local_data import load_rows
from atroposlib.type_definitions import Item
from atroposlib.utils.reasoning_text import text_after_single_think_block
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

try:
    from .error_introduction import ErrorIntroductionConfig, generate_valid_data, introduce_error_for_pydantic
except ImportError:  # run as a script: the module is next to this file
    from error_introduction import ErrorIntroductionConfig, generate_valid_data, introduce_error_for_pydantic

MIN_TRAINABLE_TOKENS = 10
EVAL_ITEMS = 50
EVAL_TEMPERATURE = 0.1
TRAIN_TEMPERATURE = 0.9
ROLLOUT_DUMP_EVERY = 100


class StructuredOutputFormat(Enum):
    JSON = "json"
    YAML = "yaml"
    TOML = "toml"
    XML = "xml"


class OutputContainerFormat(Enum):
    TAGGED = "tagged"
    NONE = "none"
    MARKDOWN = "markdown"


def _enum_list(value: Any) -> Any:
    """``json,yaml`` from the command line as a list of names."""
    if isinstance(value, str):
        return [name.strip() for name in value.split(",") if name.strip()]
    return value


class PydanticEnvConfig(BaseEnvConfig):
    """PydanticSchemaFollowingEnv's settings."""

    dataset_name: str = Field(default="justus27/pydantic-adherance-test", description="Hugging Face dataset")
    dataset_split: str = Field(default="train", description="Dataset split to use")
    debug_logging: bool = Field(default=True, description="Log items and scores at DEBUG level")
    dump_rollouts: bool = Field(default=False, description="Save scored groups to datadumps/ as JSONL")
    include_messages: bool = Field(default=True, description="Keep the conversations in the groups (for SFT data)")
    allowed_structured_formats: Optional[List[StructuredOutputFormat]] = Field(
        default=None, description="Formats to draw from (json, yaml, toml, xml); None: all")
    allowed_container_formats: Optional[List[OutputContainerFormat]] = Field(
        default=None, description="Containers to draw from (tagged, none, markdown); None: all")
    eval_set_percentage: float = Field(default=0.1, ge=0.0, le=1.0, description="Share of rows held out for eval")
    task_type: str = Field(default="generation", description="generation or editing, for rows that do not say")
    error_introduction_seed: Optional[int] = Field(default=None, description="Seed of the errors in editing tasks")
    error_types_enabled: List[str] = Field(
        default=["type_error", "format_error", "constraint_error", "enum_error", "required_field_missing"],
        description="Errors editing tasks may contain (see error_introduction.ErrorType)")
    error_introduction_probability: float = Field(default=1.0, description="Chance that errors are introduced")
    max_errors_per_item: int = Field(default=1, description="Errors per editing task at most")
    train_file: Optional[str] = Field(default=None, description="Local data file used instead of the hub dataset")

    @field_validator("allowed_structured_formats", "allowed_container_formats", "error_types_enabled", mode="before")
    @classmethod
    def _names_from_text(cls, value: Any) -> Any:
        return _enum_list(value)

    @field_validator("task_type")
    @classmethod
    def _known_task(cls, value: str) -> str:
        if value not in ("generation", "editing"):
            raise ValueError("task_type must be generation or editing")
        return value


# The names a dataset's model code may use without importing them.
SCHEMA_NAMESPACE: Dict[str, Any] = {
    "BaseModel": BaseModel, "Field": Field, "ConfigDict": ConfigDict, "ValidationError": ValidationError,
    "field_validator": field_validator, "model_validator": model_validator, "EmailStr": EmailStr,
    "HttpUrl": HttpUrl, "List": List, "Dict": Dict, "Optional": Optional, "Union": Union, "Any": Any,
    "Literal": typing.Literal, "Tuple": Tuple, "datetime": datetime, "date": date, "time": __import__("datetime").time,
    "timedelta": timedelta, "Enum": Enum, "Decimal": Decimal, "UUID": UUID, "typing": typing, "json": json, "re": re,
}
EXAMPLES = {
    StructuredOutputFormat.JSON: '{\n  "field1": "value1",\n  "field2": 2\n}',
    StructuredOutputFormat.YAML: "field1: value1\nfield2: 2",
    StructuredOutputFormat.TOML: 'field1 = "value1"\nfield2 = 2',
    StructuredOutputFormat.XML: "<ModelName>\n  <field1>value1</field1>\n  <field2>2</field2>\n</ModelName>",
}


def build_model(pydantic_config: str, model_name: str) -> Type[BaseModel]:
    """The class `model_name` defined by running the schema code `pydantic_config` (from the dataset,
    executed as Atropos does: trusted data only)."""
    namespace = dict(SCHEMA_NAMESPACE)
    exec(compile(pydantic_config, f"<schema {model_name}>", "exec", dont_inherit=True), namespace)
    model = namespace.get(model_name)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise ValueError(f"the schema code defines no Pydantic model named {model_name!r}")
    return model


def extract_structured(text: str, container: OutputContainerFormat,
                       structured: StructuredOutputFormat) -> Optional[str]:
    """The document a completion gives in `container`, or None."""
    section = text_after_single_think_block(text)
    if section is None:
        return None
    if container == OutputContainerFormat.TAGGED:
        tag = f"{structured.value}_output"
        match = re.search(rf"<{tag}[^>]*>\s*(.*?)\s*</{tag}>", section, re.DOTALL | re.IGNORECASE)
        content = match.group(1) if match else None
    elif container == OutputContainerFormat.MARKDOWN:
        match = re.fullmatch(rf"```(?:{structured.value})?[ \t]*\n(.*?)\n?[ \t]*```", section.strip(),
                             re.DOTALL | re.IGNORECASE)
        content = match.group(1) if match else None
    else:
        content = section
    content = content.strip() if content else None
    return content or None


def _xml_value(element: ElementTree.Element) -> Any:
    children = list(element)
    if not children:
        return (element.text or "").strip()
    value: Dict[str, Any] = {}
    for child in children:
        item = _xml_value(child)
        if child.tag in value:
            value[child.tag] = (value[child.tag] if isinstance(value[child.tag], list) else [value[child.tag]]) + [item]
        else:
            value[child.tag] = item
    return value


def _fit_lists(data: Any, model: Type[BaseModel]) -> Any:
    """XML has no lists: ``<tags><tag>a</tag><tag>b</tag></tags>`` becomes ``{"tag": [...]}``, one child a
    scalar. Where the model wants a list, take the single child's values as the list."""
    if not isinstance(data, dict):
        return data
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key not in data:
            continue
        annotation = field.annotation
        while typing.get_origin(annotation) is Union:
            annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        if typing.get_origin(annotation) is list:
            value = data[key]
            if isinstance(value, dict) and len(value) == 1:
                value = next(iter(value.values()))
            data[key] = value if isinstance(value, list) else [value]
            inner = typing.get_args(annotation)[0] if typing.get_args(annotation) else None
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                data[key] = [_fit_lists(item, inner) for item in data[key]]
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            data[key] = _fit_lists(data[key], annotation)
    return data


def parse_structured(text: str, structured: StructuredOutputFormat, model: Type[BaseModel]) -> Any:
    """The document as Python data; raises on a parse error."""
    if structured == StructuredOutputFormat.JSON:
        return json.loads(text)
    if structured == StructuredOutputFormat.YAML:
        return yaml.safe_load(text)
    if structured == StructuredOutputFormat.TOML:
        return tomllib.loads(text)
    return _fit_lists(_xml_value(ElementTree.fromstring(text)), model)


class PydanticSchemaFollowingEnv(BaseEnv):
    """Training on structured outputs a Pydantic model accepts."""

    env_config_cls = PydanticEnvConfig

    def __init__(self, config: PydanticEnvConfig, server_configs: List[APIServerConfig], slurm=True, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        self.logger = logging.getLogger(type(self).__name__)
        self.logger.setLevel(logging.DEBUG if config.debug_logging else logging.INFO)
        self.supported_structured_formats = list(config.allowed_structured_formats or StructuredOutputFormat)
        self.supported_container_formats = list(config.allowed_container_formats or OutputContainerFormat)
        self.rng = random.Random()
        # The valid data that editing tasks corrupt: drawn with the errors' seed, so a seeded run
        # asks the same repairs whatever order its workers run in.
        self.faulty_rng = random.Random(config.error_introduction_seed)
        self.model_cache: Dict[str, Type[BaseModel]] = {}
        self.percent_correct_buffer: List[float] = []
        self.eval_metrics: List[Tuple[str, float]] = []
        self.dataset_items: List[Dict[str, Any]] = []
        self.train_items: List[Dict[str, Any]] = []
        self.test_items: List[Dict[str, Any]] = []
        self.iter = 0
        self.run_uuid = str(uuid.uuid4())
        self.datadumps_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "datadumps")
        self.rollouts_to_save_buffer: List[Dict[str, Any]] = []
        self.save_file_batch_num = 0
        self.processed_item_count = 0
        self.error_config = ErrorIntroductionConfig.from_env_config(
            error_types_enabled=config.error_types_enabled, max_errors_per_item=config.max_errors_per_item,
            error_introduction_probability=config.error_introduction_probability,
            error_introduction_seed=config.error_introduction_seed)

    @classmethod
    def config_init(cls) -> Tuple[PydanticEnvConfig, List[APIServerConfig]]:
        env_config = PydanticEnvConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview", group_size=16, use_wandb=True,
            rollout_server_url="http://localhost:8000", total_steps=250, batch_size=1024, steps_per_eval=20,
            max_num_workers=16, max_token_length=1024 * 12, inference_weight=1.0,
            wandb_name="pydantic_schema_following", eval_handling=EvalHandlingEnum.LIMIT_TRAIN, eval_limit_ratio=0.1,
            dataset_name="justus27/pydantic-adherance-test", dataset_split="train", debug_logging=False,
            dump_rollouts=False,
            allowed_structured_formats=[StructuredOutputFormat.JSON, StructuredOutputFormat.YAML,
                                        StructuredOutputFormat.TOML],
            allowed_container_formats=[OutputContainerFormat.TAGGED, OutputContainerFormat.NONE,
                                       OutputContainerFormat.MARKDOWN],
            eval_set_percentage=0.005,
        )
        server_configs = [APIServerConfig(model_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
                                          base_url="http://localhost:9004/v1", api_key="x",
                                          num_max_requests_at_once=32, num_requests_for_eval=256)]
        return env_config, server_configs

    # -- data and models ---------------------------------------------------------------------------
    async def setup(self):
        rows = load_rows(self.config.dataset_name, split=self.config.dataset_split, local_file=self.config.train_file)
        if not rows:
            raise ValueError(f"no rows in {self.config.train_file or self.config.dataset_name}")
        random.Random(self.config.error_introduction_seed).shuffle(rows)
        self.dataset_items = rows
        split_at = int(len(rows) * (1.0 - self.config.eval_set_percentage))
        self.train_items, self.test_items = rows[:split_at], rows[split_at:]
        if not self.train_items:
            raise ValueError(f"eval_set_percentage {self.config.eval_set_percentage} leaves no training rows")
        self.iter = 0
        self.logger.info("setup: %d training and %d test rows", len(self.train_items), len(self.test_items))

    def _create_pydantic_model_from_code(self, pydantic_config: str, model_name: str) -> Type[BaseModel]:
        """The class `model_name` defined by running `pydantic_config` (cached)."""
        key = f"{model_name}_{hash(pydantic_config)}"
        if key not in self.model_cache:
            self.model_cache[key] = build_model(pydantic_config, model_name)
        return self.model_cache[key]

    def _target_model(self, dataset_item: Dict[str, Any]) -> Tuple[str, Type[BaseModel]]:
        info = json.loads(dataset_item["verification_info"])
        return info["pydantic_config"], self._create_pydantic_model_from_code(info["pydantic_config"],
                                                                            info["model_name"])

    # -- prompts -----------------------------------------------------------------------------------
    def _generate_system_prompt(self, structured: StructuredOutputFormat, container: OutputContainerFormat) -> str:
        name, example = structured.value.upper(), EXAMPLES[structured]
        if container == OutputContainerFormat.TAGGED:
            tag = f"{structured.value}_output"
            where = f"put the {name} between <{tag}> and </{tag}> and write nothing after </{tag}>"
            shown = f"<{tag}>\n{example}\n</{tag}>"
        elif container == OutputContainerFormat.MARKDOWN:
            where = f"put the {name} in a single Markdown code block and nothing else"
            shown = f"```{structured.value}\n{example}\n```"
        else:
            where = f"write the {name} itself, with no tags or code fences around it"
            shown = example
        return (
            f"You write {name} data that a given Pydantic model accepts. First reason inside one <think> </think> "
            f"block, for as long as you need. Then {where}. The {name} must be complete and valid: every required "
            f"field present, every type and constraint of the model respected; add optional fields when they fit.\n"
            f"Layout:\n<think>\nyour reasoning\n</think>\n{shown}"
        )

    def _pick_formats(self, dataset_item: Dict[str, Any]) -> Tuple[StructuredOutputFormat, OutputContainerFormat]:
        structured = self.rng.choice(self.supported_structured_formats)
        container = self.rng.choice(self.supported_container_formats)
        dataset_item["selected_structured_format"] = structured
        dataset_item["selected_container_format"] = container
        return structured, container

    def _create_generation_item(self, dataset_item: Dict[str, Any]) -> Item:
        structured, container = self._pick_formats(dataset_item)
        prompt = (frozenset({"role": "system", "content": self._generate_system_prompt(structured, container)}.items()),
                  frozenset({"role": "user", "content": dataset_item["prompt"]}.items()))
        return prompt, dataset_item

    def _faulty_data(self, dataset_item: Dict[str, Any]) -> Optional[Any]:
        if dataset_item.get("erroneous_data") is not None:
            data = dataset_item["erroneous_data"]
            return json.loads(data) if isinstance(data, str) else data
        _, model = self._target_model(dataset_item)
        valid = generate_valid_data(model, random.Random(self.faulty_rng.random()))
        if valid is None:
            return None
        return introduce_error_for_pydantic(valid, model, config=self.error_config)

    def _create_editing_item(self, dataset_item: Dict[str, Any]) -> Item:
        faulty = self._faulty_data(dataset_item)
        if faulty is None:
            self.logger.debug("no faulty data for %s: asking for generation instead",
                              dataset_item.get("problem_id"))
            return self._create_generation_item(dataset_item)
        dataset_item["erroneous_data"] = faulty
        structured, container = self._pick_formats(dataset_item)
        code, _ = self._target_model(dataset_item)
        task = (f"This data does not validate against the Pydantic model below. Correct it and give the fixed data "
                f"in the requested format.\n\nModel:\n```python\n{code}\n```\n\n"
                f"Data:\n```json\n{json.dumps(faulty, indent=2, default=str)}\n```")
        prompt = (frozenset({"role": "system", "content": self._generate_system_prompt(structured, container)}.items()),
                  frozenset({"role": "user", "content": task}.items()))
        return prompt, dataset_item

    async def get_next_item(self) -> Item:
        dataset_item = dict(self.train_items[self.iter % len(self.train_items)])
        self.iter += 1
        if (dataset_item.get("task_type") or self.config.task_type) == "editing":
            return self._create_editing_item(dataset_item)
        return self._create_generation_item(dataset_item)

    # -- scoring -----------------------------------------------------------------------------------
    def _validate_parsed_data_against_model(self, parsed_data: Any, model: Type[BaseModel]) -> Tuple[bool, Optional[str]]:
        try:
            model.model_validate(parsed_data)
        except ValidationError as exc:
            return False, f"{exc.error_count()} validation error(s): {json.dumps(exc.errors(), default=str)[:250]}"
        except Exception as exc:  # a schema's own validator can raise anything
            return False, f"{type(exc).__name__}: {str(exc)[:200]}"
        return True, None

    def score_text(self, text: str, dataset_item: Dict[str, Any], model: Type[BaseModel]) -> float:
        """1.0 when `text` holds, as asked, data `model` accepts; else 0.0."""
        structured = dataset_item["selected_structured_format"]
        document = extract_structured(text, dataset_item["selected_container_format"], structured)
        if document is None:
            return 0.0
        try:
            parsed = parse_structured(document, structured, model)
        except Exception:  # JSON, YAML, TOML or XML that does not parse
            return 0.0
        valid, error = self._validate_parsed_data_against_model(parsed, model)
        if not valid:
            self.logger.debug("%s: %s", dataset_item.get("problem_id"), error)
        return 1.0 if valid else 0.0

    async def score(self, rollout_group_data: List[Dict[str, Any]]) -> Optional[ScoredDataGroup]:
        if not rollout_group_data:
            return None
        dataset_item = rollout_group_data[0]["dataset_item"]
        try:
            _, model = self._target_model(dataset_item)
        except Exception as exc:  # schema code that does not run: the item cannot be scored
            self.logger.error("cannot build the model of %s: %s", dataset_item.get("problem_id"), exc)
            return None
        rollouts = list(rollout_group_data)
        self.rng.shuffle(rollouts)
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
        for rollout in rollouts:
            reward = self.score_text(rollout["messages"][-1]["content"], dataset_item, model)
            tokenized = tokenize_for_trainer(self.tokenizer, rollout["messages"], finish_reason=rollout["finish_reason"])
            if sum(1 for mask in tokenized["masks"] if mask != -100) < MIN_TRAINABLE_TOKENS:
                continue
            group["tokens"].append(tokenized["tokens"])
            group["masks"].append(tokenized["masks"])
            group["scores"].append(reward)
            group["messages"].append(rollout["messages"])
            self.percent_correct_buffer.append(reward)
            if len(group["tokens"]) >= self.config.group_size:
                break
        if not group["tokens"]:
            return None
        scores = group["scores"]
        if len(set(scores)) == 1 and scores[0] != 1.0:
            return None
        if all(s == 1.0 for s in scores):
            average_length = sum(len(t) for t in group["tokens"]) / len(group["tokens"])
            if average_length > self.config.max_token_length * 0.75:
                group["scores"] = [s * 0.9 for s in scores]
        return group

    async def collect_trajectories(self, item: Item) -> Tuple[Optional[ScoredDataGroup], List[Item]]:
        prompt_messages, dataset_item = item
        messages = [dict(message) for message in prompt_messages]
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        completions = await self.server.completion(prompt=prompt, n=self.config.group_size,
                                                   max_tokens=self.config.max_token_length,
                                                   temperature=TRAIN_TEMPERATURE)
        rollouts = [{"messages": messages + [{"role": "assistant", "content": choice.text or ""}],
                     "finish_reason": choice.finish_reason or "", "dataset_item": dataset_item}
                    for choice in completions.choices]
        group = await self.score(rollouts)
        if group is not None and self.config.dump_rollouts:
            self._buffer_rollouts(group, dataset_item)
        return group, []

    def _buffer_rollouts(self, group: ScoredDataGroup, dataset_item: Dict[str, Any]) -> None:
        self.rollouts_to_save_buffer.append({
            "item_id": dataset_item.get("problem_id", f"item_{self.iter - 1}"),
            "task_type": dataset_item.get("task_type", self.config.task_type),
            "rollouts": [{"conversation": m, "score": s} for m, s in zip(group["messages"], group["scores"])]})
        self.processed_item_count += 1
        if self.processed_item_count % ROLLOUT_DUMP_EVERY == 0:
            os.makedirs(self.datadumps_dir, exist_ok=True)
            path = os.path.join(self.datadumps_dir,
                                f"pydantic_rollouts_{self.run_uuid}_{self.save_file_batch_num:04d}.jsonl")
            with open(path, "w", encoding="utf-8") as handle:
                for entry in self.rollouts_to_save_buffer:
                    handle.write(json.dumps(entry, default=str) + "\n")
            self.logger.info("saved %d groups to %s", len(self.rollouts_to_save_buffer), path)
            self.rollouts_to_save_buffer.clear()
            self.save_file_batch_num += 1

    # -- evaluation and logging --------------------------------------------------------------------
    async def rollout_and_score_eval(self, dataset_item: Dict[str, Any]) -> Dict[str, Any]:
        dataset_item = dict(dataset_item)
        structured, container = self._pick_formats(dataset_item)
        messages = [{"role": "system", "content": self._generate_system_prompt(structured, container)},
                    {"role": "user", "content": dataset_item["prompt"]}]
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        completion = await self.server.completion(prompt=prompt, n=1, max_tokens=self.config.max_token_length,
                                                  temperature=EVAL_TEMPERATURE, split="eval")
        response = completion.choices[0].text or ""
        try:
            score = self.score_text(response, dataset_item, self._target_model(dataset_item)[1])
        except Exception as exc:  # schema code that does not run scores 0
            self.logger.error("cannot build the model of %s: %s", dataset_item.get("problem_id"), exc)
            score = 0.0
        return {"problem_id": dataset_item.get("problem_id"), "structured_format": structured.value,
                "container_format": container.value, "messages": messages + [{"role": "assistant", "content": response}],
                "score": score}

    async def evaluate(self, *args, **kwargs):
        if not self.test_items:
            self.logger.warning("no test rows to evaluate")
            self.eval_metrics.append(("eval/percent_correct", 0.0))
            return
        start = time.time()
        samples = await asyncio.gather(*(self.rollout_and_score_eval(item) for item in self.test_items[:EVAL_ITEMS]))
        scores = [sample["score"] for sample in samples]
        metrics = {"eval/avg_score": sum(scores) / len(scores),
                   "eval/percent_perfect": sum(1 for s in scores if s == 1.0) / len(scores)}
        self.eval_metrics.extend(metrics.items())
        self.evaluate_log(metrics, samples=list(samples), start_time=start, end_time=time.time(),
                          generation_parameters={"temperature": EVAL_TEMPERATURE,
                                                 "max_tokens": self.config.max_token_length})

    async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
        metrics = dict(wandb_metrics or {})
        buffer = self.percent_correct_buffer
        metrics["train/percent_perfect"] = sum(buffer) / len(buffer) if buffer else 0.0
        self.percent_correct_buffer = []
        metrics.update(dict(self.eval_metrics))
        self.eval_metrics = []
        await super().wandb_log(metrics)


if __name__ == "__main__":
    PydanticSchemaFollowingEnv.cli()
