"""Letter counting on a ladder of ten difficulty levels that follows the model's success rate.

Each item is a text and one or more letters; the model reasons in ``<think> ... </think>``
and then answers in ``<answer>``: a number when one letter is asked for, a JSON object
``{"letter": count, ...}`` when several are. Levels 1-5 use English words (longer words and
more letters as the level rises), levels 6-10 random lowercase strings of 40 to 500
characters with 8 to 50 letters to count (`DIFFICULTY_TIERS`).

Reward: 1.0 when the answer holds the exact count(s) and the reply has exactly one
``<think>`` block followed by exactly one ``<answer>``, else 0.0 (also 0.0 when generation
hit the length limit). Rollouts with fewer than 10 generated tokens are not trained on.
The success rate of groups at the current level (a window of ``difficulty_window_size``
groups, at least max(10, window/2) of them, or the whole window if smaller, before any change) moves the level up above
``difficulty_increase_threshold`` and down below ``difficulty_decrease_threshold``; a group
whose own success rate is outside that band, or whose scores are all equal, is not
trained on. Rollouts come from one `managed_server()` chat call (token ids and logprobs),
so run it with ``--openai.server_type vllm`` (or sglang).

Data. Words: ``--env.word_list_file`` (one word per line) if given, else NLTK's ``words``
corpus as Atropos uses it (downloaded with ``nltk.download("words")`` when missing), else
the list shipped beside this file (``words.txt``: about 1,700 words taken from the
public-domain novel that reasoning-gym bundles plus long words we wrote, so it runs with
no internet). Evaluation: the Hugging Face dataset ``NousResearch/Letter-Counting-Eval``
(split ``train``; columns ``Prompt``, ``Answer``, ``DifficultyLevel``, ``_text``,
``_target_letters``, ``_expected_counts``), or ``--env.test_file`` in that layout
(``environments/fixtures/letter_counting/eval.jsonl`` is a small one we generated).

`config_init()` reads ``--config FILE`` (or ``config.yaml`` in the working directory, as
Atropos does) for its defaults; ``config.yaml`` beside this file is Atropos's run
configuration.

Offline, against any OpenAI/vLLM-compatible server:

    python environments/letter_counting_environment/letter_counting_environment.py process \\
        --openai.server_type vllm --openai.base_url http://localhost:9001/v1 --openai.model_name MODEL \\
        --env.tokenizer_name MODEL --env.word_list_file environments/letter_counting_environment/words.txt \\
        --env.test_file environments/fixtures/letter_counting/eval.jsonl --env.total_steps 8

For real (from this directory, with a trainer and run-api):

    cd environments/letter_counting_environment && python letter_counting_environment.py serve \\
        --config config.yaml --openai.server_type vllm
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import re
import string
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import yaml
from pydantic import Field

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.local_data import load_rows
from atroposlib.type_definitions import Item
from atroposlib.utils.reasoning_text import text_after_single_think_block

HERE = Path(__file__).resolve().parent
DEFAULT_CONFIG_PATH = "config.yaml"
SHIPPED_WORD_LIST = HERE / "words.txt"
ALPHABET = string.ascii_lowercase
MIN_TRAINABLE_TOKENS = 10

log = logging.getLogger("letter_counting")


def get_config_path() -> str:
    """The YAML file named by ``--config PATH`` / ``--config=PATH`` on the command line, else
    ``config.yaml`` (relative to the working directory)."""
    argv = sys.argv
    for index, arg in enumerate(argv):
        if arg == "--config" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return DEFAULT_CONFIG_PATH


@dataclass(frozen=True)
class Tier:
    """One difficulty level: how long the text is, how many letters are asked for (and how
    often more than one), and whether the text is a random string instead of a word."""

    min_length: int
    max_length: int
    multi_letter_probability: float
    min_letters: int
    max_letters: int
    random_text: bool


# Level -> Tier. Words up to level 5, random strings from level 6 on.
DIFFICULTY_TIERS: dict[int, Tier] = {
    1: Tier(3, 8, 0.0, 1, 1, False),
    2: Tier(5, 12, 0.5, 1, 2, False),
    3: Tier(8, 18, 0.6, 2, 3, False),
    4: Tier(10, 25, 0.8, 3, 5, False),
    5: Tier(15, 35, 0.9, 5, 8, False),
    6: Tier(40, 80, 1.0, 8, 12, True),
    7: Tier(80, 150, 1.0, 12, 20, True),
    8: Tier(150, 250, 1.0, 18, 30, True),
    9: Tier(250, 400, 1.0, 25, 40, True),
    10: Tier(400, 500, 1.0, 35, 50, True),
}

FORMAT_RULES = ("First reason inside <think> </think> tags. After </think>, write your final answer once, "
                "inside <answer> </answer> tags")


class LetterCountingConfig(BaseEnvConfig):
    """Settings of `LetterCountingEnv` (Atropos's fields and defaults, plus the local files)."""

    generation_temperature: float = Field(1.0, description="Sampling temperature of training rollouts.")
    eval_temperature: float = Field(0.6, description="Sampling temperature of evaluation answers.")
    max_generation_tokens: int = Field(1024 * 15, description="max_tokens of every generation.")
    difficulty_window_size: int = Field(150, description="Groups at the current level whose success rate moves the level.")
    difficulty_increase_threshold: float = Field(
        0.8, description="Level up above this success rate; groups above it are not trained on (too easy).")
    difficulty_decrease_threshold: float = Field(
        0.2, description="Level down below this success rate; groups below it are not trained on (too hard).")
    min_difficulty_level: int = Field(1, description="Lowest level (1 is the easiest).")
    max_difficulty_level: int = Field(10, description="Highest level (10 is the hardest).")
    starting_difficulty_level: int = Field(3, description="Level of the first items (1-10).")
    debug_logging: bool = Field(True, description="Log every item and group at DEBUG level.")
    suppress_base_env_logs: bool = Field(True, description="Raise the framework's env logger to WARNING.")
    dump_rollouts: bool = Field(False, description="Save the correct rollouts of trained groups to data_dumps/*.jsonl.")
    dump_batch_size: int = Field(100, description="Groups per data-dump file.")
    word_list_file: Optional[str] = Field(
        None, description="Words to count letters in (one per line), instead of NLTK's word list.")
    test_file: Optional[str] = Field(
        None, description="Local evaluation file in Letter-Counting-Eval's layout, instead of the hub dataset.")


@dataclass
class Question:
    """A generated item's text, letters and counts, and the level it was made at."""

    text: str
    letters: list[str]
    counts: dict[str, int]
    level: int


def build_prompt(text: str, letters: list[str]) -> str:
    """The user message asking for the counts of `letters` in `text`."""
    if len(letters) == 1:
        return (f"How many times does the letter '{letters[0]}' occur in the string \"{text}\"?\n\n"
                f"{FORMAT_RULES}, as a whole number, for example <answer>4</answer>.")
    listed = ", ".join(f"'{letter}'" for letter in letters[:-1]) + f" and '{letters[-1]}'"
    example = json.dumps({letter: 0 for letter in letters})
    return (f"Count how many times each of the letters {listed} occurs in the string \"{text}\".\n\n"
            f"{FORMAT_RULES}, as one JSON object with every one of these letters as a key and its count "
            f"as the value, for example <answer>{example}</answer>.")


def extract_answer(response: str, multi: bool) -> Union[int, dict[str, int], None]:
    """The answer in `response`, or None when it breaks the format.

    The reply must hold exactly one ``<think>`` and one ``</think>`` and, after the latter,
    exactly one well-formed ``<answer>``: digits for one letter, a JSON object of integer
    counts for several.
    """
    after = text_after_single_think_block(response)
    if after is None:
        return None
    if not multi:
        found = re.findall(r"<answer>\s*(\d+)\s*</answer>", after, re.IGNORECASE)
        return int(found[0]) if len(found) == 1 else None
    found = re.findall(r"<answer>\s*(\{[^{}]*\})\s*</answer>", after, re.IGNORECASE)
    if len(found) != 1:
        return None
    try:
        parsed = json.loads(found[0])
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in parsed.items()):
        return None
    return parsed


