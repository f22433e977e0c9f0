"""Instruction following (IFEval-style constraints) checked by verifier functions.

Each item is an instruction carrying one verifiable constraint ("answer in all lowercase",
"exactly 3 bullet points", "end with this phrase", ...) named by ``func_name`` with its
arguments; `IF_FUNCTIONS_MAP` maps the 25 constraint names to their verifiers. The model
reasons in exactly one ``<think> ... </think>`` block; only the text after it is checked
(a missing, repeated or misplaced think tag fails). A rollout scores 1.0 when the
constraint holds, else 0.0.

Groups are dropped when their average is above ``max_group_average_for_training`` (too
easy) or when all scores are equal; when every rollout passes (possible only if that
threshold is 1 or more), responses longer than 75 % of ``max_token_length`` lose score
linearly. An adaptive curriculum cycles the unsolved items: an item leaves circulation
once a group averages above that threshold or at least 0.9 (or, with
``solve_on_single_correct``, once any rollout passes); every 100 items the open queue is
written to ``environments/datasets/remaining_unsolved.jsonl``, which
``resume_from_unsolved_dataset`` reads back. ``dump_rollouts`` / ``dump_failed_rollouts``
write groups to ``environments/data_dumps/``.

Generation uses `managed_server()` on the completion endpoint, so it needs a token-level
backend: ``--openai.server_type vllm`` (or sglang). Language checks need ``langdetect``
(the ``examples`` extra).

Data: ``allenai/RLVR-IFeval`` (train; the first message's content is the instruction,
``ground_truth`` a JSON object with ``func_name`` and its arguments), shuffled with
``dataset_shuffle_seed`` and split by ``test_set_ratio``. Offline: ``--env.train_file``
(same layout), split the same way, or with ``--env.test_file`` as the test set.

    # offline, with the fixtures
    python environments/instruction_following_algorithm_environment.py process --openai.server_type vllm \\
        --openai.base_url http://localhost:9001/v1 --openai.model_name MODEL --env.tokenizer_name MODEL \\
        --env.train_file environments/fixtures/instruction_following/rlvr_ifeval.jsonl --env.total_steps 4
    # for real
    python environments/instruction_following_algorithm_environment.py serve --openai.server_type vllm \\
        --openai.base_url http://localhost:9004/v1
"""

import asyncio
import hashlib
import inspect
import json
import logging
import os
import re
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

from datasets import Dataset
from langdetect import DetectorFactory, LangDetectException, detect
from pydantic import Field

from atroposlib.envs.base import (
    APIServerConfig,
    BaseEnv,
    BaseEnvConfig,
    EvalHandlingEnum,
    ScoredDataGroup,
)
from atroposlib.envs.local_data import load_rows
from atroposlib.utils.length_penalty import length_scaled_score
from atroposlib.utils.reasoning_text import text_after_single_think_block

log = logging.getLogger(__name__)
DetectorFactory.seed = 0  # langdetect is randomised: the same text must always get the same verdict

system_prompt = (
    "Work through the request carefully before you answer. Reason step by step, for as long as you "
    "need, inside <think> and </think> tags. After the closing tag, write your response, following "
    "every instruction in the request exactly."
)

MIN_TRAINABLE_TOKENS = 10
MASTERED_AVERAGE = 0.9
QUEUE_DUMP_EVERY = 100


class IFConfig(BaseEnvConfig):
    dataset_name: str = Field("allenai/RLVR-IFeval", description="Hub dataset of instructions and constraints.")
    dataset_config_name: Optional[str] = Field(None, description="Hub configuration of the dataset, if any.")
    test_set_ratio: float = Field(0.05, description="Share of the dataset held out for evaluation.")
    dump_rollouts: bool = Field(False, description="Write groups with passing rollouts to data_dumps/.")
    dump_failed_rollouts: bool = Field(False, description="Write failing rollouts to data_dumps/ for debugging.")
    rollout_save_score_threshold: float = Field(0.7, description="Minimum score of a rollout written by dump_rollouts.")
    max_group_average_for_training: float = Field(
        0.75, description="Groups averaging above this are too easy: not trained on, and the item counts as solved."
    )
    dataset_shuffle_seed: int = Field(42, description="Seed of the shuffle before the train/test split.")
    resume_from_unsolved_dataset: Optional[str] = Field(
        None, description="A remaining_unsolved.jsonl to take the training queue from."
    )
    suppress_base_env_logs: bool = Field(default=True, description="Quieten the framework's and HTTP clients' logs.")
    solve_on_single_correct: bool = Field(
        default=False, description="An item is solved as soon as one rollout passes."
    )
    train_file: Optional[str] = Field(None, description="Local RLVR-IFeval-layout file instead of the hub's train split.")
    test_file: Optional[str] = Field(None, description="Local RLVR-IFeval-layout test set (default: split off the train rows).")


