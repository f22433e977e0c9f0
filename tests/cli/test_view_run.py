"""`view-run`: rendering of groups (escaping, trained span, best score), the feed, the command
line, and the real app in headless Chromium, from a JSONL file and against a live `run-api`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from atroposlib.cli import view_run
from atroposlib.cli.batch_source import Batch, ToolRefused
from atroposlib.cli.viewer_feed import Entry, GroupFeed, batch_fetcher, latest_example_fetcher
from atroposlib.cli.viewer_render import (
    Completion, GroupView, Segment, completion_html, decode_segments, status_html, token_runs, view_group,
)
from tests.browser import artifact_path
from tests.cli.viewer_helpers import HOSTILE, ViewerProcess, make_group, require_gradio, write_jsonl
from tests.conftest import registration
from tests.doc_commands import readme_arguments
from tests.helpers import ApiProcess

VIEWPORT = {"width": 1280, "height": 800}


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


# -- rendering -------------------------------------------------------------------------------

def test_token_runs_split_where_trainedness_changes() -> None:
    assert token_runs([-100, -100, 5, 6, -100, 7]) == [(0, 2, False), (2, 4, True), (4, 5, False), (5, 6, True)]
    assert token_runs([]) == []


def test_trained_span_is_the_masked_tokens_and_pieces_join_up(tokenizer: Any) -> None:
    group = make_group(tokenizer, "What is 2 + 2?", ["The answer is 4.", "The answer is 5."], [1.0, 0.0])
    view = view_group(group, tokenizer)
    assert view.prompt == "<|user|>What is 2 + 2?<|end|><|assistant|>"
    assert [c.text for c in view.completions] == ["The answer is 4.<|end|>", "The answer is 5.<|end|>"]
    assert view.completions[0].segments == (Segment("The answer is 4.<|end|>", True),)
    # A tool's reply inside the completion is not trained: it is its own, unmarked, piece.
    tokens, mask = group["tokens"][0], list(group["masks"][0])
    start = mask.count(-100) + 2
    mask[start:start + 2] = [-100, -100]
    segments = decode_segments(tokenizer, tokens, mask)
    assert "".join(s.text for s in segments) == tokenizer.decode(tokens)
    assert [s.trained for s in segments] == [False, True, False, True]


def test_a_character_split_across_runs_stays_whole(tokenizer: Any) -> None:
    tokens = tokenizer("Hello é there", add_special_tokens=False)["input_ids"]
    text = tokenizer.decode(tokens)
    cut = next(i for i in range(1, len(tokens)) if "\ufffd" in tokenizer.decode(tokens[:i]))  # mid-"é"
    segments = decode_segments(tokenizer, tokens, [-100] * cut + [1] * (len(tokens) - cut))
    assert "".join(s.text for s in segments) == text and "\ufffd" not in text


def test_model_text_is_escaped_and_trained_text_marked() -> None:
    html_text = completion_html(Completion((Segment("ok ", False), Segment(HOSTILE, True)), 1.0))
    assert "<script" not in html_text and "<img" not in html_text
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in html_text
    assert re.search(r'<mark class="vr-trained">&lt;script&gt;.*</mark>', html_text)
    assert "(empty completion)" in completion_html(Completion((), 0.0))


def test_status_line_escapes_and_summarises_scores() -> None:
    view = GroupView("p", (Completion((), 1.0), Completion((), 0.0)), env_id="<b>x</b>")
    line = status_html(view, 1, 5, "<i>batch</i>")
    assert "Group 2 of 5" in line and "&lt;b&gt;x&lt;/b&gt;" in line and "&lt;i&gt;batch&lt;/i&gt;" in line
    assert "min 0 / mean 0.5 / max 1" in line and "<b>x" not in line


@pytest.mark.parametrize(("scores", "best"), [
    ([0.0, 1.0, 0.5], {1}), ([1.0, 0.2, 1.0], {0, 2}), ([0.5, 0.5], set()), ([None, 2.0, 1.0], {1}),
])
def test_best_is_the_highest_score_when_scores_differ(scores: list, best: set) -> None:
    view = GroupView("", tuple(Completion((), score) for score in scores))
    assert view.best() == best


def test_the_prompt_stops_where_training_starts(tokenizer: Any) -> None:
    view = view_group(make_group(tokenizer, "Say hello.", ["Hello there", "Hello"], [1.0, 0.0]), tokenizer)
    assert view.prompt == "<|user|>Say hello.<|end|><|assistant|>"
    assert [c.text for c in view.completions] == ["Hello there<|end|>", "Hello<|end|>"]


def test_groups_without_a_tokenizer_are_shown_from_their_messages() -> None:
    group = {"scores": [1.0, 0.0], "messages": [
        [{"role": "user", "content": "Hi <b>"}, {"role": "assistant", "content": "Hello"}],
        [{"role": "user", "content": "Hi <b>"}, {"role": "assistant", "content": [{"type": "text", "text": "Yo"}]}],
    ]}
    view = view_group(group)
    assert view.prompt == "user: Hi <b>\n\nassistant: "
    assert [c.text for c in view.completions] == ["Hello\n\n", "Yo\n\n"]
    assert "messages" in view.note
    with pytest.raises(ValueError, match="no messages"):
        view_group({"tokens": [[1]], "scores": [1.0]})


# -- the feed --------------------------------------------------------------------------------

class FakeSource:
    """Stands in for `ApiBatchSource`: hands out queued batches and records acks."""

    def __init__(self, batches: list[list[dict]], latest: Any = None) -> None:
        self.batches, self.latest, self.acked = batches, latest, []

    def next_batch(self, timeout: float) -> Batch:
        if not self.batches:
            raise TimeoutError
        return Batch(self.batches.pop(0), batch_id=f"lease{len(self.acked)}")

    def ack(self, batch: Batch) -> None:
        self.acked.append(batch.batch_id)

    def latest_example(self) -> Any:
        if isinstance(self.latest, Exception):
            raise self.latest
        return self.latest


def test_batches_are_kept_whole_and_acknowledged() -> None:
    source = FakeSource([[{"id": 1}, {"id": 2}], [{"id": 3}]])
    feed = GroupFeed(fetch=batch_fetcher(source, 0.1))  # type: ignore[arg-type]
    assert feed.fetch_more() == (0, "took batch 1: 2 groups")
    assert feed.fetch_more() == (2, "took batch 2: 1 groups")
    assert [feed[i].origin for i in range(3)] == ["batch 1", "batch 1", "batch 2"]
    assert source.acked == ["lease0", "lease1"]
    first, message = feed.fetch_more()
    assert first is None and "no batch is ready" in message and len(feed) == 3


def test_attached_feed_peeks_and_adds_a_group_once() -> None:
    source = FakeSource([], latest=None)
    feed = GroupFeed(fetch=latest_example_fetcher(source))  # type: ignore[arg-type]
    assert feed.fetch_more() == (None, "the API has not queued a group yet")
    source.latest = {"tokens": [[1]], "scores": [1.0]}
    assert feed.fetch_more()[0] == 0
    assert feed.fetch_more() == (None, "no newer group since the last one shown")
    source.latest = ToolRefused("cannot reach the trajectory API")
    assert feed.fetch_more() == (None, "cannot reach the trajectory API")
    assert GroupFeed([Entry({}, "f")]).fetch_more()[0] is None


# -- the command line ------------------------------------------------------------------------

def test_gradio_is_imported_only_by_the_app() -> None:
    code = ("import sys, atroposlib.cli, atroposlib.cli.view_run, atroposlib.cli.view_run_multimodal; "
            "print('gradio' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_without_gradio_one_line_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "gradio", None)
    assert view_run.main(["--jsonl", "missing.jsonl"]) == 2
    err = capsys.readouterr().err
    assert err == "view-run: the viewer needs Gradio: pip install 'atroposlib[examples]'\n"


def test_a_bad_jsonl_file_is_one_line(tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_gradio()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"scores": [1]}\n')
    assert view_run.main(["--jsonl", str(bad), "--tokenizer", str(tokenizer_dir)]) == 2
    assert capsys.readouterr().err.strip().endswith("bad.jsonl:1 is not a scored group (it needs scores, and tokens "
                                                    "or messages)")


def test_without_tokenizer_or_messages_a_file_cannot_be_shown(tmp_path: Path, tokenizer: Any,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    require_gradio()
    path = write_jsonl(tmp_path / "run.jsonl", [make_group(tokenizer, "Hi", ["Hello"], [1.0])])
    assert view_run.main(["--jsonl", str(path), "--tokenizer", str(tmp_path / "missing") + "/"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("view-run: no tokenizer folder at") and "showing groups from their messages" in err[0]
    assert err[1] == f"view-run: no tokenizer to decode {path}, and its groups have no messages (see --tokenizer)"


@pytest.mark.parametrize("flags", [["--jsonl", "x", "--attach"], ["--attach", "--reset"], ["--group-size", "0"]])
def test_contradictory_flags_are_usage_errors(flags: list[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        view_run.main(flags)
    assert stopped.value.code == 2


# -- the app in a browser --------------------------------------------------------------------

@pytest.fixture(scope="module")
def jsonl_viewer(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any,
                 tokenizer_dir: Path) -> Iterator[ViewerProcess]:
    """One `view-run --jsonl` for the module's browser tests (Gradio takes a while to start)."""
    require_gradio()
    folder = tmp_path_factory.mktemp("view-run")
    path = write_jsonl(folder / "run.jsonl", [
        make_group(tokenizer, "What is 2 + 2?", ["The answer is 4.", "The answer is 5.", "Hello there", ""],
                   [1.0, -1.0, 0.25, 0.0], env_id=3),
        make_group(tokenizer, "Compute 12 times 3.", ["Answer: 36", HOSTILE], [1.0, 0.0], env_id=4),
        make_group(tokenizer, "Say hello.", ["Hello there", "Hello"], [0.5, 0.5], env_id=3),
    ])
    readme = readme_arguments("console-tools", "view-run", {"data/addition.jsonl": str(path), " --port 7860": ""},
                              MODEL=str(tokenizer_dir))
    with ViewerProcess(folder, *readme) as viewer:
        assert viewer.process is not None and viewer.process.poll() is None, viewer.log()
        yield viewer


