"""jsonl2html on a large file: this project vs atroposlib 0.4.0, and the page in a browser.

Writes a JSONL file of GSM8K-like groups (a system prompt, a question and a Markdown
answer a few hundred characters long per rollout; scores 0 or 1, some groups with a
partial-credit score), renders it with both implementations, each in a child process of
its own interpreter so neither pays for the other's imports, and prints the wall time of
`generate_html`, the peak memory of the process, the page size and the ratios. With
Playwright and Chromium present it then loads both pages headless and prints the time to
the `load` event (and, for this project's page, until its controls are ready).

    python bench/jsonl2html.py [--groups 10000] [--rollouts 8]
        [--reference-python .cache/refvenv/bin/python] [--no-browser]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REFERENCE_PYTHON = os.environ.get("ATROPOS_REFERENCE_PYTHON", str(ROOT / ".cache" / "refvenv" / "bin" / "python"))
CHROMIUM = os.environ.get("ATROPOS_CHROMIUM", "/usr/bin/chromium")
# Run in the child: `-I` keeps the working directory off sys.path, so each interpreter
# imports its own atroposlib.
RENDER = """
import resource, sys, time
from atroposlib.frontend.jsonl2html import generate_html
started = time.perf_counter()
generate_html(sys.argv[1], sys.argv[2])
print(time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
SYSTEM_PROMPT = "You are a careful math tutor. Think step by step, then give the final answer after ####."
NAMES = ["Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Ken", "Alexis", "Tina", "Randy"]
ITEMS = ["clips", "apples", "pages", "marbles", "cookies", "stickers", "books", "pencils"]


def problem(rng: random.Random) -> tuple[str, int]:
    """A two-step word problem and its answer."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    first, factor = rng.randint(12, 90), rng.randint(2, 5)
    question = (f"{name} sold {first} {item} in April, and then she sold {factor} times as many {item} in May. "
                f"How many {item} did {name} sell altogether in April and May?")
    return question, first + first * factor


def answer(rng: random.Random, question: str, truth: int) -> tuple[str, float]:
    """A Markdown-ish rollout for `question` (worded differently each time, as sampled text
    is) and its score: right, wrong or partly right."""
    first = int(question.split(" sold ")[1].split()[0])
    factor = truth // first - 1
    got = truth if rng.random() < 0.55 else truth + rng.choice([-first, first, 1, -1, 10])
    opener = rng.choice(["Let me work through this **step by step**.", "We need the total over *both* months.",
                         "First, find the May amount; then add April.", "Okay, so this is a two-step problem."])
    steps = [
        opener,
        f"1. In April: `{first}` items{rng.choice(['.', ' were sold.', ', as given.'])}",
        f"2. In May: `{first} * {factor} = {truth - first}` items, {rng.choice(['since', 'because', 'as'])} "
        f"May is {factor} times April.",
        f"3. Altogether: {first} + {truth - first} = **{got}**.",
    ]
    if rng.random() < 0.3:
        steps.append(f"```python\napril = {first}\nmay = april * {factor}\nprint(april + may)  # {got}\n```")
    if rng.random() < 0.4:
        steps.append(f"> Check: {got} - {first} = {got - first}, which should be {factor} x {first}.")
    steps.append(f"#### {got}")
    score = 1.0 if got == truth else (0.25 if rng.random() < 0.2 else 0.0)
    return "\n".join(steps), score


def write_groups(path: Path, groups: int, rollouts: int, seed: int = 0) -> None:
    """`groups` lines of `process`-mode JSONL (messages as chat lists, one score per rollout)."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as out:
        for _ in range(groups):
            question, truth = problem(rng)
            messages, scores = [], []
            for _ in range(rollouts):
                text, score = answer(rng, question, truth)
                messages.append([{"role": "system", "content": SYSTEM_PROMPT},
                                 {"role": "user", "content": question},
                                 {"role": "assistant", "content": text}])
                scores.append(score)
            group: dict[str, Any] = {"messages": messages, "scores": scores}
            out.write(json.dumps(group) + "\n")


def render(python: str, source: Path, target: Path) -> tuple[float, float]:
    """Seconds `generate_html` took under `python`, and the child's peak memory in MB."""
    result = subprocess.run([python, "-I", "-c", RENDER, str(source), str(target)],
                            capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise SystemExit(f"{python} failed:\n{result.stderr[-3000:]}")
    seconds, peak_kb = result.stdout.strip().splitlines()[-1].split()
    return float(seconds), int(peak_kb) / 1024


def browser_load(pages: dict[str, Path]) -> dict[str, tuple[float, float | None]]:
    """Per page: seconds to the `load` event, and to the page's own ready mark when it has one."""
    from playwright.sync_api import sync_playwright

    timings = {}
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                              args=["--no-sandbox", "--disable-gpu"])
        try:
            for name, path in pages.items():
                page = chromium.new_page(viewport={"width": 1280, "height": 800})
                started = time.perf_counter()
                page.goto(path.as_uri(), wait_until="load", timeout=600_000)
                loaded = time.perf_counter() - started
                ready = None
                if page.evaluate("() => 'ready' in document.body.dataset"):
                    page.wait_for_function("() => document.body.dataset.ready === '1'", timeout=600_000)
                    ready = time.perf_counter() - started
                timings[name] = (loaded, ready)
                page.close()
        finally:
            chromium.close()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--reference-python", default=DEFAULT_REFERENCE_PYTHON)
    parser.add_argument("--no-browser", action="store_true", help="skip the headless Chromium load times")
    args = parser.parse_args()
    if not Path(args.reference_python).exists():
        raise SystemExit(f"no reference interpreter at {args.reference_python}: run bench/setup_reference.sh")
    workdir = Path(tempfile.mkdtemp(prefix="atropos-jsonl2html-bench-"))
    source = workdir / "groups.jsonl"
    write_groups(source, args.groups, args.rollouts)
    print(f"{args.groups} groups x {args.rollouts} rollouts, {source.stat().st_size / 1e6:.1f} MB of JSONL in {workdir}")
    pages = {"this project": workdir / "ours.html", "atroposlib 0.4.0": workdir / "reference.html"}
    runs = {
        "this project": render(sys.executable, source, pages["this project"]),
        "atroposlib 0.4.0": render(args.reference_python, source, pages["atroposlib 0.4.0"]),
    }
    for name, (seconds, peak) in runs.items():
        print(f"{name:>17}: generate_html {seconds:6.2f} s, peak memory {peak:6.0f} MB, "
              f"page {pages[name].stat().st_size / 1e6:5.1f} MB")
    ours, reference = runs["this project"], runs["atroposlib 0.4.0"]
    print(f"time ratio (reference / this project): {reference[0] / ours[0]:.2f}x; "
          f"memory ratio: {reference[1] / ours[1]:.2f}x")
    if args.no_browser or not Path(CHROMIUM).exists():
        return
    for name, (loaded, ready) in browser_load(pages).items():
        extra = f", controls ready {ready:.2f} s" if ready is not None else ""
        print(f"{name:>17}: headless Chromium load event {loaded:.2f} s{extra}")


if __name__ == "__main__":
    main()