def _stable_id(raw_item: Dict) -> str:
    digest = hashlib.sha1(json.dumps(raw_item, sort_keys=True, default=str).encode()).hexdigest()
    return f"{raw_item['func_name']}_{int(digest, 16) % 100000}"


class InstructionFollowingEnv(BaseEnv):
    env_config_cls = IFConfig

    def __init__(self, config: IFConfig, server_configs: List[APIServerConfig], slurm=True, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        self.percent_correct_buffer = []
        self.eval_metrics = []
        self.rollouts_to_save_buffer = []
        self.failed_rollouts_to_save_buffer = []
        self.run_uuid = uuid.uuid4().hex[:8]
        self.save_file_batch_num = 0
        self.failed_save_file_batch_num = 0
        self.active_train_queue: List[Dict] = []
        self.solved_items: List[Dict] = []
        self.item_attempt_counts: Dict[str, int] = {}
        self.in_flight = 0  # items handed out and not scored yet
        self.iter = 0
        here = os.path.dirname(os.path.abspath(__file__))
        self.datadumps_dir = os.path.join(here, "data_dumps")
        self.datasets_dir = os.path.join(here, "datasets")
        if config.resume_from_unsolved_dataset:
            log.info("training items come from %s; evaluation items still from %s",
                     config.resume_from_unsolved_dataset, config.train_file or config.dataset_name)
        if config.suppress_base_env_logs:
            for name in ("atroposlib.envs.base", "httpx", "httpcore"):
                logging.getLogger(name).setLevel(logging.WARNING)

    @classmethod
    def config_init(cls) -> Tuple[IFConfig, List[APIServerConfig]]:
        env_config = IFConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
            group_size=32,
            use_wandb=True,
            rollout_server_url="http://localhost:8000",
            total_steps=500,
            batch_size=1024,
            steps_per_eval=20,
            max_token_length=1024 * 15,
            inference_weight=1.0,
            wandb_name="instruction_following_rlvr_ifeval",
            eval_handling=EvalHandlingEnum.LIMIT_TRAIN,
            eval_limit_ratio=0.1,
            dataset_name="allenai/RLVR-IFeval",
            dataset_config_name=None,
            test_set_ratio=0.05,
            dump_rollouts=False,
            dump_failed_rollouts=False,
            rollout_save_score_threshold=0.7,
            max_group_average_for_training=0.75,
            dataset_shuffle_seed=42,
            resume_from_unsolved_dataset=None,
            suppress_base_env_logs=True,
            solve_on_single_correct=False,
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

    # -- data ---------------------------------------------------------------------------------
    @staticmethod
    def parse_rows(rows: List[Dict]) -> List[Dict]:
        """Dataset rows as items: the instruction, the verifier's name and its arguments
        (rows that cannot be used are skipped)."""
        items = []
        for row in rows:
            messages = row.get("messages")
            prompt = messages[0].get("content") if isinstance(messages, list) and messages else None
            truth = row.get("ground_truth")
            if not prompt or not isinstance(truth, str):
                continue
            try:
                parsed = json.loads(truth)
            except json.JSONDecodeError:
                continue
            if not isinstance(parsed, dict) or parsed.get("func_name") not in IF_FUNCTIONS_MAP:
                continue
            items.append({
                "prompt": prompt,
                "func_name": parsed["func_name"],
                "args": {k: v for k, v in parsed.items() if k != "func_name" and v is not None},
                "original_constraints_for_logging": str(row.get("constraint", "")),
                "expected_response_for_logging": "",
            })
        return items

    def _load(self, local_file: Optional[str]) -> List[Dict]:
        rows = load_rows(self.config.dataset_name, self.config.dataset_config_name, split="train", local_file=local_file)
        items = self.parse_rows(rows)
        if not items:
            raise ValueError(f"no usable instruction in {local_file or self.config.dataset_name}")
        return items

    async def setup(self):
        items = self._load(self.config.train_file)
        # shuffled and split as a Dataset would be, on row numbers: the items' argument dicts
        # differ in keys from row to row and must not become one Arrow struct
        order = Dataset.from_dict({"row": list(range(len(items)))}).shuffle(seed=self.config.dataset_shuffle_seed)
        if self.config.test_file:
            self.train, self.test = [items[r] for r in order["row"]], self._load(self.config.test_file)
        elif len(items) == 1:
            self.train = self.test = items
        else:
            count = len(items)
            test_items = 1 if count < 5 else max(1, int(count * self.config.test_set_ratio))
            share = test_items / count
            if share >= 0.5 and count > 2:
                share = (count - 1) / count
            split = order.train_test_split(test_size=share, seed=42)
            self.train = [items[r] for r in split["train"]["row"]]
            self.test = [items[r] for r in split["test"]["row"]]
        self.iter = 0
        self.active_train_queue, self.solved_items, self.item_attempt_counts = list(self.train), [], {}
        if self.config.resume_from_unsolved_dataset:
            self._load_from_unsolved_dataset()

    def _load_from_unsolved_dataset(self) -> None:
        path = self.config.resume_from_unsolved_dataset
        try:
            with open(path, encoding="utf-8") as lines:
                entries = [json.loads(line) for line in lines if line.strip()]
        except (OSError, json.JSONDecodeError) as exc:
            log.warning("cannot resume from %s (%s): starting from the full training set", path, exc)
            return
        queue, counts = [], {}
        for entry in entries:
            meta = entry.pop("_curriculum_metadata", {}) or {}
            if not all(key in entry for key in ("prompt", "func_name", "args")):
                continue
            queue.append(entry)
            if meta.get("item_id") and meta.get("attempt_count", 0) > 0:
                counts[meta["item_id"]] = meta["attempt_count"]
        if not queue:
            log.warning("%s holds no usable item: starting from the full training set", path)
            return
        self.active_train_queue, self.solved_items, self.item_attempt_counts = queue, [], counts
        log.info("resumed %d unsolved items from %s", len(queue), path)

    def save_checkpoint(self, step, data=None):
        if data is None:
            data = {}
        data.update({
            "iter": self.iter, "save_file_batch_num": self.save_file_batch_num,
            "failed_save_file_batch_num": self.failed_save_file_batch_num,
            "active_train_queue": self.active_train_queue, "solved_items": self.solved_items,
            "item_attempt_counts": self.item_attempt_counts,
        })
        super().save_checkpoint(step, data)

    async def get_next_item(self):
        if not self.active_train_queue and self.solved_items and not self.in_flight:  # all solved: go round again
            log.info("all %d items solved; putting them back in circulation", len(self.solved_items))
            self.active_train_queue, self.solved_items, self.item_attempt_counts = list(self.solved_items), [], {}
        if self.active_train_queue:
            raw_item = self.active_train_queue.pop(0)
        else:  # the open items are all being rolled out right now: attempt one of them again
            raw_item = self.train[self.iter % len(self.train)]
        self.iter += 1
        self.in_flight += 1
        item_id = _stable_id(raw_item)
        self.item_attempt_counts[item_id] = self.item_attempt_counts.get(item_id, 0) + 1
        if self.iter % QUEUE_DUMP_EVERY == 0:
            self._dump_active_queue_dataset()
        return {
            "messages": [{"role": "system", "content": system_prompt}, {"role": "user", "content": raw_item["prompt"]}],
            "func_name": raw_item["func_name"], "args": raw_item["args"], "item_id": item_id, "raw_item": raw_item,
            "attempt_count": self.item_attempt_counts[item_id],
        }

    # -- scoring -------------------------------------------------------------------------------
    def score_response(self, text: str, func_name: str, args: Dict[str, Any]) -> float:
        """1.0 when the response (after its think block) meets the constraint, else 0.0."""
        response = text_after_single_think_block(text)
        verifier = IF_FUNCTIONS_MAP.get(func_name)
        if response is None or verifier is None:
            return 0.0
        response = response.strip()
        accepted = [name for name in inspect.signature(verifier).parameters if name != "text"]
        try:
            result = verifier(response, **{name: args[name] for name in accepted if args.get(name) is not None})
        except (LangDetectException, TypeError, ValueError, KeyError) as exc:
            log.debug("verifier %s failed on %r: %s", func_name, response[:80], exc)
            return 0.0
        if isinstance(result, tuple):
            result = result[0]
        return 1.0 if result is True else 0.0

    async def collect_trajectories(self, item) -> Tuple[Optional[ScoredDataGroup], List]:
        try:
            return await self._collect(item)
        finally:
            self.in_flight = max(0, self.in_flight - 1)

    async def _collect(self, item) -> Tuple[Optional[ScoredDataGroup], List]:
        prompt = self.tokenizer.apply_chat_template(item["messages"], add_generation_prompt=True, tokenize=False)
        try:
            async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
                completion = await managed.completion(
                    prompt=prompt, n=self.config.group_size, max_tokens=self.config.max_token_length, temperature=0.8,
                )
                nodes = managed.get_state()["nodes"]
        except Exception:
            log.exception("generation failed")
            if item["raw_item"] not in self.active_train_queue:  # keep it in circulation
                self.active_train_queue.append(item["raw_item"])
            return None, []
        rollouts = [{
            "messages": item["messages"] + [{"role": "assistant", "content": choice.text}],
            "score": self.score_response(choice.text, item["func_name"], item["args"]),
            "tokens": node.tokens, "masks": node.masked_tokens, "logprobs": node.logprobs,
        } for choice, node in zip(completion.choices, nodes)]
        group = await self.score(rollouts, item)
        scores = [rollout["score"] for rollout in rollouts]
        self._handle_item_result(item, sum(scores) / len(scores), scores)
        return group, []

    async def score(self, rollouts: List[Dict], item) -> Optional[ScoredDataGroup]:
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[], inference_logprobs=[])
        passed, failed = [], []
        for rollout in rollouts:
            record = {"conversation": rollout["messages"], "score": rollout["score"]}
            if self.config.dump_rollouts and rollout["score"] >= self.config.rollout_save_score_threshold:
                passed.append(record)
            elif self.config.dump_failed_rollouts and rollout["score"] == 0:
                failed.append(record)
            if sum(1 for label in rollout["masks"] if label != -100) < MIN_TRAINABLE_TOKENS:
                continue
            group["tokens"].append(rollout["tokens"])
            group["masks"].append(rollout["masks"])
            group["inference_logprobs"].append(rollout["logprobs"])
            group["messages"].append(rollout["messages"])
            group["scores"].append(rollout["score"])
            if len(group["tokens"]) >= self.config.group_size:
                break
        if not group["tokens"]:
            return None
        average = sum(group["scores"]) / len(group["scores"])
        too_easy = average > self.config.max_group_average_for_training
        log.info("%s: group average %.3f%s", item["func_name"], average, " (too easy: not trained on)" if too_easy else "")
        self._buffer_dumps(item, passed, failed, average, too_easy)
        if too_easy:
            return None
        self.percent_correct_buffer.extend(group["scores"])
        if all(score == 1.0 for score in group["scores"]):
            # 1.0 up to 75 % of max_token_length, then falling linearly to 0 at the limit
            group["scores"] = [length_scaled_score(score, len(tokens), self.config.max_token_length, 0.75)
                               for score, tokens in zip(group["scores"], group["tokens"])]
        if len(group["scores"]) > 1 and len(set(group["scores"])) == 1:
            return None
        return group

    def _handle_item_result(self, item, average: float, scores: List[float]) -> None:
        """Take a solved item out of circulation; put an unsolved one back at the end."""
        raw_item, item_id = item["raw_item"], item["item_id"]
        solved = (self.config.solve_on_single_correct and any(score >= 1.0 for score in scores)) or (
            average > self.config.max_group_average_for_training or average >= MASTERED_AVERAGE)
        if solved:
            if raw_item not in self.solved_items:
                self.solved_items.append(raw_item)
            if raw_item in self.active_train_queue:
                self.active_train_queue.remove(raw_item)
        elif raw_item not in self.active_train_queue and raw_item not in self.solved_items:
            self.active_train_queue.append(raw_item)
        log.info("item %s (attempt %d): average %.3f, %s; %d queued, %d solved", item_id, item["attempt_count"],
                 average, "solved" if solved else "back in the queue", len(self.active_train_queue),
                 len(self.solved_items))

    # -- data dumps ----------------------------------------------------------------------------
    def _buffer_dumps(self, item, passed: List[Dict], failed: List[Dict], average: float, too_easy: bool) -> None:
        if not passed and not failed:
            return
        details = {"func_name": item["func_name"], "args": item["args"]}
        entry = {"item_id": f"allenai_RLVR-IFeval_train_item_{item['item_id']}", "constraint_details": details,
                 "group_average_score": average, "skipped_for_training": too_easy}
        if passed and (not too_easy or average <= self.config.max_group_average_for_training + 0.1):
            self.rollouts_to_save_buffer.append({**entry, "rollouts": passed})
        if failed:
            self.failed_rollouts_to_save_buffer.append({**entry, "rollouts": failed})
        if self.config.dump_rollouts and len(self.rollouts_to_save_buffer) >= 100:
            self.save_file_batch_num = self._write_dump(self.rollouts_to_save_buffer, "instruction_following_rollouts",
                                                        self.save_file_batch_num)
        if self.config.dump_failed_rollouts and len(self.failed_rollouts_to_save_buffer) >= 50:
            self.failed_save_file_batch_num = self._write_dump(
                self.failed_rollouts_to_save_buffer, "instruction_following_failed_rollouts",
                self.failed_save_file_batch_num)

    def _write_dump(self, buffer: List[Dict], prefix: str, batch: int) -> int:
        os.makedirs(self.datadumps_dir, exist_ok=True)
        path = os.path.join(self.datadumps_dir, f"{prefix}_{self.run_uuid}_{batch:04d}.jsonl")
        with open(path, "w", encoding="utf-8") as out:
            for entry in buffer:
                out.write(json.dumps(entry, ensure_ascii=False) + "\n")
        log.info("wrote %d groups to %s", len(buffer), path)
        buffer.clear()
        return batch + 1

    def _dump_active_queue_dataset(self) -> None:
        """The unsolved items, with their attempt counts, for resume_from_unsolved_dataset."""
        if not self.active_train_queue:
            return
        os.makedirs(self.datasets_dir, exist_ok=True)
        path = os.path.join(self.datasets_dir, "remaining_unsolved.jsonl")
        with open(path, "w", encoding="utf-8") as out:
            for position, raw_item in enumerate(self.active_train_queue):
                item_id = _stable_id(raw_item)
                meta = {"item_id": item_id, "attempt_count": self.item_attempt_counts.get(item_id, 0),
                        "queue_position": position, "total_active": len(self.active_train_queue),
                        "total_solved": len(self.solved_items), "iteration_dumped": self.iter}
                out.write(json.dumps({**raw_item, "_curriculum_metadata": meta}, ensure_ascii=False) + "\n")

    async def close(self):
        """Write what the dump buffers and the curriculum queue still hold."""
        if self.config.dump_rollouts and self.rollouts_to_save_buffer:
            self.save_file_batch_num = self._write_dump(self.rollouts_to_save_buffer, "instruction_following_rollouts",
                                                        self.save_file_batch_num)
        if self.config.dump_failed_rollouts and self.failed_rollouts_to_save_buffer:
            self.failed_save_file_batch_num = self._write_dump(
                self.failed_rollouts_to_save_buffer, "instruction_following_failed_rollouts",
                self.failed_save_file_batch_num)
        self._dump_active_queue_dataset()

    # -- evaluation ------------------------------------------------------------------------------
    async def rollout_and_score_eval(self, test_item: Dict) -> dict:
        messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": test_item["prompt"]}]
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        completion = await self.server.completion(
            prompt=prompt, n=1, max_tokens=self.config.max_token_length, temperature=0.2, split="eval",
        )
        text = completion.choices[0].text
        score = self.score_response(text, test_item["func_name"], test_item["args"])
        return {"messages": messages + [{"role": "assistant", "content": text}], "score": score,
                "correct": score == 1.0, "gold_answer": test_item["func_name"],
                "finish_reason": completion.choices[0].finish_reason}

    async def evaluate(self, *args, **kwargs):
        if not self.test:
            self.eval_metrics.append(("eval/percent_correct", 0.0))
            return
        start = time.time()
        samples = await asyncio.gather(*(self.rollout_and_score_eval(item) for item in self.test))
        percent_correct = sum(sample["score"] for sample in samples) / len(samples)
        self.eval_metrics.append(("eval/percent_correct", percent_correct))
        self.evaluate_log({"eval/percent_correct": percent_correct}, samples=list(samples), start_time=start,
                          end_time=time.time(),
                          generation_parameters={"temperature": 0.2, "max_tokens": self.config.max_token_length})

    async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
        metrics = dict(wandb_metrics or {})
        if self.percent_correct_buffer:
            metrics["train/percent_correct"] = sum(self.percent_correct_buffer) / len(self.percent_correct_buffer)
        total = len(self.active_train_queue) + len(self.solved_items)
        if total:
            metrics["curriculum/active_items"] = len(self.active_train_queue)
            metrics["curriculum/solved_items"] = len(self.solved_items)
            metrics["curriculum/percent_solved"] = len(self.solved_items) / total
            metrics["curriculum/total_items"] = total
            active = [self.item_attempt_counts[i] for i in map(_stable_id, self.active_train_queue)
                      if i in self.item_attempt_counts]
            if active:
                metrics["curriculum/avg_attempts_active"] = sum(active) / len(active)
        self.percent_correct_buffer = []
        metrics.update(dict(self.eval_metrics))
        self.eval_metrics = []
        await super().wandb_log(metrics)


