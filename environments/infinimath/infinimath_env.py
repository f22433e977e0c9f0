"""InfiniteMath: endless generated math problems on a seven-level curriculum.

Problems come from the ``mathgenerator`` package through `MathCurriculum` (curriculum.py;
levels 1-7, from arithmetic to complex numbers), with LaTeX ``$`` delimiters removed. The
model reasons in ``<think> ... </think>`` (the completion prompt is pre-filled with
``<think>``) and answers in ``\\boxed{}``. Optionally a second, OpenAI-compatible model
first rewrites each problem as a short word problem: it does when an API key is found
(``--env.word_problem_openai_api_key``, else ``OPENAI_API_KEY``) or
``--env.word_problem_openai_base_url`` is set, with ``--env.word_problem_model_name``
(default ``gpt-4.1-mini``; an empty name turns rewriting off). Without either the raw
problem is asked.

Reward per rollout: ``correct_reward`` (1.0) when the first ``\\boxed{}`` after
``</think>`` (else the last line) equals the solution once LaTeX commands, commas, spaces
and case are ignored, else ``incorrect_reward`` (config_init: -0.5); plus
``think_block_bonus`` (0.2) for a non-empty ``<think>`` block and ``boxed_answer_bonus``
(0.2) for a ``\\boxed{}`` answer. When a whole group is right, rollouts longer than
``length_threshold_ratio`` of ``max_token_length`` lose score linearly
(``apply_length_penalty``). Every rollout's result goes to the curriculum, which moves up a
level once the last ``min_evaluations`` results at the current level reach
``progress_threshold``; evaluation (10 generated problems per level, temperature 0) uses
the current level and feeds the curriculum too. Single turn, text completions and
`tokenize_for_trainer`, so any OpenAI-compatible server works. Needs ``pip install
mathgenerator``.

    python environments/infinimath/infinimath_env.py process --env.total_steps 4 \\
        --openai.base_url http://localhost:9001/v1 --openai.model_name MODEL --env.tokenizer_name MODEL

    python environments/infinimath/infinimath_env.py serve --openai.base_url http://localhost:9004/v1 \\
        --openai.model_name MODEL --env.tokenizer_name MODEL
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from typing import Any, Optional, Union

from pydantic import Field

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.type_definitions import Item
from atroposlib.utils.length_penalty import length_scaled_score
from atroposlib.utils.reasoning_text import text_after_thinking, thinking_content
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

try:
    from .curriculum import MathCurriculum
    from .infinimath import answers_match, extract_boxed, strip_latex_delimiters
except ImportError:  # run as a script: import the package from the repository root
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from environments.infinimath.curriculum import MathCurriculum
    from environments.infinimath.infinimath import answers_match, extract_boxed, strip_latex_delimiters

logger = logging.getLogger(__name__)

PREFILL = "<think>\n"
EVAL_PROBLEMS_PER_LEVEL = 10

system_prompt = (
    "You are a careful mathematician. Work the problem out step by step, reasoning as long as you need "
    "inside <think> </think> tags, and check your result before you commit to it.\n\n"
    "Problems may be written in LaTeX; write your answer in LaTeX too, without $ signs. After </think>, "
    "give the final answer exactly once as \\boxed{answer}. Give the exact value: do not round.\n\n"
    "Layout of your reply:\n<think>\nyour reasoning\n</think>\n\n\\boxed{final answer}"
)

WORD_PROBLEM_PROMPT = (
    "You turn bare math exercises into short story problems. Keep every number, every operation and the "
    "question itself exactly as they are: someone solving your story must compute precisely the original "
    "expression and get the same result. Use a sentence or three. Reply with the story problem alone, no "
    "title, introduction or remarks."
)

# One hand-made problem per level, used only if a level's generators all fail at setup.
FALLBACK_EVAL_PROBLEMS = {
    1: ("What is 17 + 25?", "42", 0),
    2: ("What is the square root of 81?", "9", 6),
    3: ("What is the area of a triangle with base 10 and height 4?", "20", 18),
    4: ("Solve for x: 3x - 4 = 11", "5", 26),
    5: ("What is the volume of a cube with side length 4?", "64", 35),
    6: ("What is 6 factorial divided by 4 factorial?", "30", 31),
    7: ("What is |4 - 19|?", "15", 71),
}


class InfiniteMathEnvConfig(BaseEnvConfig):
    """Settings of `InfiniteMathEnv` (Atropos's fields and defaults)."""

    starting_level: int = Field(1, description="Curriculum level of the first problems (1-7).")
    progress_threshold: float = Field(0.8, description="Success rate over the last min_evaluations results that moves the level up.")
    min_evaluations: int = Field(5, description="Results at a level before it may move up.")

    max_attempts_per_problem: int = Field(3, description="Tries per problem in an InfiniteMath practice session.")
    correct_reward: float = Field(1.0, description="Score of a right answer.")
    incorrect_reward: float = Field(-1.0, description="Score of a wrong answer.")
    think_block_bonus: float = Field(0.2, description="Added for a non-empty <think> block.")
    boxed_answer_bonus: float = Field(0.2, description="Added for a \\boxed{} answer after </think>.")

    apply_length_penalty: bool = Field(True, description="When a whole group is right, penalise long rollouts.")
    length_threshold_ratio: float = Field(0.5, description="Share of max_token_length above which the penalty starts.")

    temperature: float = Field(0.7, description="Sampling temperature of training rollouts.")
    top_p: float = Field(0.9, description="Nucleus sampling of training rollouts.")

    word_problem_model_name: Optional[str] = Field(
        "gpt-4.1-mini", description="Model that rewrites problems as word problems (empty: never rewrite).")
    word_problem_openai_api_key: Optional[str] = Field(
        None, description="Its API key (default: OPENAI_API_KEY; rewriting is off without a key or a base URL).")
    word_problem_openai_base_url: Optional[str] = Field(
        None, description="Its OpenAI-compatible base URL (default: OpenAI's).")


class InfiniteMathEnv(BaseEnv):
    """Generated math problems whose difficulty follows the model's results."""

    env_config_cls = InfiniteMathEnvConfig

    def __init__(self, config: InfiniteMathEnvConfig,
                 server_configs: Union[list[APIServerConfig], APIServerConfig], slurm=True, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        self.config = config
        self.percent_correct_buffer: list[int] = []
        self.level_correct_buffer: dict[int, list[int]] = {level: [] for level in range(1, 8)}
        self.eval_metrics: list[tuple[str, Any]] = []
        self.curriculum: Optional[MathCurriculum] = None
        self.eval_problems: dict[int, list[tuple[str, str, int]]] = {}
        self.system_prompt = system_prompt
        self._word_problem_client: Any = None

    @classmethod
    def config_init(cls) -> tuple[InfiniteMathEnvConfig, list[APIServerConfig]]:
        env_config = InfiniteMathEnvConfig(
            tokenizer_name="NousResearch/Nous-Hermes-2-Yi-34B", group_size=8, use_wandb=True, max_num_workers=64,
            rollout_server_url="http://localhost:8000", total_steps=10000, batch_size=1024, steps_per_eval=25,
            max_token_length=4096, inference_weight=1.0, wandb_name="infinimath",
            data_path_to_save_groups="data/infinite_math_groups.jsonl", starting_level=1, progress_threshold=0.8,
            min_evaluations=10, max_attempts_per_problem=3, correct_reward=1.0, incorrect_reward=-0.5,
            think_block_bonus=0.2, boxed_answer_bonus=0.2, apply_length_penalty=True, length_threshold_ratio=0.6,
            temperature=0.7, top_p=0.9, word_problem_model_name="gpt-4.1-mini", word_problem_openai_api_key=None,
            word_problem_openai_base_url=None,
        )
        server_configs = [APIServerConfig(model_name="NousResearch/Nous-Hermes-2-Yi-34B",
                                          base_url="http://localhost:9004/v1", api_key="x", num_requests_for_eval=64)]
        return env_config, server_configs

    # -- setup -------------------------------------------------------------------------------------
    async def setup(self):
        self.curriculum = MathCurriculum(starting_level=self.config.starting_level,
                                         progress_threshold=self.config.progress_threshold,
                                         min_evaluations=self.config.min_evaluations)
        self.eval_problems = {}
        for level in range(1, 8):
            maker = MathCurriculum(starting_level=level, rng=random.Random(1000 + level))
            problems = []
            for _ in range(2 * EVAL_PROBLEMS_PER_LEVEL):
                if len(problems) >= EVAL_PROBLEMS_PER_LEVEL:
                    break
                problem, solution, generator_id = maker.get_problem()
                if generator_id in maker.DIFFICULTY_LEVELS[level]:
                    problems.append((strip_latex_delimiters(problem), strip_latex_delimiters(solution), generator_id))
            self.eval_problems[level] = problems or [FALLBACK_EVAL_PROBLEMS[level]]
        if self.word_problems_enabled():
            logger.info("problems are rewritten as word problems by %s", self.config.word_problem_model_name)

    def _strip_latex_delimiters(self, text: str) -> str:
        return strip_latex_delimiters(text)

    # -- word problems -------------------------------------------------------------------------------
    def _word_problem_key(self) -> Optional[str]:
        return self.config.word_problem_openai_api_key or os.environ.get("OPENAI_API_KEY")

    def word_problems_enabled(self) -> bool:
        """Whether problems are rewritten: a model name, and a key or a base URL to reach it."""
        name = (self.config.word_problem_model_name or "").strip()
        return bool(name) and name.lower() != "none" and bool(
            self._word_problem_key() or self.config.word_problem_openai_base_url)

    async def _convert_to_word_problem(self, raw_problem_text: str) -> str:
        """`raw_problem_text` as a word problem from the rewriting model (unchanged on any failure)."""
        if not self.word_problems_enabled():
            return raw_problem_text
        try:
            if self._word_problem_client is None:
                from openai import AsyncOpenAI

                self._word_problem_client = AsyncOpenAI(api_key=self._word_problem_key() or "x",
                                                        base_url=self.config.word_problem_openai_base_url)
            response = await self._word_problem_client.chat.completions.create(
                model=self.config.word_problem_model_name,
                messages=[{"role": "system", "content": WORD_PROBLEM_PROMPT},
                          {"role": "user", "content": f"Exercise: {raw_problem_text}"}],
                n=1, max_tokens=512, temperature=0.7, top_p=1.0,
            )
            text = (response.choices[0].message.content or "").strip()
        except Exception as exc:
            logger.error("word problem rewriting failed for %r: %s", raw_problem_text, exc)
            return raw_problem_text
        return text or raw_problem_text

    # -- items and rollouts -----------------------------------------------------------------------------
    async def get_next_item(self) -> Item:
        raw_problem, solution, generator_id = self.curriculum.get_problem()
        problem = await self._convert_to_word_problem(strip_latex_delimiters(raw_problem))
        prompt = (frozenset({"role": "user", "content": problem}.items()),)
        return prompt, strip_latex_delimiters(solution), generator_id

    def _prompt(self, problem: str) -> str:
        messages = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": problem}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + PREFILL

    def _budget(self, prompt: str) -> int:
        used = len(self.tokenizer.encode(prompt, add_special_tokens=False))
        return max(16, self.config.max_token_length - used)

    async def collect_trajectories(self, item: Item) -> tuple[Optional[ScoredDataGroup], list[Item]]:
        problem_prompt, solution, generator_id = item
        problem = dict(problem_prompt[0])["content"]
        prompt = self._prompt(problem)
        completions = await self.server.completion(
            prompt=prompt, n=self.config.group_size, max_tokens=self._budget(prompt),
            temperature=self.config.temperature, top_p=self.config.top_p,
        )
        level = self.curriculum.level_of(generator_id)
        to_score = []
        for choice in completions.choices:
            messages = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": problem},
                        {"role": "assistant", "content": PREFILL + (choice.text or "")}]
            to_score.append((messages, solution, generator_id, level, choice.finish_reason))
        return await self.score(to_score), []

    def check_answer(self, model_answer: str, solution: str) -> bool:
        return answers_match(model_answer, solution)

    def _extract_boxed_answer(self, text: str) -> Optional[str]:
        return extract_boxed(text)

    def rollout_score(self, model_answer: str, solution: str) -> tuple[float, bool]:
        """(score, correct) of one reply: correctness reward plus the think and boxed bonuses."""
        correct = self.check_answer(model_answer, solution)
        score = self.config.correct_reward if correct else self.config.incorrect_reward
        if (thinking_content(model_answer) or "").strip():
            score += self.config.think_block_bonus
        if extract_boxed(text_after_thinking(model_answer)) is not None:
            score += self.config.boxed_answer_bonus
        return score, correct

    async def score(self, rollout_group_data: list[tuple]) -> Optional[ScoredDataGroup]:
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
        all_correct = True
        for entry in rollout_group_data:
            messages, solution, generator_id, level = entry[:4]
            finish_reason = entry[4] if len(entry) > 4 else ""
            score, correct = self.rollout_score(messages[-1]["content"], solution)
            all_correct &= correct
            self.percent_correct_buffer.append(int(correct))
            if level is not None:
                self.level_correct_buffer.setdefault(level, []).append(int(correct))
            self.curriculum.record_performance(generator_id, correct)
            tokenized = tokenize_for_trainer(self.tokenizer, messages, finish_reason=finish_reason or "")
            group["tokens"].append(tokenized["tokens"])
            group["masks"].append(tokenized["masks"])
            group["scores"].append(score)
            group["messages"].append(messages)
        if not group["tokens"]:
            return None
        if self.config.apply_length_penalty and all_correct:
            self._apply_length_penalty(group)
        if self.curriculum.advance_difficulty():
            logger.info("curriculum: up to level %d (%s)", self.curriculum.get_current_level(),
                        self.curriculum.get_level_description())
        return group

    def _apply_length_penalty(self, group: ScoredDataGroup) -> None:
        """All right: scores of sequences above the threshold fall linearly to 0 at max_token_length."""
        group["scores"] = [length_scaled_score(score, len(tokens), self.config.max_token_length,
                                               self.config.length_threshold_ratio)
                           for score, tokens in zip(group["scores"], group["tokens"])]

    # -- evaluation -------------------------------------------------------------------------------------
    async def evaluate_single_problem(self, problem: str, solution: str, level: int) -> tuple[int, bool, dict]:
        try:
            question = await self._convert_to_word_problem(problem)
            prompt = self._prompt(question)
            completion = await self.server.completion(prompt=prompt, n=1, max_tokens=self._budget(prompt),
                                                      temperature=0.0, top_p=1.0, split="eval")
            reply = PREFILL + (completion.choices[0].text or "")
            correct = self.check_answer(reply, solution)
            return level, correct, {"question": question, "gold_answer": solution, "response": reply,
                                    "correct": correct, "level": level}
        except Exception as exc:
            logger.error("evaluation of %r failed: %s", problem, exc)
            return level, False, {"question": problem, "gold_answer": solution, "error": str(exc), "correct": False,
                                  "level": level}

    async def evaluate(self, *args, **kwargs):
        """Solve the current level's evaluation problems; the results also count for the curriculum."""
        level = self.curriculum.get_current_level()
        problems = self.eval_problems.get(level, [])
        if not problems:
            logger.warning("no evaluation problems at level %d", level)
            return []
        start = time.time()
        results = await asyncio.gather(*(self.evaluate_single_problem(p, s, level) for p, s, _ in problems))
        accuracy = sum(correct for _, correct, _ in results) / len(results)
        metrics: dict[str, Any] = {f"eval/level_{level}_accuracy": accuracy, "eval/current_level": level}
        for (_, _, generator_id), (_, correct, _) in zip(problems, results):
            self.curriculum.record_performance(generator_id, correct)
        advanced = self.curriculum.advance_difficulty()
        metrics["eval/advanced_level"] = int(advanced)
        logger.info("evaluation at level %d: %.0f%% right%s", level, 100 * accuracy,
                    f"; up to level {self.curriculum.get_current_level()}" if advanced else "")
        self.eval_metrics.extend(metrics.items())
        self.evaluate_log(metrics, samples=[sample for _, _, sample in results], start_time=start,
                          end_time=time.time(), generation_parameters={"temperature": 0.0, "top_p": 1.0})
        return self.eval_metrics

    # -- checkpoints and logging ---------------------------------------------------------------------------
    def save_checkpoint(self, step, data=None):
        data = dict(data or {})
        data["curriculum_level"] = self.curriculum.get_current_level()
        data["performance_history"] = {str(k): v for k, v in self.curriculum.performance_history.items()}
        super().save_checkpoint(step, data)

    def load_checkpoint(self):
        super().load_checkpoint()
        if self.curriculum is None:
            return
        if isinstance(getattr(self, "curriculum_level", None), int):
            self.curriculum.current_level = self.curriculum_level
        if isinstance(getattr(self, "performance_history", None), dict):
            self.curriculum.performance_history = {int(k): list(v) for k, v in self.performance_history.items()}

    async def wandb_log(self, wandb_metrics: Optional[dict] = None):
        metrics = dict(wandb_metrics or {})
        if self.percent_correct_buffer:
            metrics["train/percent_correct"] = sum(self.percent_correct_buffer) / len(self.percent_correct_buffer)
        for level, results in self.level_correct_buffer.items():
            if results:
                metrics[f"train/level_{level}_correct"] = sum(results) / len(results)
                metrics[f"train/level_{level}_count"] = len(results)
        if self.curriculum is not None:
            level, top = self.curriculum.get_current_level(), max(self.curriculum.DIFFICULTY_LEVELS)
            metrics["curriculum/current_level"] = level
            metrics["curriculum/max_level"] = top
            metrics["curriculum/progress_percent"] = 100 * level / top
            metrics["curriculum/level_description"] = self.curriculum.get_level_description()
            history = self.curriculum.performance_history.get(level, [])
            recent = history[-max(1, self.curriculum.min_evaluations):]
            if recent:
                rate = sum(recent) / len(recent)
                metrics["curriculum/current_level_success_rate"] = rate
                metrics["curriculum/threshold_to_advance"] = self.curriculum.progress_threshold
                metrics["curriculum/remaining_to_threshold"] = max(0.0, self.curriculum.progress_threshold - rate)
        metrics.update(dict(self.eval_metrics))
        self.percent_correct_buffer = []
        self.level_correct_buffer = {level: [] for level in self.level_correct_buffer}
        self.eval_metrics = []
        await super().wandb_log(metrics)


if __name__ == "__main__":
    InfiniteMathEnv.cli()
