"""Multi-turn tool calling: whole episodes of tool calls, with the dataset's tool results replayed.

Each item is one Hermes-format conversation (``conversations``: ``from`` system / human /
gpt / tool, ``value``). The model plays every assistant turn of the episode; between its
turns the environment inserts what the dataset says came next (the tool's
``<tool_response>``, the user's follow-up), so tool results are simulated from the data. A
tool-calling turn must be exactly one ``<think>`` block followed by ``<tool_call>`` JSON
blocks (Python-literal dicts are accepted and normalised); it is right when it makes as many
calls as the dataset turn and each call has every expected key/argument with the expected
value (extra keys are allowed; string-encoded arguments and "True"/"False" are coerced). A
narration turn must be one leading ``<think>`` block and no ``<tool_call>`` /
``<tool_response>``. A wrong tool-calling turn ends that rollout (marked as a mismatch); an
invalid narration turn ends it too. The first turn is one completion request with
``n = group_size``; later turns are one request per surviving rollout (temperature 0.8, at
most ``max_gen_per_turn`` new tokens each).

Scenarios (``--env.scenario_category``), each keeping only the conversations that fit:

* ``multiturn`` (default): user, call, tool result, narration, user, call, tool result,
  narration... (at least two tool-calling turns, a user turn after the first); after each
  tool result the model must narrate it (an instruction to do so is appended to the result).
* ``multistep``: at least two strictly sequential calls with only tool results in between
  and no user turn after the first call (the user turn asks for one call at a time).
* ``single``: the first tool-calling turn only.
* ``relevance``: one narration reply where no tool fits (apologising, or asking for missing
  details, earns a bonus).

``max_tool_call_turns_cap`` (default 2) keeps at most that many tool-calling turns (plus the
narration right after the last one in ``multiturn``, or with ``generate_all_gpt_turns``).

Reward per rollout: (matched calls / expected calls) + 0.5 if all matched +
``wrong_call_penalty`` (-0.2) after a mismatch; in ``multiturn`` fewer than two matched calls
is -1; any reward <= 0 becomes -1. Relevance episodes: 1.0 (+0.1 for an apology, +0.1 for
asking for details) for a valid narration, else -1. When every rollout scores above 0.99,
sequences longer than half of ``max_token_length`` lose up to 1.0 linearly. Groups that
come up short or whose scores are all equal are dropped (except for ``relevance``). Only
the final assistant turn of each trajectory is trained (``tokenize_for_trainer``).
Evaluation (temperature 0) reports ``eval/avg_reward`` and ``eval/percent_correct``
(reward >= 1) on up to 128 held-out episodes.

Data: the Hugging Face ``interstellarninja/toolace_hermes_sequential_tool_use`` train split,
shuffled, 5 % held out for evaluation. ``--env.train_file`` / ``--env.test_file`` read local
files with the same ``conversations`` column (tiny ones ship in
``environments/fixtures/multiturn_tool_use/``). With ``--env.completed_dataset_id`` (a hub
dataset or a local file with a ``task`` column) conversations whose first user message is
listed there are skipped (``skip_completed``).

    # offline, with the bundled conversations
    python environments/tool_use_multiturn_server.py process \\
        --env.train_file environments/fixtures/multiturn_tool_use/train.jsonl \\
        --env.test_file environments/fixtures/multiturn_tool_use/test.jsonl --env.group_size 4 \\
        --env.total_steps 4 --env.data_path_to_save_groups multiturn.jsonl \\
        --openai.base_url http://localhost:9004/v1 --openai.model_name MODEL --env.tokenizer_name MODEL \\
        --env.use_wandb false
    # for real
    python environments/tool_use_multiturn_server.py serve --openai.base_url http://localhost:9004/v1 \\
        --openai.model_name MODEL
"""

import ast
import asyncio
import json
import logging
import math
import random
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from pydantic import Field

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, EvalHandlingEnum, Item, ScoredDataGroup
from atroposlib.envs.local_data import load_rows
from atroposlib.utils.length_penalty import length_overrun
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

logger = logging.getLogger(__name__)

HUB_DATASET = "interstellarninja/toolace_hermes_sequential_tool_use"
SCENARIOS = ("single", "multistep", "multiturn", "relevance")
TEST_FRACTION = 0.05
EVAL_EPISODES = 128

# Markers a rollout's per-turn predictions may hold besides parsed calls.
MISMATCH = "__MISMATCH__"
APOLOGY = "__APOLOGY__"
INFO = "__INFO__"
MARKERS = (MISMATCH, APOLOGY, INFO)