# -- the constraint verifiers (IFEval's 25 constraint types; open-instruct's function names) ---------

def _count_ok(actual: int, N: int, quantifier: str, around: int) -> bool:
    if quantifier == "at least":
        return actual >= N
    if quantifier == "at most":
        return actual <= N
    if quantifier == "around":
        return abs(actual - N) <= around
    return False


def verify_keywords(text: str, keyword_list: List[str]) -> bool:
    """Every keyword appears (case-insensitive, anywhere)."""
    lowered = text.lower()
    return all(keyword.lower() in lowered for keyword in keyword_list)


def verify_keyword_frequency(text: str, word: str, N: int) -> bool:
    """`word` appears exactly N times as a whole word (case-insensitive)."""
    return sum(1 for token in re.findall(r"\b\w+\b", text.lower()) if token == word.lower()) == N


def validate_forbidden_words(text: str, forbidden_words: List[str]) -> bool:
    """None of the forbidden words appears (case-insensitive, anywhere)."""
    lowered = text.lower()
    return not any(word.lower() in lowered for word in forbidden_words)


def verify_letter_frequency(text: str, letter: str, N: int) -> bool:
    """The (case-sensitive) letter occurs exactly N times."""
    return len(letter) == 1 and text.count(letter) == N


def validate_response_language(text: str, language: str) -> bool:
    """langdetect names `language` (an ISO 639-1 code) for the response."""
    try:
        return detect(text) == language
    except LangDetectException:
        return False


