"""Competition math (DeepMath-103K) with verifiable answers, plus self-judging sub-tasks.

A *normal* item is a problem: the model reasons inside ``<think>`` and ends with
``\\boxed{...}``; a rollout scores 1 when math-verify finds its post-``</think>`` answer
equal to the gold answer, else -1. A rollout that hit the token limit scores -1 and, with
``mask_too_long_completions``, carries ``set_advantage_to_zero``. Rollouts with fewer than
10 completion tokens are dropped, and a group missing any is not sent.

Groups that teach nothing are turned into other tasks, pushed on the backlog (serve mode
runs backlog items before new problems):

* **rlaif** - every rollout was right: the two most dissimilar answers go to a pairwise
  preference vote (3 judgements in each order, answers swapped); the preferred one
  scores +1 and the other -1, in a 2-rollout group (``group_overrides.group_size = 2``).
  With probability ``percent_length_penalty`` the all-right group itself is kept with a
  cosine length penalty (1 for the shortest, -1 for the longest).
* **judge** - a mixed group is, with probability ``percent_to_judge``, mined for one right
  and one wrong solution, each to be judged (``\\boxed{True}`` / ``\\boxed{False}``). A
  wrong verdict scores -1; a right verdict on a correct solution scores 1; a right verdict
  on a wrong solution scores the share of retries, prompted with that critique, that reach
  the gold answer.
* **selfcorrect** - those retries, scored 1 / -1 (0 when cut off), as a group of their own.

Data: ``zwhe99/DeepMath-103K`` (train, shuffled with seed 42); evaluation on
``HuggingFaceH4/aime_2024`` (train), ``HuggingFaceH4/math-500`` (test) and
``math-ai/amc23`` (test), reported per set and overall (temperature 0). Offline:
``--env.train_file`` (DeepMath's ``question`` / ``final_answer`` columns) and
``--env.test_file`` (``problem`` or ``question``, ``answer``, optional ``subset``).

``rescore`` scores saved *normal* groups again (math-verify, a cut-off rollout wrong, and an
all-right group the cosine length penalty a kept one gets); the groups derived from them are
scored by the model and are left as they were.

Generation uses `managed_server()`, so it needs a token-level backend
(``--openai.server_type vllm`` or ``sglang``, the latter being the default here).

    # offline, with the fixtures (against any vLLM-compatible server)
    python environments/math_server.py process --openai.server_type vllm \\
        --openai.base_url http://localhost:9001/v1 --openai.model_name MODEL --env.tokenizer_name MODEL \\
        --env.train_file environments/fixtures/math/deepmath_train.jsonl \\
        --env.test_file environments/fixtures/math/eval.jsonl --env.group_size 4 --env.total_steps 4
    # for real
    python environments/math_server.py serve --openai.base_url http://localhost:9004/v1
"""

import asyncio
import math
import multiprocessing
import random
import re
import time
from concurrent.futures import ProcessPoolExecutor
from difflib import SequenceMatcher
from typing import Dict, List, Optional, Tuple

from datasets import Dataset, load_dataset
from pydantic import Field

from atroposlib.envs.base import (
    APIServerConfig,
    BaseEnv,
    BaseEnvConfig,
    RESCORE_FACTS_FIELD,
    EvalHandlingEnum,
    ScoredDataGroup,
)
from atroposlib.envs.local_data import load_rows
from atroposlib.utils.math_answers import as_boxed, check_math_answer
from atroposlib.utils.reasoning_text import text_after_thinking

system_prompt = (
    "Work through the problem carefully before you answer. Reason step by step, for as long as you "
    "need, inside <think> and </think> tags; check your work there. After the closing tag, write your "
    "solution."
)

JUDGE_PROMPT = """Check whether the solution below solves the problem correctly.

Problem:
{problem}

Proposed solution:
{solution}

Explain how the problem should be solved, then give your verdict: \\boxed{{True}} if the proposed \
solution is correct, \\boxed{{False}} if it is not."""

RETRY_PROMPT = """Solve the problem below. An earlier attempt and a review of that attempt are \
included; use the review to avoid its mistakes.

Problem:
{problem}

Earlier attempt:
{solution}

Review:
{verification}

Give your final answer as \\boxed{{answer}}."""