THINK_BLOCK = re.compile(r"<think>[\s\S]*?</think>", re.IGNORECASE)
LEADING_THINK = re.compile(r"^\s*(<think>[\s\S]*?</think>)\s*", re.IGNORECASE)
TOOL_CALL_BODY = re.compile(r"<tool_call>\s*([\s\S]*?)\s*</tool_call>", re.IGNORECASE)
ONE_TOOL_CALL = re.compile(r"\s*<tool_call>\s*([\s\S]*?)\s*</tool_call>\s*", re.IGNORECASE)
HAS_TOOL_CALL = re.compile(r"<tool_call\s*>", re.IGNORECASE)
HAS_TOOL_RESPONSE = re.compile(r"<tool_response\s*>", re.IGNORECASE)
APOLOGY_WORDS = re.compile(r"\b(?:sorry|apologies)\b", re.IGNORECASE)
INFO_REQUESTS = (
    re.compile(r"\binsufficient information\b", re.IGNORECASE),
    re.compile(r"\bcould you provide\b", re.IGNORECASE),
    re.compile(r"\bprovide (?:me )?.*(?:details|information|data)\b", re.IGNORECASE),
)


class MultiTurnEnvConfig(BaseEnvConfig):
    """Settings of the multi-turn tool-calling environment."""

    max_tool_call_turns_cap: Optional[int] = Field(
        default=2,
        description="At most this many tool-calling turns per episode (narration turns not counted); None: all.",
    )
    validate_think_blocks: bool = Field(
        default=False, description="Keep only conversations whose assistant turns start with a <think> block."
    )
    generate_all_gpt_turns: bool = Field(
        default=False,
        description="single/multistep: also generate the narration turn after the last tool result (a <think> block "
        "then text, no <tool_call>).",
    )
    max_gen_per_turn: int = Field(default=1024, description="Most new tokens the model may write in one turn.")
    wrong_call_penalty: float = Field(
        default=-0.2, description="Added to the reward of a rollout ended by a mismatched tool call."
    )
    skip_completed: bool = Field(
        default=True, description="Skip conversations whose first user message is a task of completed_dataset_id."
    )
    completed_dataset_id: Optional[str] = Field(
        default=None,
        description="Hub dataset (train split) or local file with a 'task' column of already completed tasks; "
        "None: skip nothing.",
    )
    scenario_category: str = Field(
        default="multiturn", description="Which episodes to build: single, multistep, multiturn or relevance."
    )
    add_dynamic_few_shot: bool = Field(
        default=True, description="Use the latest correct tool-calling reply as the system prompt's example."
    )
    train_file: Optional[str] = Field(
        default=None, description="Local file with the dataset's 'conversations' column, used instead of the hub."
    )
    test_file: Optional[str] = Field(
        default=None, description="Local evaluation file in the same layout (default: 5 % of the train data)."
    )


system_prompt = (
    "You are a careful assistant that thinks before acting. Work through the request step by step inside "
    "<think> </think> tags, taking as long as you need, and only then give your reply."
)

few_shot_example = (
    "Example of the expected format:\n"
    "<think>\n"
    "The user wants the sum of 17 and 25, so I will ask the calculator tool for it.\n"
    "</think>\n"
    "<tool_call>\n"
    '{"name": "calculator", "arguments": {"expression": "17 + 25"}}\n'
    "</tool_call>\n"
)

SEQ_TOOL_HELPER = (
    "Use the tools one at a time: make a single tool call, wait for its <tool_response>, and only then decide "
    "on the next call. Never put several <tool_call> blocks in one message. Once the results answer the request, "
    "reply with a <think> block followed by a short plain-text summary."
)

APOLOGY_HELPER = (
    "When none of the tools can do what the user asks, reason about the mismatch in a <think> block, then start "
    "the visible reply with an apology (for example \"I'm sorry\" or \"Apologies\") and say briefly why the tools "
    "cannot help."
)

CLARIFICATION_HELPER = (
    "When a tool needs values the user has not given, note what is missing in a <think> block, then politely ask "
    "for it in the visible reply, for example \"Could you provide the missing details?\" or \"There is "
    "insufficient information to continue; could you share the data?\""
)

NARRATION_THINK_HELPER = (
    "Now answer the user about the tool result above: write a <think> block, then a short visible summary. "
    "Do not make any <tool_call> in this reply, and never write <tool_response> blocks yourself: the system "
    "provides those.\n"
    "Example:\n"
    "<think>\n"
    "The lookup worked: the user asked for the opening hours and the tool says 9:00 to 17:00.\n"
    "</think>\n"
    "The museum is open from 9:00 to 17:00 today."
)