def verify_paragraph_count(text: str, N: int) -> bool:
    """N paragraphs separated by the markdown divider ``* * *``."""
    cleaned = "\n".join(line.strip() for line in text.splitlines()).strip()
    if not cleaned:
        return N == 0
    return len(cleaned.split("* * *")) == N


def validate_word_constraint(text: str, N: int, quantifier: str) -> bool:
    """At least / at most / around (10 %, at least 1) N whitespace-separated words."""
    return _count_ok(len(text.split()), N, quantifier, max(round(N * 0.1), 1))


_SENTENCE_END = re.compile(r"(?<!\w\.\w\.)(?<![A-Z][a-z]\.)(?<=[.?!])\s")


def verify_sentence_constraint(text: str, N: int, quantifier: str) -> bool:
    """At least / at most / around (±1) N sentences (split after . ? ! but not after
    abbreviations such as "e.g." or "Mr.")."""
    sentences = [part for part in _SENTENCE_END.split(text.strip()) if part.strip()]
    return _count_ok(len(sentences), N, quantifier, 1)


def validate_paragraphs(text: str, N: int, first_word: str, i: int) -> bool:
    """N paragraphs separated by blank lines, the i-th (1-based) starting with `first_word`."""
    paragraphs = text.split("\n\n")
    if len(paragraphs) != N or not 1 <= i <= N:
        return False
    words = paragraphs[i - 1].split()
    return bool(words) and words[0].lower() == first_word.lower()


