"""What every evaluation environment here shares: config fields, the request loop, metrics.

`GenerativeEvalEnv` is a `BaseEnv` for the ``evaluate`` subcommand: `setup()` loads the
items (`build_items`, from the hub as Atropos does or from ``--env.test_file``), and
`evaluate()` asks the model once per item (with retries), reads the answer after
``</think>`` in thinking mode, scores it (`score_response`) and writes ``metrics.json`` and
``samples.jsonl`` through `evaluate_log` into ``--env.data_dir_to_save_evals``.

Metric names: ``<task>/accuracy``, ``<task>/total_evaluated``, ``<task>/total_correct``,
``<task>/failed_requests``, ``<task>/format_compliance_rate`` (share of responses with
exactly one ``<think></think>`` block in thinking mode, or reasoning returned by the API;
1.0 outside thinking mode), ``<task>/thinking_utilization_rate`` (thinking mode),
``<task>/avg_response_length``, per-group accuracies such as
``<task>/subject_<name>_accuracy``, plus ``config/*`` entries describing the run.

Two families build on it: `MultipleChoiceEvalEnv` (a letter inside ``<answer></answer>``,
with lighteval-style fallbacks) and `MathEvalEnv` (one ``\\boxed{}`` answer checked with
math-verify in a worker process).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import random
import re
import time
from string import ascii_uppercase
from typing import Annotated, Any, List, Optional

from eval_helpers import (
    ANSWER_TAG_PATTERN,
    THINK_OPEN_PATTERN,
    create_system_content,
    extract_boxed_answers,
    extract_first_boxed_answer,
    extract_mcqa_answer_with_fallback,
    extract_reasoning_from_completion,
    extract_thinking_content,
    format_reasoning_debug_info,
    get_math_executor,
    score_math_answer,
    score_math_answer_async,
    shutdown_math_executor,
    validate_thinking_format,
)
from pydantic import BeforeValidator, Field

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, EvalHandlingEnum
from atroposlib.envs.local_data import load_rows

HERMES_TOKENIZER = "NousResearch/Hermes-3-Llama-3.1-8B"
HERMES_MODEL = "Hermes-3-Llama-3.1-8B"
API_REASONING_SOURCES = ("reasoning_content", "reasoning", "reasoning_details")


def as_list(value: Any) -> Any:
    """A list field given on the command line: ``a,b`` or a JSON list (``'["a", "b"]'``)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    if isinstance(value, (int, float)):
        return [str(value)]
    return value


StrList = Annotated[List[str], BeforeValidator(as_list)]
"""A list of strings that also accepts ``a,b`` or a JSON list from the command line."""


def slug(text: Any) -> str:
    """A metric-name-safe form of a group name: ``high school/biology`` -> ``high_school_biology``."""
    return re.sub(r"[^a-z0-9]+", "_", str(text).lower()).strip("_") or "unknown"


class EvalEnvConfig(BaseEnvConfig):
    """Settings every evaluation environment here has (Atropos's names and defaults)."""

    thinking_mode: bool = Field(
        default=True, description="Reason before answering: the answer is read after </think>; the API is asked for reasoning.")
    custom_thinking_prompt: Optional[str] = Field(
        default=None, description="System prompt sent in thinking mode (none by default, e.g. eval_helpers.HERMES_REASONING_PROMPT).")
    custom_system_prompt: Optional[str] = Field(
        default=None, description="System prompt (after the thinking prompt in thinking mode).")
    eval_temperature: float = Field(default=0.6, description="Sampling temperature of the evaluated model.")
    eval_max_tokens: int = Field(default=0, description="Generation limit per answer; 0 leaves it to the server.")
    max_retries: int = Field(default=3, ge=1, description="Attempts per question when the request fails.")
    retry_delay: float = Field(default=1.0, ge=0.0, description="Seconds between attempts.")
    min_response_length: int = Field(default=1, ge=1, description="Shorter responses are asked again.")
    full_debug: bool = Field(default=False, description="Print every question's extraction and score.")
    test_file: Optional[str] = Field(
        default=None, description="Local JSONL/JSON/CSV/Parquet file in the hub dataset's layout, used instead of the hub.")