# ---------------------------------------------------------------- parsing model replies
def canonical_tool_json(raw: str) -> Optional[str]:
    """`raw` (JSON, or a Python literal) as compact JSON, or None when it is neither."""
    for parse in (json.loads, ast.literal_eval):
        try:
            return json.dumps(parse(raw), separators=(",", ":"))
        except Exception:
            continue
    return None


def _quote_fixed(raw: str) -> Optional[str]:
    """Single-quoted keys and string values turned into JSON, if that makes it valid JSON."""
    candidate = re.sub(r"'([^']*)':", r'"\1":', raw)
    candidate = re.sub(r":\s*'([^']*)'", r':"\1"', candidate)
    try:
        json.loads(candidate)
    except Exception:
        return None
    return candidate


def normalize_tool_calls(text: str) -> str:
    """For a reply that opens with a <think> block: every <tool_call> body rewritten as compact
    JSON when it parses (as JSON, a Python literal or after fixing single quotes), and every
    <tool_call> / </tool_call> tag on its own line. Other replies are returned unchanged."""
    opening = LEADING_THINK.match(text)
    if not opening:
        return text

    def rewrite(block: re.Match) -> str:
        raw = block.group(1).strip()
        fixed = canonical_tool_json(raw) or _quote_fixed(raw)
        return f"<tool_call>{fixed}</tool_call>" if fixed is not None else block.group(0)

    rest = TOOL_CALL_BODY.sub(rewrite, text[opening.end():])
    out = opening.group(1) + rest
    out = re.sub(r"\s*<tool_call>\s*", "\n<tool_call>\n", out)
    return re.sub(r"\s*</tool_call>\s*", "\n</tool_call>\n", out)


def valid_narration(text: str) -> bool:
    """One <think> block, at the very start, and no <tool_call> or <tool_response>."""
    text = normalize_tool_calls(text)
    return (len(THINK_BLOCK.findall(text)) == 1 and re.match(r"^\s*<think>", text, re.IGNORECASE) is not None
            and not HAS_TOOL_CALL.search(text) and not HAS_TOOL_RESPONSE.search(text))


def valid_tool_calls(text: str) -> Optional[List[Any]]:
    """The calls of a reply that is exactly a leading <think> block and one or more
    <tool_call> blocks (whitespace only between and after them), else None."""
    text = normalize_tool_calls(text)
    if HAS_TOOL_RESPONSE.search(text):
        return None
    opening = re.match(r"\s*(<think>[\s\S]*?</think>)", text, re.IGNORECASE)
    if not opening:
        return None
    rest = text[opening.end():]
    calls = []
    while True:
        block = ONE_TOOL_CALL.match(rest)
        if not block:
            break
        canonical = canonical_tool_json(block.group(1))
        if canonical is None:
            return None
        calls.append(json.loads(canonical))
        rest = rest[block.end():]
    return calls if calls and not rest.strip() else None


def validate_reply(text: str) -> Optional[List[Any]]:
    """A reply's calls ([] for a valid narration), or None when it is malformed."""
    if HAS_TOOL_CALL.search(text):
        return valid_tool_calls(text)
    return [] if valid_narration(text) else None