def verify_postscript(text: str, postscript_marker: str) -> bool:
    """A postscript starting with the marker (e.g. "P.S.") is present."""
    position = text.rfind(postscript_marker)
    return position != -1 and len(text[position:].strip()) >= len(postscript_marker.strip())


def validate_placeholders(text: str, N: int) -> Tuple[bool, List[str]]:
    """At least N square-bracket placeholders such as [address]; also returns them."""
    found = re.findall(r"\[(.*?)\]", text)
    return len(found) >= N, found


def verify_bullet_points(text: str, N: int) -> bool:
    """Exactly N markdown bullet lines (``*``, ``-`` or ``+`` then a space)."""
    return sum(1 for line in text.splitlines() if re.match(r"\s*[*+-]\s+", line)) == N


def validate_title(text: str) -> bool:
    """A title wrapped in double angular brackets, like <<title>>."""
    return re.search(r"<<(.*?)>>", text) is not None


def validate_choice(text: str, options: List[str]) -> bool:
    """The whole response is one of the options (case-insensitive)."""
    return text.strip().lower() in {option.strip().lower() for option in options}


def validate_highlighted_sections(text: str, N: int) -> bool:
    """At least N non-empty markdown highlights, *like this* or **like this**."""
    single = [m for m in re.findall(r"\*([^\n*]*)\*", text) if m.strip()]
    double = [m for m in re.findall(r"\*\*([^\n*]*)\*\*", text) if m.strip()]
    return len(single) + len(double) >= N


