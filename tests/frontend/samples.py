"""Scored groups as `process` mode writes them: GSM8K questions, four sampled answers each.

A right answer scores 1, a wrong one 0, and one without the ``#### <answer>`` line -0.5
(a format penalty), so the groups cover all-right, all-wrong and mixed scores.
"""

from __future__ import annotations

from typing import Any

SYSTEM = "You are a careful math tutor. Reason step by step, then give the final answer as `#### <number>`."

# (question, right working, wrong working); each working ends in its answer.
PROBLEMS = [
    ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
     "How many clips did Natalia sell altogether in April and May?",
     "In May she sold half of April's clips:\n\n- April: **48**\n- May: `48 / 2 = 24`\n\nTotal: 48 + 24 = 72\n\n#### 72",
     "She sold 48 in April and twice as many in May: `48 * 2 = 96`.\n\nTotal: 48 + 96 = 144\n\n#### 144"),
    ("Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
     "How much did she earn?",
     "Per minute she earns `12 / 60 = 0.2` dollars.\n\nFor 50 minutes: 0.2 x 50 = **10** dollars.\n\n#### 10",
     "She worked 50 minutes, so roughly one hour: **$12**.\n\n#### 12"),
    ("Betty is saving money for a new wallet which costs $100. Betty has only half of the money she needs. "
     "Her parents decided to give her $15 for that purpose, and her grandparents twice as much as her parents. "
     "How much more money does Betty need to buy the wallet?",
     "| source | amount |\n|---|---:|\n| Betty | 50 |\n| parents | 15 |\n| grandparents | 30 |\n\n"
     "She has 95, so she still needs 100 - 95 = **5**.\n\n#### 5",
     "Betty has 50 and her parents give 15, so she needs 100 - 65 = 35.\n\n#### 35"),
    ("Julie is reading a 120-page book. Yesterday, she was able to read 12 pages and today, she read twice as "
     "many pages as yesterday. If she wants to read half of the remaining pages tomorrow, how many pages "
     "should she read?",
     "```python\nread = 12 + 2 * 12\nremaining = 120 - read\nprint(remaining // 2)\n```\n\n"
     "She has read 36 pages, 84 remain, half of that is **42**.\n\n#### 42",
     "Half of the book is 60 pages, minus the 12 she read: 48.\n\n#### 48"),
    ("James writes a 3-page letter to 2 different friends twice a week. How many pages does he write a year?",
     "Each week: 3 pages x 2 friends x 2 times = 12 pages.\n\nA year has 52 weeks: 12 x 52 = **624**.\n\n#### 624",
     "<think>3 pages, 2 friends, twice a week... 3 x 2 = 6 per week</think>\n\n"
     "6 pages a week for 52 weeks is 312.\n\n#### 312"),
    ("Albert is wondering how much pizza he can eat in one day. He buys 2 large pizzas and 2 small pizzas. "
     "A large pizza has 16 slices and a small pizza has 8 slices. If he eats it all, how many pieces does he eat "
     "that day?",
     "1. Large: 2 x 16 = 32 slices\n2. Small: 2 x 8 = 16 slices\n\nAltogether **48** slices.\n\n#### 48",
     "2 large and 2 small pizzas: 16 + 8 = 24 slices.\n\n#### 24"),
]
# Per group, what each of its four rollouts is: R(ight), W(rong) or U(nformatted).
PATTERNS = ["RWRR", "WWWW", "RRRR", "RWWU", "WUWW", "RRWR"]
SCORES = {"R": 1.0, "W": 0.0, "U": -0.5}


def _answer(kind: str, right: str, wrong: str) -> str:
    if kind == "U":
        return right.rsplit("\n\n####", 1)[0] + "\n\nSo that is my answer."
    return right if kind == "R" else wrong


def gsm8k_groups() -> list[dict[str, Any]]:
    """Six groups of four chat rollouts with their scores."""
    groups = []
    for (question, right, wrong), pattern in zip(PROBLEMS, PATTERNS):
        messages = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question},
                     {"role": "assistant", "content": _answer(kind, right, wrong)}] for kind in pattern]
        groups.append({"messages": messages, "scores": [SCORES[kind] for kind in pattern]})
    return groups