# ---------------------------------------------------------------- comparing calls
def coerce_jsonlike(value: Any) -> Any:
    """Strings that encode JSON or Python values (objects, arrays, true/false/null/None,
    numbers) decoded; anything else returned as it is."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none"):
        return None
    if (text.startswith("{") and text.endswith("}")) or (text.startswith("[") and text.endswith("]")):
        try:
            return json.loads(text)
        except Exception:
            pass
    try:
        return ast.literal_eval(text)
    except Exception:
        return value


def parse_expected_call(raw: Any) -> Dict[str, Any]:
    """An expected call (a JSON string, possibly with string-encoded arguments) as a dict;
    {} when it is not an object."""
    call = raw
    if isinstance(raw, str):
        try:
            call = json.loads(raw)
        except Exception:
            call = coerce_jsonlike(raw)
    if not isinstance(call, dict):
        return {}
    call = dict(call)
    if "arguments" in call:
        call["arguments"] = coerce_jsonlike(call["arguments"])
    return call


def calls_match(call: Any, expected: Any) -> bool:
    """Whether `call` holds every key of `expected` with an equal value, recursively
    (after decoding string-encoded values on both sides); extra keys are allowed."""
    call, expected = coerce_jsonlike(call), coerce_jsonlike(expected)
    if isinstance(expected, dict):
        return isinstance(call, dict) and all(key in call and calls_match(call[key], value)
                                              for key, value in expected.items())
    return call == expected


def score_episode(predictions: List[Any], expected_calls: List[str], lam: float = 0.5,
                  wrong_call_penalty: float = -0.2) -> Tuple[float, int]:
    """(reward, matched calls) of one rollout.

    `predictions` are the rollout's parsed calls in order, plus markers: MISMATCH when a turn
    was wrong, APOLOGY / INFO for narration wording. Tool episodes: matched / expected, +`lam`
    when all matched, + `wrong_call_penalty` after a mismatch. Episodes without expected calls
    (relevance): 1.0 plus 0.1 per marker for a clean narration, else `wrong_call_penalty`.
    """
    if not expected_calls:
        others = [p for p in predictions if not (isinstance(p, str) and p in MARKERS)]
        if MISMATCH in predictions or others:
            return wrong_call_penalty, 0
        return 1.0 + 0.1 * (APOLOGY in predictions) + 0.1 * (INFO in predictions), 0
    expected = [parse_expected_call(raw) for raw in expected_calls]
    penalty = wrong_call_penalty if MISMATCH in predictions else 0.0
    calls = [p for p in predictions if not (isinstance(p, str) and p in MARKERS)]
    calls += [{}] * (len(expected) - len(calls))
    matched = sum(1 for call, gold in zip(calls, expected) if calls_match(call, gold))
    return matched / max(1, len(expected)) + (lam if matched == len(expected) else 0.0) + penalty, matched


# ---------------------------------------------------------------- reading conversations
def is_assistant(message: Dict[str, str]) -> bool:
    return message["from"] in ("gpt", "assistant")


def is_tool_call_turn(message: Dict[str, str]) -> bool:
    return is_assistant(message) and "<tool_call>" in message["value"].lower()


def chat_message(message: Dict[str, str]) -> Dict[str, str]:
    """A dataset message as a chat message (human -> user, gpt -> assistant)."""
    role = {"human": "user", "gpt": "assistant"}.get(message["from"], message["from"])
    return {"role": role, "content": message["value"]}


def sequential_tool_calls(conversation: List[Dict[str, str]]) -> bool:
    """Whether only tool results come between consecutive tool-calling turns, and the last
    call is followed (through tool messages only) by a tool result."""
    calls = [i for i, message in enumerate(conversation) if is_tool_call_turn(message)]
    if not calls:
        return False
    for start, end in zip(calls, calls[1:]):
        if any(message["from"] != "tool" for message in conversation[start + 1:end]):
            return False
    last = calls[-1]
    answer = next((i for i in range(last + 1, len(conversation)) if conversation[i]["from"] == "tool"), None)
    if answer is None:
        return False
    return all(message["from"] == "tool" for message in conversation[last + 1:answer + 1])


def keep_tool_turns(expected: List[List[str]], inter_turns: List[List[Dict[str, str]]], cap: Optional[int],
                    keep_next_narration: bool) -> Tuple[List[List[str]], List[List[Dict[str, str]]]]:
    """Episode turns cut after the `cap`-th tool-calling turn (and the narration turn right
    after it when `keep_next_narration`)."""
    if cap is None:
        return expected, inter_turns
    kept = seen = 0
    for index, calls in enumerate(expected):
        kept += 1
        if calls:
            seen += 1
            if seen == cap:
                if keep_next_narration and index + 1 < len(expected):
                    kept += 1
                break
    return expected[:kept], inter_turns[: kept - 1]


def frozen(messages: List[Dict[str, str]]) -> Tuple[frozenset, ...]:
    return tuple(frozenset(message.items()) for message in messages)


class MultiTurnToolCallingEnv(BaseEnv):
    name = "multiturn_tool_use"
    env_config_cls = MultiTurnEnvConfig

    def __init__(self, config: MultiTurnEnvConfig, server_configs: List[APIServerConfig], slurm: bool = True,
                 testing: bool = False):
        super().__init__(config, server_configs, slurm, testing)
        self.percent_correct_buffer: List[float] = []
        self.raw_score_buffer: List[float] = []
        self.eval_metrics: List[Tuple[str, float]] = []
        self.rollouts_for_wandb: List = []
        self.dynamic_example: Optional[str] = None  # latest correct <think> + <tool_call> reply
        self.completed_tasks: set = set()
        # Items: (prompt messages, expected canonical calls per assistant turn, messages inserted between turns).
        self.train_items: List[Tuple[Tuple[frozenset, ...], List[List[str]], List[List[Dict[str, str]]]]] = []
        self.test_items: List[Tuple[Tuple[frozenset, ...], List[List[str]], List[List[Dict[str, str]]]]] = []
        self.iter = 0

    @classmethod
    def config_init(cls) -> Tuple[MultiTurnEnvConfig, List[APIServerConfig]]:
        env_config = MultiTurnEnvConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
            group_size=8,
            use_wandb=True,
            rollout_server_url="http://localhost:8000",
            total_steps=2000,
            batch_size=1024,
            steps_per_eval=10**12,
            max_token_length=4096 * 16,
            inference_weight=1.0,
            wandb_name="multiturn_tool_use",
            eval_handling=EvalHandlingEnum.LIMIT_TRAIN,
            eval_limit_ratio=0.1,
            skip_completed=True,
        )
        if env_config.scenario_category in ("multiturn", "single"):
            env_config.generate_all_gpt_turns = False
        elif env_config.scenario_category == "relevance":
            env_config.generate_all_gpt_turns = False
            env_config.skip_completed = False
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

    # ------------------------------------------------------------ data
    async def setup(self):
        if self.config.scenario_category not in SCENARIOS:
            raise ValueError(f"scenario_category must be one of {', '.join(SCENARIOS)}, "
                             f"not {self.config.scenario_category!r}")
        rows = load_rows(HUB_DATASET, split="train", local_file=self.config.train_file)
        self._load_completed_tasks()
        self._log_distribution(rows)
        random.shuffle(rows)
        if self.config.test_file:
            train_rows, test_rows = rows, load_rows(HUB_DATASET, local_file=self.config.test_file)
        else:
            held_out = math.ceil(TEST_FRACTION * len(rows)) if len(rows) > 1 else 0
            test_rows, train_rows = rows[:held_out], rows[held_out:]
        self.train_items = self._prep_items(train_rows, "train")
        self.test_items = self._prep_items(test_rows, "test")
        random.shuffle(self.train_items)
        random.shuffle(self.test_items)
        if not self.train_items:
            raise ValueError(f"no training episodes for scenario {self.config.scenario_category!r}: "
                             "check the dataset's format")

    def _load_completed_tasks(self) -> None:
        source = self.config.completed_dataset_id
        if not (self.config.skip_completed and source):
            return
        try:
            local = source if Path(source).expanduser().is_file() else None
            self.completed_tasks = {row["task"] for row in load_rows(source, split="train", local_file=local)}
            logger.info("skipping %d completed tasks listed in %s", len(self.completed_tasks), source)
        except Exception as exc:
            self.completed_tasks = set()
            logger.warning("could not load completed tasks from %s (%s): nothing is skipped", source, exc)

    @staticmethod
    def _log_distribution(rows: List[Dict[str, Any]]) -> None:
        counts, sequential = Counter(), Counter()
        for row in rows:
            turns = sum(1 for message in row["conversations"] if is_assistant(message)
                        and re.search(r"<tool_call>", message["value"], re.IGNORECASE))
            counts[turns] += 1
            if turns and sequential_tool_calls(row["conversations"]):
                sequential[turns] += 1
        for turns in sorted(counts):
            logger.info("%2d tool-calling turns: %d conversations (%d sequential)", turns, counts[turns],
                        sequential[turns])

    def _prep_items(self, rows: List[Dict[str, Any]], split: str) -> list:
        items = [item for item in (self._episode(row["conversations"]) for row in rows) if item is not None]
        logger.info("%s: %d episodes from %d conversations", split, len(items), len(rows))
        return items

    def _example_block(self) -> str:
        if self.config.add_dynamic_few_shot and self.dynamic_example:
            return "Example of the expected format:\n" + self.dynamic_example
        return few_shot_example

    def _episode(self, conversation: List[Dict[str, str]]):
        """The episode item of one conversation for the configured scenario, or None."""
        if len(conversation) < 3 or conversation[0]["from"] != "system" or conversation[1]["from"] != "human":
            return None
        if self.config.skip_completed and self.completed_tasks \
                and conversation[1]["value"].strip() in self.completed_tasks:
            return None
        scenario = self.config.scenario_category
        calls = [i for i, message in enumerate(conversation) if is_tool_call_turn(message)]
        if scenario == "single" and not self.config.generate_all_gpt_turns and calls:
            calls = calls[:1]
            conversation = conversation[: calls[0] + 1]
        if scenario == "relevance":
            return self._relevance_episode(conversation)
        if not calls:
            return None
        if scenario == "multiturn":
            return self._multiturn_episode(conversation, calls)
        if scenario == "multistep":
            first_reply = next((i for i in range(2, len(conversation)) if is_assistant(conversation[i])), None)
            human_later = any(m["from"] == "human" for m in conversation[calls[0] + 1:])
            if len(calls) < 2 or first_reply != calls[0] or human_later or not sequential_tool_calls(conversation):
                return None
        elif len(calls) != 1:
            return None
        return self._sequential_episode(conversation, calls)

    def _relevance_episode(self, conversation):
        first_reply = next((i for i in range(2, len(conversation)) if is_assistant(conversation[i])), None)
        if first_reply is None or "<tool_call" in conversation[first_reply]["value"].lower():
            return None
        system = "\n\n".join([system_prompt, APOLOGY_HELPER, CLARIFICATION_HELPER, conversation[0]["value"]])
        prompt = [{"role": "system", "content": system}, {"role": "user", "content": conversation[1]["value"]}]
        return frozen(prompt), [[]], []

    def _multiturn_episode(self, conversation, calls):
        first_reply = next((i for i in range(2, len(conversation)) if is_assistant(conversation[i])), None)
        if first_reply != calls[0] or len(calls) < 2:
            return None
        if not any(m["from"] == "human" for m in conversation[calls[0] + 1:]):
            return None
        expected: List[List[str]] = []
        inter_turns: List[List[Dict[str, str]]] = []
        for k, call_index in enumerate(calls):
            result = next((j for j in range(call_index + 1, len(conversation)) if conversation[j]["from"] == "tool"),
                          None)
            if result is None:
                return None
            summary = next((j for j in range(result + 1, len(conversation)) if is_assistant(conversation[j])), None)
            if summary is None or "<tool_call" in conversation[summary]["value"].lower():
                return None
            if self.config.validate_think_blocks and not re.match(r"^\s*<think>", conversation[summary]["value"],
                                                                  re.IGNORECASE):
                return None
            next_call = calls[k + 1] if k + 1 < len(calls) else None
            if next_call is not None and not any(m["from"] == "human" for m in conversation[summary + 1:next_call]):
                return None
            turn = conversation[call_index]["value"]
            if self.config.validate_think_blocks and not re.match(r"^\s*<think>", turn, re.IGNORECASE):
                return None
            canonical = [canonical_tool_json(raw) for raw in TOOL_CALL_BODY.findall(turn)]
            if not canonical or None in canonical:
                return None
            expected.append(canonical)
            inter_turns.append([{"role": "tool",
                                 "content": conversation[result]["value"] + "\n\n" + NARRATION_THINK_HELPER}])
            expected.append([])  # the narration of that result
            end = next_call if next_call is not None else len(conversation)
            inter_turns.append([chat_message(m) for m in conversation[summary + 1:end]])
        inter_turns.pop()  # nothing follows the final narration
        expected, inter_turns = keep_tool_turns(expected, inter_turns, self.config.max_tool_call_turns_cap, True)
        system = system_prompt + "\n\n" + conversation[0]["value"] + "\n\n" + self._example_block()
        prompt = [{"role": "system", "content": system}, {"role": "user", "content": conversation[1]["value"]}]
        return frozen(prompt), expected, inter_turns

    def _sequential_episode(self, conversation, calls):
        """single and multistep episodes: the tool-calling turns, with the tool results between."""
        multistep = self.config.scenario_category == "multistep"
        system = system_prompt + "\n\n" + conversation[0]["value"] + "\n\n" + self._example_block()
        user = conversation[1]["value"] + ("\n\n" + SEQ_TOOL_HELPER if multistep else "")
        prompt = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        expected: List[List[str]] = []
        inter_turns: List[List[Dict[str, str]]] = []
        for k, call_index in enumerate(calls):
            turn = conversation[call_index]["value"]
            if self.config.validate_think_blocks and not re.match(r"^\s*<think>", turn, re.IGNORECASE):
                continue
            raws = TOOL_CALL_BODY.findall(turn)
            if not raws:
                continue
            expected.append([c for c in (canonical_tool_json(raw) for raw in raws) if c is not None])
            if k < len(calls) - 1:
                if multistep:
                    between = [{"role": "tool", "content": conversation[call_index + 1]["value"]}]
                else:
                    between = [chat_message(m) for m in conversation[call_index + 1:calls[k + 1]]]
                inter_turns.append(between)
        if self.config.generate_all_gpt_turns:
            result = calls[-1] + 1
            if (result + 1 < len(conversation) and is_assistant(conversation[result + 1])
                    and "<tool_call>" not in conversation[result + 1]["value"]):
                expected.append([])
                inter_turns.append([{"role": "tool",
                                     "content": conversation[result]["value"] + "\n\n" + NARRATION_THINK_HELPER}])
        expected, inter_turns = keep_tool_turns(expected, inter_turns, self.config.max_tool_call_turns_cap,
                                                self.config.generate_all_gpt_turns)
        return frozen(prompt), expected, inter_turns

    async def get_next_item(self):
        if not self.train_items:
            raise ValueError("no training episodes: setup() prepared none")
        if self.iter >= len(self.train_items):
            random.shuffle(self.train_items)
            self.iter = 0
        item = self.train_items[self.iter]
        self.iter += 1
        return item

    # ------------------------------------------------------------ rollouts
    def _max_turns(self, expected: List[List[str]]) -> int:
        if self.config.scenario_category == "multiturn" or self.config.max_tool_call_turns_cap is None:
            return len(expected)
        tool_turns = turns = 0
        for calls in expected:
            turns += 1
            if calls:
                tool_turns += 1
                if tool_turns >= self.config.max_tool_call_turns_cap:
                    if self.config.generate_all_gpt_turns and turns < len(expected) and not expected[turns]:
                        turns += 1
                    break
        return turns

    async def _generate(self, turn: int, prompts: List[str]) -> List[str]:
        """Replies to this turn's prompts: one request with n for the shared first prompt,
        one request per rollout afterwards (a failed request counts as an empty reply)."""
        if turn == 0:
            completion = await self.server.completion(prompt=prompts[0], n=len(prompts),
                                                      max_tokens=self.config.max_gen_per_turn, temperature=0.8)
            return [choice.text for choice in completion.choices]

        async def one(prompt: str) -> str:
            try:
                completion = await self.server.completion(prompt=prompt, n=1, max_tokens=self.config.max_gen_per_turn,
                                                          temperature=0.8)
                return completion.choices[0].text
            except Exception as exc:
                logger.warning("turn %d request failed: %s", turn + 1, exc)
                return ""

        return list(await asyncio.gather(*(one(prompt) for prompt in prompts)))

    def _judge_reply(self, text: str, expected_turn: List[str], episode_has_calls: bool) -> Tuple[List[Any], bool]:
        """(predictions for the turn, whether the rollout may go on)."""
        if expected_turn:
            calls = valid_tool_calls(text)
            if calls is None or len(calls) != len(expected_turn) or not all(
                    calls_match(call, parse_expected_call(raw)) for call, raw in zip(calls, expected_turn)):
                return [MISMATCH], False
            if self.config.add_dynamic_few_shot:
                self.dynamic_example = text.strip()
            return calls, True
        if not valid_narration(text):
            # A malformed reply must not pass as the narration a relevance episode asks for.
            return ([] if episode_has_calls else [MISMATCH]), False
        tags = [APOLOGY] if APOLOGY_WORDS.search(text) else []
        if any(pattern.search(text) for pattern in INFO_REQUESTS):
            tags.append(INFO)
        return tags, True

    async def collect_trajectories(self, item) -> Tuple[Optional[ScoredDataGroup], List[Item]]:
        prompt, expected, inter_turns = item
        expected, inter_turns = list(expected), list(inter_turns)
        if self.config.generate_all_gpt_turns:
            expected.append([])  # a closing summary turn
            inter_turns.append([])
        group_size = self.config.group_size
        contexts = [[dict(message) for message in prompt] for _ in range(group_size)]
        predictions: List[List[List[Any]]] = [[[] for _ in expected] for _ in range(group_size)]
        active = [True] * group_size
        episode_has_calls = any(expected)
        for turn in range(self._max_turns(expected)):
            if turn > 0 and turn - 1 < len(inter_turns):
                for r in range(group_size):
                    if active[r]:
                        contexts[r].extend(dict(message) for message in inter_turns[turn - 1])
            live = [r for r in range(group_size) if active[r]]
            if not live:
                break
            prompts = [self.tokenizer.apply_chat_template(contexts[r], add_generation_prompt=True, tokenize=False)
                       for r in live]
            replies = await self._generate(turn, prompts)
            for r, reply in zip(live, replies):
                text = normalize_tool_calls(reply or "")
                predictions[r][turn], active[r] = self._judge_reply(text, expected[turn], episode_has_calls)
                # The reply stays in the trajectory even when it ends the rollout.
                contexts[r].append({"role": "assistant", "content": text})
            logger.debug("turn %d: %d of %d rollouts still going", turn + 1, sum(active), group_size)
        group = self._score_group(contexts, predictions, expected)
        if group is None:
            return None, []
        return group, []

    def _score_group(self, contexts, predictions, expected) -> Optional[ScoredDataGroup]:
        expected_flat = [call for turn in expected for call in turn]
        group = ScoredDataGroup(tokens=[], masks=[], scores=[])
        if self.config.include_messages:
            group["messages"] = []
        for context, turns in zip(contexts, predictions):
            reward, matched = score_episode([p for turn in turns for p in turn], expected_flat,
                                            wrong_call_penalty=self.config.wrong_call_penalty)
            if self.config.scenario_category == "multiturn" and matched < 2:
                reward = -1.0  # a multi-turn episode needs at least two right calls
            tokenized = tokenize_for_trainer(self.tokenizer, context, include_messages=self.config.include_messages)
            group["tokens"].append(tokenized["tokens"])
            group["masks"].append(tokenized["masks"])
            group["scores"].append(reward if reward > 0 else -1.0)
            if self.config.include_messages:
                group["messages"].append(tokenized["messages"])
        if group["scores"] and all(score > 0.99 for score in group["scores"]):
            # subtracted, not scaled: the same overrun costs every episode the same, bonus or not
            group["scores"] = [max(0.0, score - length_overrun(len(tokens), self.config.max_token_length, 0.5))
                               for score, tokens in zip(group["scores"], group["tokens"])]
        for score in group["scores"]:
            self.raw_score_buffer.append(score)
            self.percent_correct_buffer.append(1.0 if score >= 1.0 else 0.0)
        unusable = len(group["tokens"]) < self.config.group_size or len(set(group["scores"])) == 1
        if unusable and self.config.scenario_category != "relevance":
            return None
        return group

    # ------------------------------------------------------------ evaluation
    async def rollout_and_score_eval(self, item) -> float:
        prompt, expected, inter_turns = item
        context = [dict(message) for message in prompt]
        predictions: List[Any] = []
        for turn in range(len(expected)):
            if turn > 0 and turn - 1 < len(inter_turns):
                context.extend(dict(message) for message in inter_turns[turn - 1])
            text = self.tokenizer.apply_chat_template(context, add_generation_prompt=True, tokenize=False)
            room = self.config.max_token_length - len(self.tokenizer.encode(text, add_special_tokens=False))
            completion = await self.server.completion(prompt=text, n=1, temperature=0.0, split="eval",
                                                      max_tokens=min(self.config.max_gen_per_turn, max(1, room)))
            reply = completion.choices[0].text
            context.append({"role": "assistant", "content": reply})
            calls = validate_reply(reply)
            if calls is None:
                break
            predictions.extend(calls)
        reward, _ = score_episode(predictions, [call for turn in expected for call in turn],
                                  wrong_call_penalty=self.config.wrong_call_penalty)
        return reward

    async def evaluate(self, *args, **kwargs):
        start = time.time()
        subset = self.test_items[:EVAL_EPISODES]
        if not subset:
            logger.warning("no evaluation episodes")
            return
        scores = await asyncio.gather(*(self.rollout_and_score_eval(item) for item in subset))
        metrics = {"eval/avg_reward": sum(scores) / len(scores),
                   "eval/percent_correct": sum(1 for score in scores if score >= 1.0) / len(scores)}
        self.eval_metrics.extend(metrics.items())
        self.evaluate_log(metrics=metrics, start_time=start, end_time=time.time(),
                          generation_parameters={"temperature": 0.0, "max_tokens": self.config.max_gen_per_turn})

    # ------------------------------------------------------------ logging
    async def add_rollouts_for_wandb(self, scored_data: ScoredDataGroup, item: Item = None):
        keep = min(1, len(scored_data["tokens"]))
        expected = [call for turn in item[1] for call in turn] if item is not None else []
        self.rollouts_for_wandb.append(
            [(self.tokenizer.decode(scored_data["tokens"][i]), scored_data["scores"][i], expected) for i in range(keep)]
        )
        while len(self.rollouts_for_wandb) > self.config.num_rollouts_to_keep:
            self.rollouts_for_wandb.pop(0)

    async def create_rollout_table(self, metrics: Dict) -> Dict:
        if self.rollouts_for_wandb and self.wandb.active:
            rows = [[text, score, json.dumps(expected, separators=(",", ":"))]
                    for group in self.rollouts_for_wandb for text, score, expected in group]
            metrics["train/rollouts"] = self.wandb.table(["generation", "score", "expected_tool_call"], rows)
        self.rollouts_for_wandb = []
        return metrics

    async def wandb_log(self, metrics: Optional[Dict] = None):
        metrics = await self.create_rollout_table(dict(metrics or {}))
        if self.raw_score_buffer:
            metrics["train/avg_reward"] = sum(self.raw_score_buffer) / len(self.raw_score_buffer)
            metrics["train/percent_correct"] = sum(self.percent_correct_buffer) / len(self.percent_correct_buffer)
            self.raw_score_buffer.clear()
            self.percent_correct_buffer.clear()
        for key, value in self.eval_metrics:
            metrics[key] = value
        self.eval_metrics = []
        await super().wandb_log(metrics)


if __name__ == "__main__":
    MultiTurnToolCallingEnv.cli()