def validate_sections(text: str, N: int, section_splitter: str) -> bool:
    """Exactly N section headers: the splitter, an optional number, then ``:``, ``.`` or a space."""
    headers = re.findall(re.escape(section_splitter) + r"\s*\d*(?:[:.\s]|$)", text, re.IGNORECASE)
    return len(headers) == N


def validate_json_format(text: str) -> bool:
    """The whole response parses as JSON."""
    try:
        json.loads(text.strip())
    except ValueError:
        return False
    return True


def validate_repeat_prompt(text: str, original_prompt: str) -> bool:
    """The response starts with the request, repeated unchanged (whitespace aside)."""
    return " ".join(text.split()).startswith(" ".join(original_prompt.split()))


def validate_two_responses(text: str) -> bool:
    """Two different, non-empty responses separated by one ``******``."""
    if text.count("******") != 1:
        return False
    first, second = (part.strip() for part in text.split("******"))
    return bool(first) and bool(second) and first != second


def validate_uppercase(text: str) -> bool:
    """No lowercase letters."""
    return text == text.upper()


def validate_lowercase(text: str) -> bool:
    """No uppercase letters."""
    return text == text.lower()


def validate_frequency_capital_words(text: str, N: int, quantifier: str) -> bool:
    """At least / at most / around (10 %, at least 1) N all-capital words of 2+ letters."""
    return _count_ok(len(re.findall(r"\b[A-Z]{2,}\b", text)), N, quantifier, max(round(N * 0.1), 1))