def is_correct(answer: Union[int, dict[str, int], None], letters: list[str], counts: dict[str, int]) -> bool:
    """Whether an extracted answer gives exactly the expected count(s)."""
    if answer is None:
        return False
    if len(letters) == 1:
        return isinstance(answer, int) and answer == counts[letters[0]]
    return isinstance(answer, dict) and set(answer) == set(letters) and all(answer[k] == counts[k] for k in letters)


def parse_expected(answer: Any) -> tuple[Union[int, dict[str, int], None], bool]:
    """An evaluation row's ``Answer`` (a number, or counts as a JSON object or a mapping) as
    (expected answer, several letters?); (None, False) when it cannot be read."""
    if isinstance(answer, dict):
        return {str(k): int(v) for k, v in answer.items()}, True
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        return int(answer), False
    try:
        parsed = json.loads(str(answer))
    except ValueError:
        return None, False
    if isinstance(parsed, dict):
        return {str(k): int(v) for k, v in parsed.items()}, True
    if isinstance(parsed, (int, float)) and not isinstance(parsed, bool):
        return int(parsed), False
    return None, False


def read_word_list(path: Union[str, Path]) -> list[str]:
    """Words of a plain text file, one per line (blank lines and ``#`` comments skipped)."""
    lines = Path(path).expanduser().read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def nltk_words() -> Optional[list[str]]:
    """NLTK's English word list, downloading it once when it is missing; None when neither works."""
    try:
        import nltk
        from nltk.corpus import words
    except ImportError:
        return None
    try:
        return list(words.words())
    except LookupError:
        pass
    try:
        if not nltk.download("words", quiet=True):
            return None
        return list(words.words())
    except Exception:  # no network, or a broken download: the caller falls back
        return None