def _status(page: Any) -> str:
    return page.inner_text("#vr-status")


def _wait_for_status(page: Any, text: str) -> None:
    try:
        page.wait_for_function("t => (document.querySelector('#vr-status') || {}).innerText?.includes(t)", arg=text,
                               timeout=30000)
    except Exception as exc:  # playwright's TimeoutError: say what the page showed instead
        shown = page.evaluate("() => (document.querySelector('#vr-status') || {}).innerText")
        raise AssertionError(f"the status never showed {text!r}; it shows {shown!r}") from exc


def _score(page: Any, slot: int) -> Any:
    return page.locator(".vr-score").nth(slot)


def test_the_page_shows_every_group_with_scores_best_and_trained_span(jsonl_viewer: ViewerProcess,
                                                                      browser: Any) -> None:  # noqa: F811
    page = browser.new_page(viewport=VIEWPORT)
    page.goto(jsonl_viewer.url)
    _wait_for_status(page, "Group 1 of 3")
    assert "env 3" in _status(page) and "scores min -1 / mean 0.0625 / max 1" in _status(page)
    assert page.locator("#vr-prompt textarea").input_value() == "<|user|>What is 2 + 2?<|end|><|assistant|>"
    completions = page.locator(".vr-completion").all_inner_texts()
    assert completions == ["The answer is 4.<|end|>", "The answer is 5.<|end|>", "Hello there<|end|>", "<|end|>"]
    assert page.locator(".block.vr-best .vr-completion").all_inner_texts() == ["The answer is 4.<|end|>"]
    assert page.locator(".block.vr-score.vr-best").locator("input, textarea").input_value() == "1"
    assert "Score_1 (best)" in _score(page, 0).inner_text()
    assert page.locator(".vr-completion mark.vr-trained").first.inner_text() == "The answer is 4.<|end|>"
    page.screenshot(path=str(artifact_path("view-run-jsonl.png")))

    page.get_by_role("button", name="Next group").click()
    _wait_for_status(page, "Group 2 of 3")
    assert "env 4" in _status(page)
    assert page.locator(".vr-completion").all_inner_texts()[1] == HOSTILE + "<|end|>"
    assert page.evaluate("window.__pwned") is None
    assert not _score(page, 2).is_visible()  # a group of two leaves the other rows hidden
    page.screenshot(path=str(artifact_path("view-run-hostile.png")))

    page.get_by_role("button", name="Next group").click()
    _wait_for_status(page, "Group 3 of 3")
    assert page.locator(".block.vr-best").count() == 0  # equal scores: nobody is best
    assert page.get_by_role("button", name="Next group").is_disabled()
    page.get_by_role("button", name="Previous group").click()
    _wait_for_status(page, "Group 2 of 3")
    assert page.evaluate("window.__pwned") is None
    page.close()