PREFERENCE_PROMPT = """Two solutions to the problem below reach the correct final answer. Decide \
which one is better.

Problem:
{problem}

Solution 1:
{solution1}

Solution 2:
{solution2}

Judge them, in this order of importance, on: conciseness (neither padded nor missing steps), \
clarity (easy to follow), and soundness of the reasoning (the final answers were already checked, \
but the steps may still contain mistakes). Answer \\boxed{{1}} for the first solution or \
\\boxed{{2}} for the second."""

MIN_TRAINABLE_TOKENS = 10
MIN_THINKING_TOKENS = 1024
EVAL_MAX_TOKENS = 32765
SIMILARITY_FOR_RLAIF = 0.975


class RSConfig(BaseEnvConfig):
    run_evaluation: bool = Field(True, description="Run the evaluation sets every steps_per_eval steps.")
    mask_too_long_completions: bool = Field(
        True, description="Mark rollouts cut off by the token limit with set_advantage_to_zero."
    )
    percent_to_judge: float = Field(0.3, description="Share of mixed groups mined for judge tasks.")
    percent_length_penalty: float = Field(
        0.1, description="Share of all-correct groups kept with a length penalty."
    )
    train_file: Optional[str] = Field(
        None, description="Local DeepMath-layout file (question, final_answer) instead of the hub's train split."
    )
    test_file: Optional[str] = Field(
        None, description="Local evaluation file (problem or question, answer, optional subset) instead of the hub sets."
    )


# Atropos's name for the scoring function (`_score` runs it in a worker process, because
# math-verify's time limits rely on signals of a main thread).
score_answer = check_math_answer


def boxed_choice(text: Optional[str]) -> str:
    """The content of the last ``\\boxed{...}`` after the thinking ('' without one)."""
    found = re.findall(r"\\boxed\{([^{}]*)\}", text_after_thinking(text))
    return found[-1].strip() if found else ""


def cosine_length_scores(lengths: List[int]) -> Optional[List[float]]:
    """1 for the shortest, -1 for the longest, cosine in between; None when the lengths
    differ by no more than a tenth of the shortest (nothing to prefer)."""
    shortest = min(lengths)
    spread = max(lengths) - shortest
    if spread <= 0.1 * shortest:
        return None
    return [math.cos(math.pi * (length - shortest) / spread) for length in lengths]


def _trainable(masks: List[int]) -> int:
    return sum(1 for label in masks if label != -100)