def validate_end(text: str, end_phrase: str) -> bool:
    """The response ends with the exact phrase (trailing whitespace aside)."""
    return text.strip().endswith(end_phrase.strip())


def validate_quotation(text: str) -> bool:
    """The whole response is wrapped in double quotation marks."""
    stripped = text.strip()
    return len(stripped) >= 2 and stripped.startswith('"') and stripped.endswith('"')


def validate_no_commas(text: str) -> bool:
    """No commas at all."""
    return "," not in text


IF_FUNCTIONS_MAP = {
    "verify_keywords": verify_keywords,
    "verify_keyword_frequency": verify_keyword_frequency,
    "validate_forbidden_words": validate_forbidden_words,
    "verify_letter_frequency": verify_letter_frequency,
    "validate_response_language": validate_response_language,
    "verify_paragraph_count": verify_paragraph_count,
    "validate_word_constraint": validate_word_constraint,
    "verify_sentence_constraint": verify_sentence_constraint,
    "validate_paragraphs": validate_paragraphs,
    "verify_postscript": verify_postscript,
    "validate_placeholders": validate_placeholders,
    "verify_bullet_points": verify_bullet_points,
    "validate_title": validate_title,
    "validate_choice": validate_choice,
    "validate_highlighted_sections": validate_highlighted_sections,
    "validate_sections": validate_sections,
    "validate_json_format": validate_json_format,
    "validate_repeat_prompt": validate_repeat_prompt,
    "validate_two_responses": validate_two_responses,
    "validate_uppercase": validate_uppercase,
    "validate_lowercase": validate_lowercase,
    "validate_frequency_capital_words": validate_frequency_capital_words,
    "validate_end": validate_end,
    "validate_quotation": validate_quotation,
    "validate_no_commas": validate_no_commas,
}

if __name__ == "__main__":
    InstructionFollowingEnv.cli()