# -- against a live run-api ------------------------------------------------------------------

def _queue(api: ApiProcess) -> dict[str, Any]:
    status = httpx.get(api.url + "/status").json()
    return {key: status[key] for key in ("queue_size", "queue_sequences", "leased_batches", "batches_served")}


def test_live_api_consumes_when_free_refuses_a_trainer_and_attaches_without_taking(
        tmp_path: Path, tokenizer: Any, tokenizer_dir: Path, browser: Any) -> None:  # noqa: F811
    require_gradio()
    common = ["--tokenizer", str(tokenizer_dir)]
    with ApiProcess(None, "--ephemeral") as free, ApiProcess(None, "--ephemeral") as training:
        for i in range(8):  # 8 groups of 2 = one batch of the viewer's registered size (2 x 8)
            group = make_group(tokenizer, f"What is {i} + {i}?", [f"The answer is {2 * i}.", "Hello"], [1.0, 0.0])
            assert httpx.post(free.url + "/scored_data", json=group).status_code == 200
        assert httpx.post(training.url + "/register", json=registration(batch_size=32)).status_code == 200
        for i in range(3):
            group = make_group(tokenizer, f"Say hello {i}.", ["Hello there", "Hello"], [1.0, 0.5])
            assert httpx.post(training.url + "/scored_data", json=group).status_code == 200
        before = _queue(training)
        consumer = ViewerProcess(tmp_path, "--api-url", free.url, *common)
        attached = ViewerProcess(tmp_path, "--api-url", training.url, "--attach", *common)
        try:
            consumer.launch(), attached.launch()
            refused = ViewerProcess(tmp_path, "--api-url", training.url, *common).start()
            assert refused.wait() == 2
            assert "a training run is registered" in refused.log() and "--attach" in refused.log()
            _check_consumer(consumer.start(), free, browser)
            _check_attached(attached.start(), training, browser)
            assert _queue(training) == before
            assert consumer.stop() == 143 and attached.stop() == 143
            assert _queue(free)["leased_batches"] == 0  # the batch prefetched after the ack went back
        finally:
            consumer.stop(), attached.stop()


