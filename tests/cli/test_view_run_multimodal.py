"""`view-run-multimodal`: finding a group's image (``images`` field, data URLs) and text prompt,
and the real app showing both in headless Chromium."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("PIL", reason="Pillow comes with the examples extra (Gradio)")
from PIL import Image  # noqa: E402

from atroposlib.cli.viewer_images import decode_image, group_image, text_prompt  # noqa: E402
from tests.browser import artifact_path  # noqa: E402
from tests.cli.viewer_helpers import HOSTILE, ViewerProcess, make_group, require_gradio, write_jsonl  # noqa: E402
from tests.doc_commands import readme_arguments  # noqa: E402


def png_base64(colour: str, size: tuple[int, int] = (24, 16)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def multimodal_content(question: str, colour: str) -> str:
    """A user turn as multimodal envs write it: JSON parts, the image as a data URL."""
    return json.dumps([{"type": "text", "text": question},
                       {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png_base64(colour)}"}}])


@pytest.mark.parametrize("value", [png_base64("red"), f"data:image/png;base64,{png_base64('red')}",
                                   Image.new("RGB", (24, 16), "red")])
def test_an_image_is_read_from_pil_base64_or_a_data_url(value: Any) -> None:
    image = decode_image(value)
    assert image is not None and image.size == (24, 16) and image.convert("RGB").getpixel((0, 0)) == (255, 0, 0)


@pytest.mark.parametrize("value", [None, "", "not base64!", base64.b64encode(b"no image").decode(), 42])
def test_what_is_not_an_image_gives_none(value: Any) -> None:
    assert decode_image(value) is None


def test_the_images_field_comes_first_then_messages_then_the_prompt() -> None:
    red, blue, green = png_base64("red"), png_base64("blue"), png_base64("green")
    in_messages = {"messages": [[{"role": "user", "content": multimodal_content("Q", "blue")}]]}
    prompt = f'... "url": "data:image/jpeg;base64,{green}" ...'  # the bytes are a PNG: PIL reads them anyway
    assert group_image({"images": [[red]], **in_messages}, prompt).getpixel((0, 0)) == (255, 0, 0)
    assert group_image({"images": [None], **in_messages}, prompt).getpixel((0, 0)) == (0, 0, 255)
    assert group_image({}, prompt).getpixel((0, 0)) == (0, 128, 0)
    assert group_image({}, f"data:image/gif;base64,{blue} is not looked for") is None


@pytest.mark.parametrize(("prompt", "expected"), [
    ('<|user|>[{"type": "text", "text": "What \\"colour\\" is it?"}, {"type": "image_url"}]', 'What "colour" is it?'),
    ("<|user|>[Image] Describe the picture.", "Describe the picture."),
    (f"<|user|>look data:image/png;base64,{png_base64('red')} here", "<|user|>look [image data] here"),
])
def test_the_text_prompt_is_the_text_part_or_follows_the_image(prompt: str, expected: str) -> None:
    assert text_prompt(prompt) == expected


@pytest.fixture(scope="module")
def multimodal_viewer(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Iterator[ViewerProcess]:
    from transformers import AutoTokenizer

    require_gradio()
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    folder = tmp_path_factory.mktemp("view-run-multimodal")
    path = write_jsonl(folder / "images.jsonl", [
        make_group(tokenizer, "[Image] What colour is the square?", ["Red.", "Blue."], [1.0, 0.0],
                   images=[png_base64("red", (64, 48))]),
        make_group(tokenizer, multimodal_content("Which colour is this?", "blue"), ["Blue.", HOSTILE], [1.0, 0.0]),
    ])
    readme = readme_arguments("console-tools", "view-run-multimodal", {"data/clevr_cogen_a_train.jsonl": str(path)})
    with ViewerProcess(folder, *readme, "--tokenizer", str(tokenizer_dir),
                       module="atroposlib.cli.view_run_multimodal") as viewer:
        assert viewer.process is not None and viewer.process.poll() is None, viewer.log()
        yield viewer


IMAGE = "document.querySelector('#vr-image img')"


def _wait_for_image(page: Any, width: int, height: int) -> None:
    """Until the page shows a loaded image of this size."""
    page.wait_for_function(f"([w, h]) => {{ const i = {IMAGE}; return i && i.complete && i.naturalWidth === w "
                           "&& i.naturalHeight === h; }", arg=[width, height], timeout=30000)


def test_the_page_shows_the_image_and_the_text_prompt(multimodal_viewer: ViewerProcess,
                                                      browser: Any) -> None:  # noqa: F811
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(multimodal_viewer.url)
    page.wait_for_function("() => document.querySelector('#vr-status')?.innerText.includes('Group 1 of 2')",
                           timeout=30000)
    # The text after [Image], as Atropos shows it (the chat template's closing markup included).
    assert page.locator("#vr-prompt textarea").input_value() == "What colour is the square?<|end|><|assistant|>"
    _wait_for_image(page, 64, 48)
    assert page.locator(".block.vr-best .vr-completion").all_inner_texts() == ["Red.<|end|>"]
    page.screenshot(path=str(artifact_path("view-run-multimodal.png")))

    page.get_by_role("button", name="Next group").click()
    page.wait_for_function("() => document.querySelector('#vr-status')?.innerText.includes('Group 2 of 2')",
                           timeout=30000)
    page.wait_for_function("() => document.querySelector('#vr-prompt textarea').value === 'Which colour is this?'",
                           timeout=30000)
    _wait_for_image(page, 24, 16)
    assert page.locator(".vr-completion").all_inner_texts()[1] == HOSTILE + "<|end|>"
    assert page.evaluate("window.__pwned") is None
    page.close()