class LetterCountingEnv(BaseEnv):
    """Count letters in words and random strings, with the difficulty adapting to the model."""

    name = "letter_counting"
    env_config_cls = LetterCountingConfig

    TRAIN_TEST_SPLIT = 0.95
    RANDOM_SEED = 42
    MIN_WORD_LENGTH = 3
    MAX_WORD_LENGTH = 30
    EVAL_DATASET_HF = "NousResearch/Letter-Counting-Eval"

    def __init__(self, config: LetterCountingConfig, server_configs: list[APIServerConfig], slurm=True, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        self.run_uuid = str(uuid.uuid4())
        self.rng = random.Random(self.RANDOM_SEED)
        self.iter = 0
        self.train_words: list[str] = []
        self.test_words: list[str] = []
        self.word_source = ""
        self.eval_dataset: list[dict[str, Any]] = []
        # curriculum state (workers score groups concurrently)
        self._difficulty_lock = threading.Lock()
        self.current_difficulty_level = self._clamp(config.starting_difficulty_level)
        self.recent_scores: list[float] = []
        self.difficulty_history: list[tuple[int, int, float]] = []
        # metrics
        self.percent_correct_buffer: list[float] = []
        self.eval_metrics: list[tuple[str, float]] = []
        self.letter_distribution_stats: dict[str, int] = {}
        self.word_length_stats: dict[int, int] = {}
        self.answer_format_errors = 0
        self.think_format_errors = 0
        self.groups_scored = 0
        self.groups_too_easy = 0
        self.groups_too_hard = 0
        # data dumps
        self.datadumps_dir = str(HERE / "data_dumps")
        self.rollouts_to_save_buffer: list[dict[str, Any]] = []
        self.processed_item_count = 0
        self.save_file_batch_num = 0

        self.logger = logging.getLogger(type(self).__name__)
        if not self.logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s"))
            self.logger.addHandler(handler)
        self.logger.setLevel(logging.DEBUG if config.debug_logging else logging.INFO)
        if config.suppress_base_env_logs:
            logging.getLogger("atroposlib.envs.base").setLevel(logging.WARNING)
        self.logger.info("difficulty starts at L%d (levels %d-%d, window %d, up above %.0f%%, down below %.0f%%)",
                         self.current_difficulty_level, config.min_difficulty_level, config.max_difficulty_level,
                         config.difficulty_window_size, 100 * config.difficulty_increase_threshold,
                         100 * config.difficulty_decrease_threshold)

    @classmethod
    def config_init(cls) -> tuple[LetterCountingConfig, list[APIServerConfig]]:
        """Defaults from the YAML file of `get_config_path()` (Atropos's built-in ones when it is absent)."""
        path = get_config_path()
        try:
            with open(path, encoding="utf-8") as handle:
                document = yaml.safe_load(handle) or {}
            log.info("config_init: defaults from %s", path)
        except FileNotFoundError:
            document = {}
        except (OSError, yaml.YAMLError) as exc:
            log.error("config_init: cannot read %s (%s); using the built-in defaults", path, exc)
            document = {}
        env = document.get("env") or {}
        built_in = {
            "tokenizer_name": "meta-llama/Llama-3.1-8B-Instruct", "group_size": 16, "batch_size": 256,
            "max_batches_offpolicy": 3, "use_wandb": True, "rollout_server_url": "http://localhost:8000",
            "wandb_name": "tinker-letter-counting-env", "ensure_scores_are_not_same": True,
            "max_token_length": 16864, "max_num_workers": 24, "total_steps": 5000, "steps_per_eval": 100,
            "inference_weight": 1.0, "data_path_to_save_groups": None, "eval_limit_ratio": 0.1,
            "generation_temperature": 1.0, "eval_temperature": 0.6, "max_generation_tokens": 15360,
            "difficulty_window_size": 150, "difficulty_increase_threshold": 0.8,
            "difficulty_decrease_threshold": 0.2, "min_difficulty_level": 1, "max_difficulty_level": 10,
            "starting_difficulty_level": 3, "debug_logging": True, "suppress_base_env_logs": True,
            "dump_rollouts": False, "dump_batch_size": 100,
        }
        values = {key: env.get(key, default) for key, default in built_in.items()}
        # other fields of the config class may be set in the YAML too (e.g. worker_timeout)
        values.update({k: v for k, v in env.items() if k in LetterCountingConfig.model_fields and k not in values})
        env_config = LetterCountingConfig(**values)

        servers = []
        for entry in document.get("openai") or []:
            settings = {
                "model_name": entry.get("model_name", "meta-llama/Llama-3.1-8B-Instruct"),
                "base_url": entry.get("base_url", "http://localhost:8001/v1"),
                "api_key": entry.get("api_key", "x"),
                "num_requests_for_eval": entry.get("num_requests_for_eval", 256),
            }
            if entry.get("server_type"):
                settings["server_type"] = entry["server_type"]
            servers.append(APIServerConfig(**settings))
        if not servers:
            servers = [APIServerConfig(model_name="meta-llama/Llama-3.1-8B-Instruct", base_url="http://localhost:8001/v1",
                                       api_key="x", num_requests_for_eval=256)]
        return env_config, servers

    # -- data ---------------------------------------------------------------------------------
    def _load_words(self) -> list[str]:
        if self.config.word_list_file:
            self.word_source = self.config.word_list_file
            return read_word_list(self.config.word_list_file)
        words = nltk_words()
        if words:
            self.word_source = "nltk words corpus"
            return words
        self.logger.warning("NLTK's word list is not installed and could not be downloaded: using %s",
                            SHIPPED_WORD_LIST)
        self.word_source = str(SHIPPED_WORD_LIST)
        return read_word_list(SHIPPED_WORD_LIST)

    async def setup(self):
        words = [w.lower() for w in self._load_words()
                 if w.isalpha() and w.isascii() and self.MIN_WORD_LENGTH <= len(w) <= self.MAX_WORD_LENGTH]
        if not words:
            raise ValueError(f"no usable words (ASCII letters only, {self.MIN_WORD_LENGTH}-{self.MAX_WORD_LENGTH} "
                             f"long) in {self.word_source}")
        random.Random(self.RANDOM_SEED).shuffle(words)
        split = max(1, int(self.TRAIN_TEST_SPLIT * len(words)))
        self.train_words, self.test_words = words[:split], words[split:]
        self.iter = 0
        self.logger.info("%d words from %s (%d for training)", len(words), self.word_source, len(self.train_words))
        self.eval_dataset = self._load_eval_dataset()

    def _load_eval_dataset(self) -> list[dict[str, Any]]:
        """Evaluation rows from ``test_file`` or the hub (an empty list if neither can be read)."""
        try:
            rows = load_rows(self.EVAL_DATASET_HF, split="train", local_file=self.config.test_file)
        except Exception as exc:
            if self.config.test_file:
                raise
            self.logger.error("cannot load %s (%s): evaluation is skipped; --env.test_file gives a local file",
                              self.EVAL_DATASET_HF, exc)
            return []
        items = []
        for row in rows:
            item = {"prompt": row.get("Prompt"), "answer": row.get("Answer"),
                    "difficulty_level": row.get("DifficultyLevel", 0) or 0}
            for source, key in (("_text", "text"), ("_target_letters", "target_letters"),
                                ("_expected_counts", "expected_counts")):
                if source in row:
                    item[key] = row[source]
            items.append(item)
        levels: dict[Any, int] = {}
        for item in items:
            levels[item["difficulty_level"]] = levels.get(item["difficulty_level"], 0) + 1
        self.logger.info("evaluation: %d items (%s)", len(items),
                         ", ".join(f"L{k}={v}" for k, v in sorted(levels.items(), key=lambda kv: str(kv[0]))))
        return items

    # -- curriculum ---------------------------------------------------------------------------
    def _clamp(self, level: int) -> int:
        return max(self.config.min_difficulty_level, min(self.config.max_difficulty_level, int(level)))

    def _get_difficulty_params(self, level: Optional[int] = None) -> Tier:
        """The tier of `level` (default: the current level), clamped to the configured range."""
        chosen = self._clamp(self.current_difficulty_level if level is None else level)
        return DIFFICULTY_TIERS.get(chosen, DIFFICULTY_TIERS[3])

    def min_samples_to_adjust(self) -> int:
        """Groups needed at a level before it may change: half the window, at least 10 (the
        whole window when that is smaller)."""
        window = max(1, self.config.difficulty_window_size)
        return min(window, max(10, window // 2))

    def _update_difficulty(self, group_score: float, item_difficulty_level: int) -> None:
        """Feed one group's success rate to the curriculum and move the level when the window says so.

        Only groups of items made at the current level count; the window starts empty after
        every change, and `min_samples_to_adjust()` groups are needed before a change.
        """
        config = self.config
        with self._difficulty_lock:
            if item_difficulty_level != self.current_difficulty_level:
                return
            self.recent_scores.append(group_score)
            del self.recent_scores[:-max(1, config.difficulty_window_size)]
            if len(self.recent_scores) < self.min_samples_to_adjust():
                return
            rate = sum(self.recent_scores) / len(self.recent_scores)
            old = self.current_difficulty_level
            if rate > config.difficulty_increase_threshold and old < config.max_difficulty_level:
                self.current_difficulty_level = old + 1
            elif rate < config.difficulty_decrease_threshold and old > config.min_difficulty_level:
                self.current_difficulty_level = old - 1
            if self.current_difficulty_level != old:
                self.recent_scores = []
                self.logger.info("difficulty L%d -> L%d (success rate %.0f%%)", old, self.current_difficulty_level,
                                 100 * rate)
            self.difficulty_history.append((self.iter, self.current_difficulty_level, rate))

    # -- items --------------------------------------------------------------------------------
    def _random_string(self, min_length: int, max_length: int) -> str:
        return "".join(self.rng.choice(ALPHABET) for _ in range(self.rng.randint(min_length, max_length)))

    def _pick_text(self, tier: Tier) -> str:
        if not tier.random_text:
            for offset in range(100):
                word = self.train_words[(self.iter + offset) % len(self.train_words)]
                if tier.min_length <= len(word) <= tier.max_length:
                    return word
        return self._random_string(tier.min_length, tier.max_length)

    def _select_target_letters(self, text: str, count: int) -> list[str]:
        """`count` distinct letters, each drawn from those in `text` with a probability that is
        itself random (30-90 %), so that how many asked-for letters are absent varies."""
        present = [c for c in ALPHABET if c in text.lower()]
        absent = [c for c in ALPHABET if c not in present]
        bias = self.rng.uniform(0.3, 0.9)
        chosen = []
        for _ in range(min(count, len(ALPHABET))):
            use_present = bool(present) and (not absent or self.rng.random() < bias)
            pool = present if use_present else absent
            chosen.append(pool.pop(self.rng.randrange(len(pool))))
        return chosen

    def make_question(self) -> Question:
        """A new question at the current level."""
        level = self.current_difficulty_level
        tier = self._get_difficulty_params(level)
        text = self._pick_text(tier)
        if self.rng.random() < tier.multi_letter_probability:
            wanted = self.rng.randint(max(2, tier.min_letters), max(2, tier.max_letters))
        else:
            wanted = 1
        letters = self._select_target_letters(text, wanted)
        return Question(text, letters, {c: text.lower().count(c) for c in letters}, level)

    async def get_next_item(self) -> Item:
        question = self.make_question()
        self.iter += 1
        if self.config.debug_logging:
            self.logger.debug("[L%d] %r letters %s counts %s", question.level, question.text[:50],
                              question.letters, question.counts)
        prompt = (frozenset({"role": "user", "content": build_prompt(question.text, question.letters)}.items()),)
        return prompt, question.counts, question.text, question.letters, question.level

    # -- rollouts and scores -------------------------------------------------------------------
    @staticmethod
    def _reconstruct_message_with_thinking(choice: Any) -> str:
        """The choice's text, with a separately returned reasoning text put back in ``<think>``."""
        message = getattr(choice, "message", None)
        content = getattr(choice, "text", None)
        if content is None:
            content = getattr(message, "content", None)
        reasoning = getattr(choice, "reasoning_content", None) or getattr(message, "reasoning_content", None)
        content = content or ""
        return f"<think>\n{reasoning}\n</think>{content}" if reasoning else content

    def _stop(self) -> Optional[list[str]]:
        eos = getattr(self.tokenizer, "eos_token", None)
        return [eos] if eos else None

    async def collect_trajectories(self, item: Item) -> tuple[Optional[ScoredDataGroup], list[Item]]:
        messages = [dict(entry) for entry in item[0]]
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=messages, n=self.config.group_size, max_tokens=self.config.max_generation_tokens,
                temperature=self.config.generation_temperature, stop=self._stop(),
            )
            nodes = managed.get_state()["nodes"]
        rollouts = []
        for choice, node in zip(completion.choices, nodes):
            reply = self._reconstruct_message_with_thinking(choice)
            rollouts.append({
                "messages": tuple(messages + [{"role": "assistant", "content": reply}]),
                "correct_counts": item[1], "text": item[2], "target_letters": item[3], "difficulty_level": item[4],
                "finish_reason": choice.finish_reason, "tokens": node.tokens, "masks": node.masked_tokens,
                "logprobs": node.logprobs,
            })
        scored = await self.score(rollouts)
        if scored is not None and self.config.dump_rollouts:
            await self._handle_data_dumping(rollouts, scored, item)
        return scored, []

    def _record_stats(self, text: str, letters: list[str]) -> None:
        for letter in letters:
            self.letter_distribution_stats[letter] = self.letter_distribution_stats.get(letter, 0) + 1
        self.word_length_stats[len(text)] = self.word_length_stats.get(len(text), 0) + 1

    @staticmethod
    def correctness(reply: str, finish_reason: Optional[str], letters: list[str], counts: dict[str, int]) -> float:
        """1.0 for exactly the expected count(s) in a reply that was not cut off, else 0.0."""
        if finish_reason == "length":
            return 0.0
        return 1.0 if is_correct(extract_answer(reply, len(letters) > 1), letters, counts) else 0.0

    def item_for_saving(self, item: Item) -> dict[str, Any]:
        """What scoring needs of an item (its prompt is a frozenset, which JSON cannot hold)."""
        _, counts, text, letters, level = item
        return {"counts": counts, "text": text, "letters": letters, "level": level}

    async def rescore_group(self, group, item) -> list[float]:
        return [self.correctness(reply, finish_reason, item["letters"], item["counts"])
                for reply, finish_reason in zip(self.completions(group), self.saved_facts(group, "finish_reason"))]

    async def score(self, rollout_group_data: list[dict[str, Any]]) -> Optional[ScoredDataGroup]:
        """Score a group, feed the curriculum, and keep it only inside the difficulty band."""
        if not rollout_group_data:
            return None
        first = rollout_group_data[0]
        counts, text, letters = first["correct_counts"], first["text"], first["target_letters"]
        level = first.get("difficulty_level", 0)
        self._record_stats(text, letters)
        multi = len(letters) > 1
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], inference_logprobs=[], messages=[],
                                rescore_facts=[])
        format_errors = think_errors = 0
        rollouts = list(rollout_group_data)
        self.rng.shuffle(rollouts)
        for rollout in rollouts:
            reply = rollout["messages"][-1]["content"]
            if rollout["finish_reason"] != "length" and extract_answer(reply, multi) is None:
                format_errors += 1
                lowered = reply.lower()
                think_errors += "<think>" not in lowered or "</think>" not in lowered
            if sum(1 for label in rollout["masks"] if label != -100) < MIN_TRAINABLE_TOKENS:
                continue
            group["tokens"].append(rollout["tokens"])
            group["masks"].append(rollout["masks"])
            group["inference_logprobs"].append(rollout["logprobs"])
            group["messages"].append(list(rollout["messages"]))
            group["scores"].append(self.correctness(reply, rollout["finish_reason"], letters, counts))
            group["rescore_facts"].append({"finish_reason": rollout["finish_reason"]})
            if len(group["tokens"]) >= self.config.group_size:
                break
        if not group["tokens"]:
            self.logger.warning("no rollout of %r had %d generated tokens", text[:50], MIN_TRAINABLE_TOKENS)
            return None
        self.groups_scored += 1
        self.answer_format_errors += format_errors
        self.think_format_errors += think_errors
        self.percent_correct_buffer.extend(group["scores"])
        average = sum(group["scores"]) / len(group["scores"])
        self._update_difficulty(average, level)
        if self.config.debug_logging:
            self.logger.debug("%r letters %s: %.2f correct (item L%d, now L%d)", text[:50], letters, average, level,
                              self.current_difficulty_level)
        if average > self.config.difficulty_increase_threshold:
            self.groups_too_easy += 1
            return None
        if average < self.config.difficulty_decrease_threshold:
            self.groups_too_hard += 1
            return None
        if len(set(group["scores"])) == 1:
            return None
        return group

    # -- data dumps -------------------------------------------------------------------------------
    async def _handle_data_dumping(self, rollouts: list[dict[str, Any]], scored: ScoredDataGroup, item: Item) -> None:
        scores = scored.get("scores") or []
        if not scores or len(set(scores)) == 1:
            return
        average = sum(scores) / len(scores)
        # scored["messages"] follows the (shuffled) scored order
        kept = [{"conversation": messages, "score": score, "expected_counts": item[1], "text": item[2],
                 "target_letters": item[3], "difficulty_level": item[4], "group_average_score": average}
                for messages, score in zip(scored.get("messages") or [], scores) if score > 0]
        if not kept:
            return
        item_id = f"{item[2][:30]}_{'_'.join(item[3])}"
        self.rollouts_to_save_buffer.append({"item_id": item_id, "rollouts": kept})
        self.processed_item_count += 1
        if len(self.rollouts_to_save_buffer) >= self.config.dump_batch_size:
            await self._save_rollouts_to_jsonl()

    async def _save_rollouts_to_jsonl(self) -> None:
        if not self.rollouts_to_save_buffer:
            return
        os.makedirs(self.datadumps_dir, exist_ok=True)
        path = os.path.join(self.datadumps_dir,
                            f"letter_counting_rollouts_{self.run_uuid}_{self.save_file_batch_num:04d}.jsonl")
        with open(path, "w", encoding="utf-8") as out:
            for entry in self.rollouts_to_save_buffer:
                out.write(json.dumps(entry) + "\n")
        self.logger.info("saved %d groups to %s", len(self.rollouts_to_save_buffer), path)
        self.rollouts_to_save_buffer.clear()
        self.save_file_batch_num += 1

    async def close(self) -> None:
        """Write the data-dump buffer (when dumping)."""
        if self.config.dump_rollouts:
            await self._save_rollouts_to_jsonl()

    # -- evaluation -----------------------------------------------------------------------------------
    async def rollout_and_score_eval(self, eval_item: dict[str, Any]) -> dict[str, Any]:
        expected, multi = parse_expected(eval_item["answer"])
        level = eval_item.get("difficulty_level", 0)
        messages = [{"role": "user", "content": eval_item["prompt"]}]
        if expected is None:
            self.logger.warning("cannot read evaluation answer %r", eval_item["answer"])
            return {"score": 0, "difficulty_level": level, "messages": messages, "expected": eval_item["answer"]}
        completion = await self.server.chat_completion(
            messages=messages, n=1, max_tokens=self.config.max_generation_tokens,
            temperature=self.config.eval_temperature, split="eval", stop=self._stop(),
        )
        reply = self._reconstruct_message_with_thinking(completion.choices[0])
        answer = extract_answer(reply, multi)
        score = int(answer is not None and answer == expected)
        return {"score": score, "difficulty_level": level, "expected": eval_item["answer"],
                "messages": messages + [{"role": "assistant", "content": reply}], "extracted_answer": answer,
                "finish_reason": completion.choices[0].finish_reason}

    async def evaluate(self, *args, **kwargs):
        if not self.eval_dataset:
            self.logger.warning("no evaluation data: skipping evaluation")
            self.eval_metrics.append(("eval/percent_correct", 0.0))
            return
        start = time.time()
        samples = await asyncio.gather(*(self.rollout_and_score_eval(item) for item in self.eval_dataset))
        overall = sum(s["score"] for s in samples) / len(samples)
        metrics = {"eval/percent_correct": overall}
        by_level: dict[Any, list[int]] = {}
        for sample in samples:
            by_level.setdefault(sample["difficulty_level"], []).append(sample["score"])
        for level in sorted(by_level, key=str):
            metrics[f"eval/percent_correct_L{level}"] = sum(by_level[level]) / len(by_level[level])
        self.eval_metrics.extend(metrics.items())
        self.logger.info("evaluation: %.1f%% correct (%s)", 100 * overall,
                         " | ".join(f"{k.rsplit('_', 1)[-1]} {v:.0%}" for k, v in metrics.items() if "_L" in k))
        self.evaluate_log(metrics, samples=list(samples), start_time=start, end_time=time.time(),
                          generation_parameters={"temperature": self.config.eval_temperature,
                                                 "max_tokens": self.config.max_generation_tokens})

    # -- checkpoints and logging ------------------------------------------------------------------------
    def save_checkpoint(self, step, data=None):
        data = dict(data or {})
        data.update({
            "iter": self.iter, "current_difficulty_level": self.current_difficulty_level,
            "recent_scores": self.recent_scores, "processed_item_count": self.processed_item_count,
            "save_file_batch_num": self.save_file_batch_num,
            "letter_distribution_stats": self.letter_distribution_stats,
            "word_length_stats": {str(k): v for k, v in self.word_length_stats.items()},
            "answer_format_errors": self.answer_format_errors, "think_format_errors": self.think_format_errors,
        })
        super().save_checkpoint(step, data)

    def load_checkpoint(self):
        super().load_checkpoint()
        self.word_length_stats = {int(k): v for k, v in self.word_length_stats.items()}
        self.logger.info("restored: level L%d, %d recent group scores", self.current_difficulty_level,
                         len(self.recent_scores))

    async def wandb_log(self, wandb_metrics: Optional[dict[str, Any]] = None):
        metrics = dict(wandb_metrics or {})
        if self.percent_correct_buffer:
            metrics["train/percent_correct"] = sum(self.percent_correct_buffer) / len(self.percent_correct_buffer)
        self.percent_correct_buffer = []
        metrics.update(dict(self.eval_metrics))
        self.eval_metrics = []
        if self.letter_distribution_stats:
            asked = self.letter_distribution_stats
            total = sum(asked.values())
            metrics["stats/total_letters_asked"] = total
            metrics["stats/most_common_letter_count"] = max(asked.values())
            metrics["stats/least_common_letter_count"] = min(asked.values())
            metrics["stats/letter_distribution_entropy"] = -sum(
                (n / total) * math.log2(n / total) for n in asked.values() if n)
        if self.word_length_stats:
            lengths = self.word_length_stats
            total = sum(lengths.values())
            metrics["stats/total_words_asked"] = total
            metrics["stats/avg_word_length"] = sum(k * v for k, v in lengths.items()) / total
            metrics["stats/min_word_length"] = min(lengths)
            metrics["stats/max_word_length"] = max(lengths)
        if self.groups_scored:
            rollouts = self.groups_scored * self.config.group_size
            metrics["errors/answer_format_error_rate"] = self.answer_format_errors / rollouts
            metrics["errors/think_format_error_rate"] = self.think_format_errors / rollouts
            metrics["errors/total_format_errors"] = self.answer_format_errors + self.think_format_errors
            metrics["curriculum/groups_too_easy"] = self.groups_too_easy
            metrics["curriculum/groups_too_hard"] = self.groups_too_hard
        metrics["curriculum/difficulty_level"] = self.current_difficulty_level
        if self.recent_scores:
            metrics["curriculum/recent_success_rate"] = sum(self.recent_scores) / len(self.recent_scores)
        metrics["curriculum/samples_in_window"] = len(self.recent_scores)
        if self.config.dump_rollouts:
            metrics["data_dumps/buffer_size"] = len(self.rollouts_to_save_buffer)
            metrics["data_dumps/batches_saved"] = self.save_file_batch_num
        await super().wandb_log(metrics)


if __name__ == "__main__":
    LetterCountingEnv.cli()
