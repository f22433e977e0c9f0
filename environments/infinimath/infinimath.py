"""InfiniteMath: endless math practice on `MathCurriculum`, without a language model.

`InfiniteMath` holds one problem at a time, gives ``max_attempts_per_problem`` tries,
records the result in the curriculum (which may then move up a level) and deals the next
problem. The answer helpers here (LaTeX ``$`` stripping, ``\\boxed{}`` extraction, the
normalised comparison) are the ones `InfiniteMathEnv` scores with. Run this file for an
interactive session in the terminal.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from atroposlib.utils.reasoning_text import text_after_thinking

try:
    from .curriculum import MathCurriculum
except ImportError:  # run as a script: import the package from the repository root
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from environments.infinimath.curriculum import MathCurriculum


def strip_latex_delimiters(text: str) -> str:
    """`text` with ``$...$`` math delimiters removed (their content kept)."""
    return re.sub(r"\$(.*?)\$", r"\1", text)


def extract_boxed(text: str) -> Optional[str]:
    """The content of the first ``\\boxed{...}`` in `text` (nested braces allowed), or None."""
    start = text.find("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for index in range(begin, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            if depth == 0:
                return text[begin:index]
            depth -= 1
    return None


def clean_for_comparison(text: str) -> str:
    """Answer text reduced for comparison: no LaTeX commands, commas, spaces or ``$``; lower case."""
    cleaned = re.sub(r"\\[a-zA-Z]+", "", text)
    cleaned = re.sub(r"[,\s$]", "", cleaned)
    return cleaned.lower()


def final_answer(response: str) -> str:
    """What a reply answers: the first ``\\boxed{}`` after ``</think>``, else the last line there."""
    after = text_after_thinking(response).strip()
    boxed = extract_boxed(after)
    if boxed:
        return boxed
    lines = after.splitlines()
    return lines[-1].strip() if lines else after


def answers_match(response: str, solution: str) -> bool:
    """Whether `response` answers `solution` (compared after `clean_for_comparison`)."""
    return clean_for_comparison(final_answer(response)) == clean_for_comparison(strip_latex_delimiters(solution))


class InfiniteMath:
    """One learner's practice session: a current problem, attempts left, and the curriculum."""

    def __init__(self, starting_level: int = 1, progress_threshold: float = 0.8, min_evaluations: int = 5,
                 max_attempts_per_problem: int = 3) -> None:
        self.curriculum = MathCurriculum(starting_level=starting_level, progress_threshold=progress_threshold,
                                         min_evaluations=min_evaluations)
        self.max_attempts = max_attempts_per_problem
        self.current_problem: Optional[str] = None
        self.current_solution: Optional[str] = None
        self.current_generator_id: Optional[int] = None
        self.attempts_remaining = 0
        self.total_problems = 0
        self.correct_problems = 0
        self._generate_problem()

    def _generate_problem(self) -> None:
        problem, solution, generator_id = self.curriculum.get_problem()
        self.current_problem = strip_latex_delimiters(problem)
        self.current_solution = strip_latex_delimiters(solution)
        self.current_generator_id = generator_id
        self.attempts_remaining = self.max_attempts

    def get_state(self) -> dict[str, Any]:
        return {
            "problem": self.current_problem,
            "attempts_remaining": self.attempts_remaining,
            "current_level": self.curriculum.get_current_level(),
            "total_levels": self.curriculum.get_num_levels(),
            "level_description": self.curriculum.get_level_description(),
            "total_problems": self.total_problems,
            "correct_problems": self.correct_problems,
            "accuracy": self.correct_problems / max(1, self.total_problems),
        }

    def submit_answer(self, answer: str) -> dict[str, Any]:
        """Check `answer` (plain text or a reply with ``\\boxed{}``); on a right answer or the
        last attempt, record the result and move on to a new problem."""
        if self.current_problem is None:
            return {"error": "no problem is active; call reset()"}
        correct = answers_match(str(answer), self.current_solution or "")
        self.attempts_remaining -= 1
        finished = correct or self.attempts_remaining <= 0
        result: dict[str, Any] = {
            "is_correct": correct,
            "correct_answer": self.current_solution if finished else None,
            "attempts_remaining": self.attempts_remaining,
        }
        if finished:
            self.total_problems += 1
            self.correct_problems += int(correct)
            self.curriculum.record_performance(self.current_generator_id, correct)
            advanced = self.curriculum.advance_difficulty()
            result["did_advance_level"] = advanced
            if advanced:
                result["new_level"] = self.curriculum.get_current_level()
                result["level_description"] = self.curriculum.get_level_description()
            self._generate_problem()
            result["new_problem"] = self.current_problem
        return result

    def reset(self, level: Optional[int] = None) -> dict[str, Any]:
        """Start over (at `level`, clearing the curriculum's record, when given)."""
        if level is not None:
            self.curriculum.reset(level)
        self.total_problems = self.correct_problems = 0
        self._generate_problem()
        return self.get_state()

    def get_difficulty_stats(self) -> dict[int, dict[str, Any]]:
        stats = {}
        for level in self.curriculum.DIFFICULTY_LEVELS:
            rate = self.curriculum.get_success_rate(level)
            stats[level] = {
                "description": self.curriculum.get_level_description(level),
                "problems_attempted": len(self.curriculum.performance_history.get(level, [])),
                "success_rate": rate if rate is not None else float("nan"),
                "is_current_level": level == self.curriculum.get_current_level(),
            }
        return stats


def main() -> None:
    """Practise in the terminal: q quits, r resets (optionally to another level)."""
    session = InfiniteMath()
    print(f"InfiniteMath, level {session.curriculum.get_current_level()}: {session.curriculum.get_level_description()}")
    while True:
        state = session.get_state()
        print(f"\nLevel {state['current_level']}/{state['total_levels']} | {state['attempts_remaining']} tries left")
        print(state["problem"])
        answer = input("answer (q: quit, r: reset) > ").strip()
        if answer.lower() == "q":
            break
        if answer.lower() == "r":
            level = input("level 1-7 (Enter: keep) > ").strip()
            session.reset(int(level) if level.isdigit() and 1 <= int(level) <= 7 else None)
            continue
        result = session.submit_answer(answer)
        print("right" if result["is_correct"] else "wrong")
        if result.get("correct_answer") is not None and not result["is_correct"]:
            print(f"the answer was {result['correct_answer']}")
        if result.get("did_advance_level"):
            print(f"up to level {result['new_level']}: {result['level_description']}")
    print(f"\n{session.correct_problems} of {session.total_problems} solved")
    for level, stats in session.get_difficulty_stats().items():
        if stats["problems_attempted"]:
            print(f"level {level}: {stats['success_rate']:.0%} of the last results ({stats['problems_attempted']} tried)")


if __name__ == "__main__":
    main()
