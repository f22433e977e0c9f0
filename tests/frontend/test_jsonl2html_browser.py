"""The generated page in headless Chromium: what a person sees, the controls, the keys, and
that model output never runs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from atroposlib.frontend.jsonl2html import generate_html
from tests.browser import artifact_path
from tests.frontend.samples import gsm8k_groups

VIEWPORT = {"width": 1280, "height": 800}


def write_page(path: Path, groups: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(group) + "\n" for group in groups))
    return generate_html(path)


@pytest.fixture
def open_page(browser: Any) -> Iterator[Any]:
    """Opens a generated page and waits until its script is ready; fails on any page error."""
    pages, errors = [], []

    def load(path: Path, timeout: float = 30) -> Any:
        page = browser.new_page(viewport=VIEWPORT)
        page.on("pageerror", lambda error: errors.append(error))
        pages.append(page)
        page.goto(path.as_uri(), wait_until="load", timeout=timeout * 1000)
        page.wait_for_function("document.body.dataset.ready === '1'", timeout=timeout * 1000)
        return page

    yield load
    for page in pages:
        page.close()
    assert not errors, errors


def shown_order(page: Any) -> list[int]:
    return page.evaluate("Array.from(document.querySelectorAll('details.group:not([hidden])'), d => +d.dataset.index)")


def test_scores_summary_sort_filter_and_keys(open_page: Any, tmp_path: Path) -> None:
    page = open_page(write_page(tmp_path / "gsm8k.jsonl", gsm8k_groups()))
    fact = lambda name: page.locator(f'[data-fact="{name}"]').inner_text()  # noqa: E731
    assert (fact("groups"), fact("rollouts"), fact("mean score")) == ("6", "24", "0.4167")
    assert fact("groups whose scores differ") == "4 (67%)"
    assert page.locator(".histogram title").all_text_contents() == [
        "-0.5: 2 rollouts", "0: 11 rollouts", "1: 11 rollouts"]
    # Scores are on the summary lines, before any group is opened.
    summary = page.locator("#group-3 > summary").inner_text().split()
    assert summary == ["Group", "3", "4", "rollouts", "min", "-0.5", "mean", "0.125", "max", "1"]
    assert "all equal" in page.locator("#group-1 > summary").inner_text()
    assert not page.get_by_text("Natalia sold clips").first.is_visible()

    page.locator("#group-0 > summary").click()
    assert page.get_by_text("Natalia sold clips to 48").first.is_visible()
    assert page.locator("#group-0 .item.best").count() == 3
    assert "Reward: 0.0" in page.locator("#group-0-item-1").inner_text()
    page.locator("#group-0 > summary").click()

    page.select_option("#sort-key", "mean")
    page.select_option("#sort-order", "desc")
    assert shown_order(page) == [2, 0, 5, 3, 1, 4]
    page.check("#only-differing")
    assert shown_order(page) == [0, 5, 3, 4]
    assert page.locator("#shown-count").inner_text() == "4 of 6 groups shown"
    page.select_option("#filter-stat", "min")
    page.fill("#filter-low", "0")
    assert shown_order(page) == [0, 5] and page.locator("#shown-count").inner_text() == "2 of 6 groups shown"
    page.fill("#filter-low", "")
    page.uncheck("#only-differing")
    page.select_option("#sort-key", "index")
    page.select_option("#sort-order", "asc")
    assert shown_order(page) == [0, 1, 2, 3, 4, 5]

    state = "() => [document.querySelector('.group.current')?.id, document.querySelector('.item.active')?.id]"
    page.locator("h1").click()  # off the controls; the keys go on from group 0, clicked above
    page.keyboard.press("j")
    assert page.evaluate(state) == ["group-1", None]
    page.keyboard.press("Enter")
    assert page.locator("#group-1").evaluate("d => d.open")
    page.keyboard.press("ArrowDown")
    assert page.evaluate(state) == ["group-1", "group-1-item-0"]
    for _ in range(4):
        page.keyboard.press("ArrowDown")
    assert page.evaluate(state) == ["group-2", "group-2-item-0"]
    assert page.get_by_text("Betty is saving money").first.is_visible()
    page.keyboard.press("ArrowUp")
    assert page.evaluate(state) == ["group-1", "group-1-item-3"]
    page.keyboard.press("Enter")
    assert not page.locator("#group-1").evaluate("d => d.open")
    page.keyboard.press("k")
    assert page.evaluate(state) == ["group-0", None]
    assert page.locator("#group-4-item-0").count() == 0  # never opened: never built

    # The README's picture: the groups' scores, and the last group open with its best rollouts marked.
    page.reload()
    page.wait_for_function("document.body.dataset.ready === '1'")
    page.locator("#group-5 > summary").click()
    page.locator("#group-5-item-0").click()
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(artifact_path("jsonl2html.png")))


def test_hostile_rollout_is_shown_not_run(open_page: Any, tmp_path: Path) -> None:
    completion = ('Sure! <script>window.__pwned=1</script>\n\n<img src=x onerror="window.__pwned=1">\n\n'
                  "[click me](javascript:window.__pwned=1) </script><script>window.__pwned=1</script>")
    group = {"messages": [[{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": completion}],
                          "<svg onload=window.__pwned=1>"],
             "scores": [1, '<img src=x onerror="window.__pwned=1">']}
    page = open_page(write_page(tmp_path / "hostile.jsonl", [group]))
    page.locator("#group-0 > summary").click()
    rollout = page.locator("#group-0-item-0").inner_text()
    assert "<script>window.__pwned=1</script>" in rollout
    assert '<img src=x onerror="window.__pwned=1">' in rollout
    assert "<svg onload=window.__pwned=1>" in page.locator("#group-0-item-1").inner_text()
    assert 'Reward: <img src=x onerror="window.__pwned=1">' in page.locator("#group-0-item-1").inner_text()
    link = page.get_by_text("click me")
    assert link.get_attribute("href") is None
    link.click()
    page.keyboard.press("ArrowDown")
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.locator("#groups-container img, #groups-container svg, #groups-container script").count() == 0


@pytest.mark.slow
def test_ten_thousand_groups_load_and_respond(open_page: Any, tmp_path: Path) -> None:
    answers = [f"Step {k}: `{k} * 3 = {3 * k}`, so the answer is **{3 * k}**.\n\n#### {3 * k}" for k in range(40)]
    groups = [{"messages": [[{"role": "user", "content": f"What is {g % 40} * 3?"},
                             {"role": "assistant", "content": answers[(g + r) % 40]}] for r in range(4)],
               "scores": [float((g + r) % 40 == g % 40) if r else (g % 7) / 6 for r in range(4)]}
              for g in range(10_000)]
    path = write_page(tmp_path / "big.jsonl", groups)
    started = time.perf_counter()
    page = open_page(path, timeout=120)
    assert time.perf_counter() - started < 120  # a sanity bound: it takes seconds
    assert page.locator("#shown-count").inner_text() == "10,000 of 10,000 groups shown"
    assert page.locator('[data-fact="groups"]').inner_text() == "10,000"
    page.select_option("#sort-key", "max")
    page.select_option("#sort-order", "desc")
    assert shown_order(page)[:3] == [6, 13, 20]  # max 1 first, in file order
    page.fill("#filter-low", "0.1")  # on the mean
    assert page.locator("#shown-count").inner_text() == "5,713 of 10,000 groups shown"
    page.locator("h1").click()
    page.keyboard.press("j")
    page.keyboard.press("ArrowDown")
    assert page.evaluate("document.querySelector('.item.active').id") == "group-6-item-0"
    page.fill("#filter-low", "")
    page.locator("#group-9999 > summary").click()
    assert "What is 39 * 3?" in page.locator("#group-9999-item-0").inner_text()