class MathEnv(BaseEnv):
    name = "math"
    env_config_cls = RSConfig

    def __init__(self, config: RSConfig, server_configs: List[APIServerConfig], slurm=True, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        self.percent_correct_buffer = []
        self.eval_metrics = []
        self.percent_overanswer = []
        self.percent_judge_correct = []
        self.correct_answer_len = []
        self.incorrect_answer_len = []
        self.normal_rollouts = []
        self.rlaif_rollouts = []
        self.pass_at_groupsize = []
        self.judge_rollouts = []
        self.selfcorrect_rollouts = []
        self.judge_success_rate = []
        self.iter = 0
        self._scoring_pool: Optional[ProcessPoolExecutor] = None

    @classmethod
    def config_init(cls) -> Tuple[RSConfig, List[APIServerConfig]]:
        env_config = RSConfig(
            tokenizer_name="NousResearch/Hermes-4-14B",
            group_size=16,
            use_wandb=True,
            rollout_server_url="http://localhost:8000",
            total_steps=1000,
            batch_size=1024,
            max_num_workers_per_node=12,
            steps_per_eval=25,
            max_token_length=16384,
            wandb_name="math",
            eval_handling=EvalHandlingEnum.LIMIT_TRAIN,
            eval_limit_ratio=0.1,
            inference_weight=4,
            min_batch_allocation=0.1,
        )
        server_configs = [
            APIServerConfig(
                model_name="NousResearch/Hermes-4-14B",
                base_url="http://localhost:9004/v1",
                api_key="x",
                num_requests_for_eval=256,
                server_type="sglang",
            )
        ]
        return env_config, server_configs

    # -- data -------------------------------------------------------------------------------
    async def setup(self):
        if self.config.train_file:
            train = Dataset.from_list(load_rows("zwhe99/DeepMath-103K", split="train", local_file=self.config.train_file))
        else:  # kept as an Arrow table: DeepMath's rows carry three long worked solutions each
            train = load_dataset("zwhe99/DeepMath-103K", split="train")
        self.train = train.shuffle(seed=42)
        self.test = []
        if self.config.test_file:
            for row in load_rows("HuggingFaceH4/math-500", split="test", local_file=self.config.test_file):
                problem = row.get("problem") or row.get("question")
                self.test.append((problem, str(row["answer"]), row.get("subset") or "test_file"))
            return
        sets = [
            ("aime24", load_rows("HuggingFaceH4/aime_2024", split="train"), "problem"),
            ("math500", load_rows("HuggingFaceH4/math-500", split="test"), "problem"),
            ("amc23", load_rows("math-ai/amc23", split="test"), "question"),
        ]
        for subset, rows, problem_column in sets:
            self.test.extend((row[problem_column], str(row["answer"]), subset) for row in rows)

    def save_checkpoint(self, step, data=None):
        super().save_checkpoint(step, {"iter": self.iter} if data is None else data)

    async def get_next_item(self):
        for _ in range(len(self.train)):
            row = self.train[self.iter % len(self.train)]
            self.iter += 1
            if isinstance(row.get("final_answer"), str) and row.get("question"):
                return {"kind": "normal", "problem": row["question"], "gold": as_boxed(row["final_answer"])}
        raise RuntimeError("no DeepMath row has both a question and a final_answer")

    # -- helpers ------------------------------------------------------------------------------
    def _chat(self, user_content: str) -> List[Dict[str, str]]:
        return [{"role": "system", "content": system_prompt}, {"role": "user", "content": user_content}]

    def _room_left(self, chat: List[Dict[str, str]]) -> int:
        """Tokens left for the completion once the prompt is in the context."""
        prompt = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        return self.config.max_token_length - len(self.tokenizer.encode(prompt, add_special_tokens=False))

    async def _sample(self, chat: List[Dict[str, str]], n: int, max_tokens: int) -> List[dict]:
        """`n` completions of `chat` with their tracked tokens, masks and logprobs."""
        if max_tokens < 1:
            raise ValueError(f"the prompt fills max_token_length ({self.config.max_token_length} tokens)")
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=chat, n=n, max_tokens=max_tokens, temperature=1.0, top_p=0.95,
            )
            nodes = managed.get_state()["nodes"]
        return [{
            "messages": chat + [{"role": "assistant", "content": choice.message.content or ""}],
            "text": choice.message.content or "",
            "finish_reason": choice.finish_reason,
            "tokens": node.tokens, "masks": node.masked_tokens, "logprobs": node.logprobs,
        } for choice, node in zip(completion.choices, nodes)]

    async def _score(self, gold: str, response: str) -> Optional[bool]:
        if self._scoring_pool is None:
            try:
                context = multiprocessing.get_context("fork")
            except ValueError:
                context = None
            self._scoring_pool = ProcessPoolExecutor(
                max_workers=min(64, multiprocessing.cpu_count()), mp_context=context,
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._scoring_pool, score_answer, gold, response)

    def _keep(self, buffer: list, entry) -> None:
        buffer.append(entry)
        while len(buffer) > self.config.num_rollouts_to_keep:
            buffer.pop(0)

    @staticmethod
    def _new_group() -> ScoredDataGroup:
        return ScoredDataGroup(tokens=[], masks=[], scores=[], overrides=[], messages=[], inference_logprobs=[])

    @staticmethod
    def _add(group: ScoredDataGroup, rollout: dict, score: float, override: Optional[dict] = None) -> None:
        group["tokens"].append(rollout["tokens"])
        group["masks"].append(rollout["masks"])
        group["inference_logprobs"].append(rollout["logprobs"])
        group["messages"].append(rollout["messages"])
        group["scores"].append(score)
        group["overrides"].append(override or {})

    def _cut_off_override(self, finish_reason: Optional[str]) -> dict:
        if finish_reason == "length" and self.config.mask_too_long_completions:
            return {"set_advantage_to_zero": True}
        return {}

    # -- rollouts ------------------------------------------------------------------------------
    async def collect_trajectories(self, item):
        kind = item["kind"]
        if kind == "normal":
            return await self.collect_trajectories_normal(item)
        if kind == "rlaif":
            return await self.collect_trajectories_rlaif(item)
        if kind == "judge":
            return await self.collect_trajectories_judge(item)
        if kind == "selfcorrect":
            return self.collect_trajectories_selfcorrect(item), []
        raise ValueError(f"unknown math item kind: {kind!r}")

    async def collect_trajectories_normal(self, item):
        chat = self._chat(item["problem"])
        room = self._room_left(chat)
        if room < MIN_THINKING_TOKENS:  # the problem leaves too little room to reason in
            return None, []
        rollouts = await self._sample(chat, self.config.group_size, room)
        group = await self.score_normal(rollouts, item["gold"])
        backlog = []
        if group is None:
            return None, backlog
        scores = group["scores"]
        if len(set(scores)) == 1:
            if scores[0] != 1.0:
                return None, backlog
            pair = self._most_dissimilar(group)
            if pair is not None:
                (i, j), similarity = pair
                backlog.append({
                    "kind": "rlaif", "problem": item["problem"], "gold": item["gold"], "similarity": similarity,
                    "pair": [{key: group[column][k] for key, column in (
                        ("messages", "messages"), ("tokens", "tokens"), ("masks", "masks"),
                        ("logprobs", "inference_logprobs"))} for k in (i, j)],
                })
            if random.random() >= self.config.percent_length_penalty:
                return None, backlog
            penalised = cosine_length_scores([len(tokens) for tokens in group["tokens"]])
            if penalised is None:
                return None, backlog
            group["scores"] = penalised
        else:
            self._keep(self.normal_rollouts, (item["problem"], group["messages"][0][-1]["content"], item["gold"], scores[0]))
            if random.random() < self.config.percent_to_judge:
                backlog.extend(self._judge_items(item, group))
        if not self.config.mask_too_long_completions:
            group["overrides"] = [{} for _ in group["scores"]]
        return group, backlog

    async def score_normal(self, rollouts: List[dict], gold: str) -> Optional[ScoredDataGroup]:
        group = self._new_group()
        random.shuffle(rollouts)

        async def judged(rollout: dict) -> Optional[bool]:
            if rollout["finish_reason"] == "length":
                return False
            return await self._score(gold, text_after_thinking(rollout["text"]))

        verdicts = await asyncio.gather(*(judged(rollout) for rollout in rollouts))
        if any(correct is None for correct in verdicts):  # the gold answer does not parse: nothing can be scored
            return None
        for rollout, correct in zip(rollouts, verdicts):
            if _trainable(rollout["masks"]) < MIN_TRAINABLE_TOKENS:
                continue
            # cut-off rollouts are always marked here so that judge mining can skip them
            override = {"set_advantage_to_zero": True} if rollout["finish_reason"] == "length" else {}
            self._add(group, rollout, 1.0 if correct else -1.0, override)
            group.setdefault(RESCORE_FACTS_FIELD, []).append({"finish_reason": rollout["finish_reason"]})
            if len(group["tokens"]) >= self.config.group_size:
                break
        self.pass_at_groupsize.append(1.0 if 1.0 in group["scores"] else 0.0)
        if len(group["tokens"]) < self.config.group_size:
            return None
        self.percent_correct_buffer.extend(max(score, 0.0) for score in group["scores"])
        self.percent_overanswer.extend(rollout["finish_reason"] == "length" for rollout in rollouts)
        for score, tokens, override in zip(group["scores"], group["tokens"], group["overrides"]):
            if score == 1.0:
                self.correct_answer_len.append(len(tokens))
            elif not override.get("set_advantage_to_zero"):
                self.incorrect_answer_len.append(len(tokens))
        return group

    async def rescore_group(self, group: ScoredDataGroup, item: dict) -> List[float]:
        """A saved *normal* group scored again: math-verify against the gold answer (a cut-off
        rollout is wrong), and, when every rollout comes out right, the cosine length penalty a
        kept all-right group gets. The other kinds are scored by the model (inference)."""
        if item.get("kind") != "normal":
            raise ValueError(f"a {item.get('kind')} group is scored by the model itself (inference): left as it was")
        finished = self.saved_facts(group, "finish_reason")
        verdicts = [False if reason == "length" else await self._score(item["gold"], text_after_thinking(reply))
                    for reply, reason in zip(self.completions(group), finished)]
        if any(correct is None for correct in verdicts):
            raise ValueError(f"the gold answer {item['gold']!r} does not parse")
        scores = [1.0 if correct else -1.0 for correct in verdicts]
        if all(score == 1.0 for score in scores):
            return cosine_length_scores([len(tokens) for tokens in group["tokens"]]) or scores
        return scores

    @staticmethod
    def _most_dissimilar(group: ScoredDataGroup) -> Optional[Tuple[Tuple[int, int], float]]:
        """The two rollouts whose final answers differ most, if they differ enough."""
        answers = [text_after_thinking(messages[-1]["content"]) for messages in group["messages"]]
        best, lowest = None, 1.0
        for i in range(len(answers)):
            for j in range(i + 1, len(answers)):
                similarity = 1.0 if answers[i] == answers[j] else SequenceMatcher(None, answers[i], answers[j]).ratio()
                if similarity < lowest:
                    best, lowest = (i, j), similarity
        if best is None or lowest >= SIMILARITY_FOR_RLAIF:
            return None
        return best, lowest

    def _judge_items(self, item: dict, group: ScoredDataGroup) -> List[dict]:
        """One right and one wrong (not cut-off) solution of a mixed group, to be judged."""
        right = next((k for k, score in enumerate(group["scores"]) if score == 1.0), None)
        wrong = next((k for k, score in enumerate(group["scores"])
                      if score == -1.0 and not group["overrides"][k].get("set_advantage_to_zero")), None)
        if right is None or wrong is None:
            return []
        return [{"kind": "judge", "problem": item["problem"], "gold": item["gold"],
                 "solution": text_after_thinking(group["messages"][k][-1]["content"]), "verdict": verdict}
                for k, verdict in ((right, "True"), (wrong, "False"))]

    async def collect_trajectories_rlaif(self, item):
        first, second = item["pair"]
        answers = [text_after_thinking(rollout["messages"][-1]["content"]) for rollout in (first, second)]
        forward = self._chat(PREFERENCE_PROMPT.format(problem=item["problem"], solution1=answers[0], solution2=answers[1]))
        swapped = self._chat(PREFERENCE_PROMPT.format(problem=item["problem"], solution1=answers[1], solution2=answers[0]))
        votes_forward, votes_swapped = await asyncio.gather(
            self._sample(forward, 3, self._room_left(forward)), self._sample(swapped, 3, self._room_left(swapped)),
        )
        first_votes = sum(boxed_choice(v["text"]) == "1" for v in votes_forward) + sum(
            boxed_choice(v["text"]) == "2" for v in votes_swapped)
        second_votes = sum(boxed_choice(v["text"]) == "2" for v in votes_forward) + sum(
            boxed_choice(v["text"]) == "1" for v in votes_swapped)
        if first_votes == second_votes:
            return None, []
        self._keep(self.rlaif_rollouts, (item["problem"], answers[0], answers[1], first_votes - second_votes,
                                         votes_forward[0]["text"]))
        group = self._new_group()
        self._add(group, first, 1.0 if first_votes > second_votes else -1.0)
        self._add(group, second, 1.0 if second_votes > first_votes else -1.0)
        group["group_overrides"] = {"group_size": 2}
        return group, []

    async def collect_trajectories_judge(self, item):
        chat = self._chat(JUDGE_PROMPT.format(problem=item["problem"], solution=item["solution"]))
        judgements = await self._sample(chat, self.config.group_size, self._room_left(chat))
        right = [boxed_choice(j["text"]) == item["verdict"] and j["finish_reason"] != "length" for j in judgements]
        self.percent_judge_correct.append(sum(right) / len(right))
        if not any(right):
            return None, []
        group, backlog, logged = self._new_group(), [], False
        for judgement, is_right in zip(judgements, right):
            if not is_right:
                self._add(group, judgement, -1.0, self._cut_off_override(judgement["finish_reason"]))
                continue
            if not logged:
                self._keep(self.judge_rollouts, [item["problem"], item["gold"], item["solution"], item["verdict"],
                                                 judgement["text"]])
                logged = True
            if item["verdict"] == "True":
                self._add(group, judgement, 1.0)
                continue
            success, retry_item = await self._retry_with_review(item, judgement["text"])
            if retry_item is not None:
                backlog.append(retry_item)
            self._add(group, judgement, success)
            self._keep(self.judge_success_rate, success)
        if all(score == 1.0 for score in group["scores"]):
            if random.random() >= self.config.percent_length_penalty:
                return None, backlog
            penalised = cosine_length_scores([len(tokens) for tokens in group["tokens"]])
            if penalised is None:
                return None, backlog
            group["scores"] = penalised
        elif len(set(group["scores"])) == 1:
            return None, backlog
        return group, backlog

    async def _retry_with_review(self, item: dict, review: str) -> Tuple[float, Optional[dict]]:
        """Retries of the problem prompted with a critique of a wrong solution: the share
        that reach the gold answer, and a selfcorrect item when their scores differ."""
        chat = self._chat(RETRY_PROMPT.format(problem=item["problem"], solution=item["solution"],
                                              verification=text_after_thinking(review)))
        retries = await self._sample(chat, self.config.group_size, self._room_left(chat))

        async def outcome(retry: dict) -> Optional[bool]:
            if retry["finish_reason"] == "length":
                return None
            return bool(await self._score(item["gold"], text_after_thinking(retry["text"])))

        outcomes = await asyncio.gather(*(outcome(retry) for retry in retries))
        successes = [1.0 if correct else 0.0 for correct in outcomes]
        scores = [0.0 if correct is None else 1.0 if correct else -1.0 for correct in outcomes]  # cut off: 0
        selfcorrect = None
        if len(set(scores)) > 1:
            selfcorrect = {"kind": "selfcorrect", "problem": item["problem"], "gold": item["gold"],
                           "rollouts": retries, "scores": scores}
        return sum(successes) / len(successes), selfcorrect

    def collect_trajectories_selfcorrect(self, item) -> ScoredDataGroup:
        group = self._new_group()
        for rollout, score in zip(item["rollouts"], item["scores"]):
            self._add(group, rollout, score, self._cut_off_override(rollout["finish_reason"]))
        first = item["rollouts"][0]["messages"]
        self._keep(self.selfcorrect_rollouts, (item["problem"], item["gold"], first[1]["content"], first[-1]["content"]))
        return group

    # -- evaluation -------------------------------------------------------------------------------
    async def rollout_and_score_eval(self, problem: str, answer: str, subset: str) -> dict:
        completion = await self.server.chat_completion(
            messages=self._chat(problem), n=1, max_tokens=EVAL_MAX_TOKENS, temperature=0.0, split="eval",
        )
        text = completion.choices[0].message.content or ""
        correct = await self._score(answer, text_after_thinking(text))
        return {"subset": subset, "question": problem, "gold_answer": answer, "response": text,
                "score": 1.0 if correct else 0.0, "correct": bool(correct),
                "finish_reason": completion.choices[0].finish_reason}

    async def evaluate(self, *args, **kwargs):
        if not self.config.run_evaluation or not self.test:
            return
        start = time.time()
        samples = await asyncio.gather(*(self.rollout_and_score_eval(*entry) for entry in self.test))
        by_subset: Dict[str, List[float]] = {}
        for sample in samples:
            by_subset.setdefault(sample["subset"], []).append(sample["score"])
        metrics = {f"eval/{subset}_percent_correct": sum(s) / len(s) for subset, s in by_subset.items()}
        metrics["eval/overall_percent_correct"] = sum(s["score"] for s in samples) / len(samples)
        self.eval_metrics.extend(metrics.items())
        self.evaluate_log(metrics, samples=list(samples), start_time=start, end_time=time.time(),
                          generation_parameters={"temperature": 0.0, "max_tokens": EVAL_MAX_TOKENS})

    # -- logging -------------------------------------------------------------------------------------
    async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
        metrics = dict(wandb_metrics or {})

        def mean_into(key: str, values: list, clear: bool = True) -> None:
            if values:
                metrics[key] = sum(values) / len(values)
                if clear:
                    values.clear()

        mean_into("train/pass_at_groupsize", self.pass_at_groupsize)
        mean_into("train/percent_overanswer", self.percent_overanswer)
        mean_into("train/percent_correct", self.percent_correct_buffer)
        mean_into("train/avg_correct_answer_len", self.correct_answer_len)
        mean_into("train/avg_incorrect_answer_len", self.incorrect_answer_len)
        mean_into("judge_train/percent_judge_correct", self.percent_judge_correct)
        mean_into("judge_train/judge_success_rate", self.judge_success_rate, clear=False)
        if self.wandb.active:
            for key, columns, rows in (
                ("judge_train/judge_rollouts", ["problem", "solution", "answer", "correct", "judge"], self.judge_rollouts),
                ("judge_train/selfcorrect_rollouts", ["problem", "solution1", "solution2", "score"], self.selfcorrect_rollouts),
                ("train/normal_rollouts", ["problem", "solution", "answer", "score"], self.normal_rollouts),
                ("train/rlaif_rollouts", ["problem", "solution1", "solution2", "score", "rollout"], self.rlaif_rollouts),
            ):
                if rows:
                    metrics[key] = self.wandb.table(columns, [list(row) for row in rows])
        metrics["train/iter"] = self.iter
        metrics.update(dict(self.eval_metrics))
        self.eval_metrics = []
        await super().wandb_log(metrics)


if __name__ == "__main__":
    MathEnv.cli()