def eval_config_values(wandb_name: str, **overrides: Any) -> dict[str, Any]:
    """The `config_init()` values Atropos's evaluation environments share."""
    return {
        "tokenizer_name": HERMES_TOKENIZER, "group_size": 1, "use_wandb": True,
        "rollout_server_url": "http://localhost:8000", "total_steps": 1, "batch_size": 1, "steps_per_eval": 1,
        "inference_weight": 1.0, "wandb_name": wandb_name, "eval_handling": EvalHandlingEnum.STOP_TRAIN,
        "eval_temperature": 0.6, "eval_max_tokens": 0, "thinking_mode": True, **overrides,
    }


def eval_server(base_url: str = "http://localhost:9000/v1", num_requests_for_eval: int = 1024,
                api_key: Optional[str] = None, **extra: Any) -> list[APIServerConfig]:
    """The one inference server Atropos's evaluation environments point at by default (key:
    `api_key`, else $OPENAI_API_KEY, else ``none``)."""
    key = api_key if api_key is not None else os.getenv("OPENAI_API_KEY", "none")
    return [APIServerConfig(model_name=HERMES_MODEL, base_url=base_url, api_key=key,
                            num_requests_for_eval=num_requests_for_eval, **extra)]


class GenerativeEvalEnv(BaseEnv):
    """An evaluation-only environment: one answer per item, scored and summarised.

    Subclasses set `name`, `task` (the metric prefix) and `env_config_cls`, and implement
    `build_items`, `user_prompt` and `score_response`; `breakdowns` lists the item fields
    (and their metric labels) whose per-group accuracy is reported.
    """

    task: str = "eval"
    env_config_cls = EvalEnvConfig
    breakdowns: tuple[tuple[str, str], ...] = ()

    def __init__(self, config: EvalEnvConfig, server_configs: Any, slurm: bool = False, testing: bool = False) -> None:
        super().__init__(config, server_configs, slurm, testing)
        self.config: EvalEnvConfig = config
        self.eval_items: list[dict[str, Any]] = []
        self.eval_metrics: list[tuple[str, Any]] = []
        self.iter = 0

    # -- data --------------------------------------------------------------------------------
    def rows(self, hub_name: str, config_name: Optional[str], split: str, local_file: Optional[str] = None) -> list[dict[str, Any]]:
        """A split's rows: `local_file` (default ``test_file``) when set, else the hub dataset."""
        return load_rows(hub_name, config_name, split, local_file if local_file is not None else self.config.test_file)

    def build_items(self) -> list[dict[str, Any]]:
        """The evaluation items (dicts with at least ``id``)."""
        raise NotImplementedError

    async def setup(self) -> None:
        self.eval_items = self.build_items()
        if not self.eval_items:
            raise ValueError(f"{self.name}: no evaluation items were loaded")
        source = self.config.test_file or getattr(self.config, "dataset_name", "the hub")
        print(f"{self.name}: {len(self.eval_items)} items from {source}; thinking mode "
              f"{'on' if self.config.thinking_mode else 'off'}")

    async def get_next_item(self) -> Optional[dict[str, Any]]:
        """Items in turn (evaluation-only: `collect_trajectories` produces no training groups)."""
        if not self.eval_items:
            return None
        self.iter += 1
        return self.eval_items[self.iter % len(self.eval_items)]

    async def collect_trajectories(self, item: Any) -> tuple[None, list]:
        return None, []

    # -- asking --------------------------------------------------------------------------------
    def system_content(self) -> Optional[str]:
        return create_system_content(self.config.thinking_mode, self.config.custom_thinking_prompt,
                                     self.config.custom_system_prompt)

    def user_prompt(self, item: dict[str, Any]) -> str:
        raise NotImplementedError

    def build_messages(self, item: dict[str, Any]) -> list[dict[str, str]]:
        system = self.system_content()
        messages = [{"role": "system", "content": system}] if system else []
        return messages + [{"role": "user", "content": self.user_prompt(item)}]

    async def generate(self, messages: list[dict[str, str]]) -> tuple[Optional[str], Any]:
        """(response text, completion) after up to ``max_retries`` attempts; (None, None) when
        every attempt failed or came back empty."""
        kwargs: dict[str, Any] = {"messages": messages, "n": 1, "temperature": self.config.eval_temperature, "split": "eval"}
        if self.config.eval_max_tokens > 0:
            kwargs["max_tokens"] = self.config.eval_max_tokens
        text, completion = None, None
        for attempt in range(1, self.config.max_retries + 1):
            try:
                reply = await self.server.chat_completion(**kwargs)
                content = reply.choices[0].message.content if reply.choices else None
                if self.config.full_debug:
                    print(format_reasoning_debug_info(reply))
                if content:
                    text, completion = content, reply
                    if len(content.strip()) >= self.config.min_response_length:
                        break
            except Exception as exc:  # noqa: BLE001 - reported, then retried
                print(f"  {self.name}: request failed (attempt {attempt}/{self.config.max_retries}): "
                      f"{type(exc).__name__}: {exc}")
            if attempt < self.config.max_retries:
                await asyncio.sleep(self.config.retry_delay)
        return text, completion

    # -- scoring ---------------------------------------------------------------------------------
    async def score_response(self, item: dict[str, Any], content: str, response: str) -> dict[str, Any]:
        """Sample fields for one answer, including ``is_correct``. `content` is the text to read
        the answer from (after ``</think>`` in thinking mode); `response` the whole reply."""
        raise NotImplementedError

    def read_thinking(self, response: str, completion: Any) -> tuple[bool, str, Optional[str], str]:
        """(format valid, answer text, thinking text, reasoning source) of a response."""
        valid, content = validate_thinking_format(response, self.config.thinking_mode)
        reasoning, source, _ = extract_reasoning_from_completion(completion)
        if self.config.thinking_mode and not valid and source in API_REASONING_SOURCES \
                and not THINK_OPEN_PATTERN.search(response):
            valid, content = True, response.strip()  # the API returned the reasoning separately
        thinking = (extract_thinking_content(response) or reasoning) if self.config.thinking_mode else None
        return valid, content, thinking, source

    async def rollout_and_score_eval(self, item: dict[str, Any]) -> Optional[dict[str, Any]]:
        """Ask, read and score one item: its sample, or None when no response came back."""
        response, completion = await self.generate(self.build_messages(item))
        if response is None:
            return None
        valid, content, thinking, source = self.read_thinking(response, completion)
        sample: dict[str, Any] = {
            "item_id": item.get("id"),
            "model_response": response,
            "finish_reason": getattr(completion.choices[0], "finish_reason", None),
            "response_length": len(response),
            "thinking_mode": self.config.thinking_mode,
            "format_valid": valid,
        }
        if self.config.thinking_mode:
            sample.update(thinking_content=thinking, reasoning_source=source,
                          response_after_think=content if valid else None)
        sample.update(await self.score_response(item, content, response))
        sample["is_correct"] = bool(sample.get("is_correct"))
        if self.config.full_debug:
            print(f"  [{'ok' if sample['is_correct'] else 'x '}] {item.get('id')}: gold={sample.get('gold_answer')!r} "
                  f"got={sample.get('extracted_answer')!r} ({sample.get('extraction_method') or sample.get('verification_method')})")
        return sample

    # -- metrics ---------------------------------------------------------------------------------
    def rate(self, samples: list[dict[str, Any]], test: Any) -> float:
        return sum(1 for sample in samples if test(sample)) / len(samples) if samples else 0.0

    def compute_metrics(self, samples: list[dict[str, Any]], failed: int) -> dict[str, Any]:
        t = self.task
        correct = sum(1 for sample in samples if sample["is_correct"])
        metrics: dict[str, Any] = {
            f"{t}/accuracy": correct / len(samples) if samples else 0.0,
            f"{t}/total_evaluated": len(samples),
            f"{t}/total_correct": correct,
            f"{t}/failed_requests": failed,
            f"{t}/format_compliance_rate": self.rate(samples, lambda s: s.get("format_valid", True)),
            f"{t}/avg_response_length": (sum(s["response_length"] for s in samples) / len(samples)) if samples else 0.0,
        }
        if self.config.thinking_mode:
            metrics[f"{t}/thinking_utilization_rate"] = self.rate(samples, lambda s: bool(s.get("thinking_content")))
        for key, label in self.breakdowns:
            groups: dict[str, list[bool]] = {}
            for sample in samples:
                groups.setdefault(slug(sample.get(key, "unknown")), []).append(sample["is_correct"])
            for group, results in sorted(groups.items()):
                metrics[f"{t}/{label}_{group}_accuracy"] = sum(results) / len(results)
                metrics[f"{t}/{label}_{group}_total"] = len(results)
        for field in ("extraction_method", "verification_method"):
            counts: dict[str, int] = {}
            for sample in samples:
                if sample.get(field):
                    counts[sample[field]] = counts.get(sample[field], 0) + 1
            for method, count in sorted(counts.items()):
                metrics[f"{t}/{field.split('_')[0]}_{slug(method)}_count"] = count
        metrics.update(self.extra_metrics(samples))
        return metrics

    def extra_metrics(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        """Task-specific metrics (override)."""
        return {}

    def config_metrics(self) -> dict[str, Any]:
        """``config/*`` entries describing the run (extend in subclasses)."""
        return {
            "config/thinking_mode": 1.0 if self.config.thinking_mode else 0.0,
            "config/eval_max_tokens": self.config.eval_max_tokens,
            "config/eval_temperature": self.config.eval_temperature,
        }

    def generation_parameters(self) -> dict[str, Any]:
        return {"temperature": self.config.eval_temperature, "max_tokens": self.config.eval_max_tokens,
                "thinking_mode": self.config.thinking_mode, "reasoning_effort": self.config.reasoning_effort,
                "mode": "generative"}

    # -- the run -----------------------------------------------------------------------------------
    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Evaluate every item, log ``metrics.json`` / ``samples.jsonl``; the metrics."""
        start = time.time()
        limit = asyncio.Semaphore(max(1, self.config.max_eval_workers))

        async def one(item: dict[str, Any]) -> Optional[dict[str, Any]]:
            async with limit:
                try:
                    return await self.rollout_and_score_eval(item)
                except Exception as exc:  # noqa: BLE001 - one broken item does not end the run
                    print(f"  {self.name}: item {item.get('id')} failed: {type(exc).__name__}: {exc}")
                    return None

        try:
            results = await asyncio.gather(*(one(item) for item in self.eval_items))
        finally:
            await self.finish_scoring()
        samples = [sample for sample in results if sample is not None]
        end = time.time()
        metrics = {**self.compute_metrics(samples, len(results) - len(samples)), **self.config_metrics()}
        self.eval_metrics = list(metrics.items())
        t = self.task
        print(f"{self.name}: accuracy {metrics[f'{t}/accuracy']:.4f} ({metrics[f'{t}/total_correct']}/"
              f"{metrics[f'{t}/total_evaluated']}), {metrics[f'{t}/failed_requests']} failed requests, "
              f"{end - start:.1f} s")
        logged = self.evaluate_log(metrics=metrics, samples=samples, start_time=start, end_time=end,
                                   generation_parameters=self.generation_parameters())
        if inspect.isawaitable(logged):  # Atropos's evaluate_log is a coroutine
            await logged
        return metrics

    async def finish_scoring(self) -> None:
        """Release scoring resources after a run (override)."""

    async def wandb_log(self, wandb_metrics: Optional[dict[str, Any]] = None) -> None:
        metrics = dict(wandb_metrics or {})
        metrics.update(self.eval_metrics)
        self.eval_metrics = []
        metrics.update(self.config_metrics())
        await super().wandb_log(metrics)


# -- multiple choice --------------------------------------------------------------------------


def letters_list(count: int) -> str:
    """``A, B, C or D`` for four choices."""
    letters = list(ascii_uppercase[:count])
    return letters[0] if count == 1 else ", ".join(letters[:-1]) + f" or {letters[-1]}"


def format_choices(choices: list[str]) -> str:
    return "\n".join(f"{ascii_uppercase[i]}) {str(choice).strip()}" for i, choice in enumerate(choices))


class MultipleChoiceEvalEnv(GenerativeEvalEnv):
    """Questions with lettered choices; the answer is one letter in ``<answer></answer>``.

    Items: ``id``, ``question``, ``choices`` (texts, lettered A, B, ... in order), ``gold``
    (the right letter) and any grouping fields named in `breakdowns`. Extraction: the answer
    tag (a letter, a lead-in then a letter, or a choice's text), then lighteval's fallback
    patterns, then (when `last_letter_fallback`) the valid letter written last.
    """

    intro: str = "Answer the following multiple choice question."
    last_letter_fallback: bool = False

    def few_shot_examples(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        """Solved items shown before the question (override)."""
        return []

    def question_text(self, item: dict[str, Any]) -> str:
        return str(item["question"]).strip()

    def user_prompt(self, item: dict[str, Any]) -> str:
        count = len(item["choices"])
        prompt = (f"{self.intro} Work through it step by step, then give your final answer as the letter alone "
                  f"({letters_list(count)}) inside <answer></answer> tags, for example <answer>A</answer>.\n\n"
                  f"{self.question_text(item)}\n\n{format_choices(item['choices'])}")
        shots = self.few_shot_examples(item)
        if not shots:
            return prompt
        solved = [f"Question: {self.question_text(shot)}\n{format_choices(shot['choices'])}\nAnswer: {shot['gold']}"
                  for shot in shots]
        return "Solved examples:\n\n" + "\n\n".join(solved) + "\n\nNow your question.\n\n" + prompt

    def extract_letter(self, content: str, item: dict[str, Any]) -> tuple[Optional[str], str]:
        return extract_mcqa_answer_with_fallback(content, len(item["choices"]), debug=self.config.full_debug,
                                                 choices=item["choices"], last_resort=self.last_letter_fallback)

    async def score_response(self, item: dict[str, Any], content: str, response: str) -> dict[str, Any]:
        letter, method = self.extract_letter(content, item)
        sample = {key: item[key] for key, _ in self.breakdowns if key in item}
        sample.update({
            "question": item["question"], "choices": item["choices"], "gold_answer": item["gold"],
            "extracted_answer": letter, "extraction_method": method, "is_correct": letter == item["gold"],
            "answer_tag_found": ANSWER_TAG_PATTERN.search(content) is not None,
        })
        return sample

    def extra_metrics(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        return {f"{self.task}/answer_tag_rate": self.rate(samples, lambda s: s.get("answer_tag_found"))}


def gold_letter(choices_count: int, index: Any) -> str:
    """The letter of the right choice from a 0-based index (int or numeric string)."""
    position = int(index)
    if not 0 <= position < choices_count:
        raise ValueError(f"answer index {index!r} outside {choices_count} choices")
    return ascii_uppercase[position]


# -- math -------------------------------------------------------------------------------------


class MathEvalConfig(EvalEnvConfig):
    """Fields of the math evaluations (GSM8K, MATH-500, AIME)."""

    shuffle_seed: int = Field(default=42, description="Seed of the question order.")
    max_math_workers: int = Field(
        default=64, description="Math verification processes (at most one per CPU); 0 checks answers in-process.")


class MathEvalEnv(GenerativeEvalEnv):
    """Problems answered with exactly one ``\\boxed{}`` (after ``</think>`` in thinking mode),
    compared with the gold answer by math-verify, else as normalized strings; several boxed
    answers score wrong. Items: ``id``, ``problem``, ``answer`` and grouping fields."""

    env_config_cls = MathEvalConfig

    def shuffled(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        random.Random(self.config.shuffle_seed).shuffle(items)
        return items

    async def score_response(self, item: dict[str, Any], content: str, response: str) -> dict[str, Any]:
        after_think = self.config.thinking_mode
        if self.config.max_math_workers > 0:
            correct, method, multiple = await score_math_answer_async(
                item["answer"], response, after_think=after_think, executor=get_math_executor(self.config.max_math_workers),
                debug=self.config.full_debug)
        else:
            correct, method, multiple = score_math_answer(item["answer"], response, after_think=after_think,
                                                          debug=self.config.full_debug)
        extracted, _, _ = extract_first_boxed_answer(response, after_think=after_think)
        if extracted is None and not multiple:
            boxed = extract_boxed_answers(content)
            extracted = boxed[0].strip() if boxed else None
        sample = {key: item[key] for key, _ in self.breakdowns if key in item}
        sample.update({
            "problem": item["problem"], "gold_answer": item["answer"], "extracted_answer": extracted,
            "verification_method": method, "is_correct": bool(correct), "has_multiple_boxed": multiple,
        })
        return sample

    def extra_metrics(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            f"{self.task}/has_boxed_rate": self.rate(samples, lambda s: s.get("extracted_answer") is not None),
            f"{self.task}/multiple_boxed_rate": self.rate(samples, lambda s: s.get("has_multiple_boxed")),
        }

    async def finish_scoring(self) -> None:
        shutdown_math_executor()