def _check_consumer(viewer: ViewerProcess, api: ApiProcess, browser: Any) -> None:  # noqa: F811
    """No trainer: the viewer registered itself and takes a whole batch on request."""
    assert viewer.process is not None and viewer.process.poll() is None, viewer.log()
    # The button comes disabled and the page's load event enables it (the click waits for that):
    # a batch fetched before the load answered was hidden by the load's empty page.
    buttons = {c["props"].get("value"): c["props"] for c in httpx.get(viewer.url + "config").json()["components"]
               if c.get("type") == "button"}
    assert buttons["Grab Next Batch"]["interactive"] is False
    page = browser.new_page(viewport=VIEWPORT)
    page.goto(viewer.url)
    page.get_by_role("button", name="Grab Next Batch").click()
    _wait_for_status(page, "Group 1 of 8")
    assert "batch 1" in _status(page) and "What is 0 + 0?" in page.locator("#vr-prompt textarea").input_value()
    page.get_by_role("button", name="Next group").click()
    _wait_for_status(page, "Group 2 of 8")
    assert _queue(api)["batches_served"] == 1 and _queue(api)["queue_size"] == 0
    page.close()


def _check_attached(viewer: ViewerProcess, api: ApiProcess, browser: Any) -> None:  # noqa: F811
    """A trainer is registered: --attach shows the latest group and takes nothing."""
    assert viewer.process is not None and viewer.process.poll() is None, viewer.log()
    page = browser.new_page(viewport=VIEWPORT)
    page.goto(viewer.url)
    _wait_for_status(page, "Group 1 of 1")
    assert "latest example" in _status(page)
    assert "Say hello 2." in page.locator("#vr-prompt textarea").input_value()
    page.get_by_role("button", name="Show Latest Example").click()
    _wait_for_status(page, "no newer group")
    page.close()
