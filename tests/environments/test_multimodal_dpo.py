"""multimodal_dpo (ocr_vqa, clevr_cogen_a_train, clevr_complex): offline `process` runs on the
fixture images against a scripted server, their scoring, the groups' ``images``, and
`view-run-multimodal --jsonl` finding a written group's image and prompt."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest
from PIL import Image

from tests.environments.harness import ENVIRONMENTS, process_groups
from tests.environments.scripted_inference import ScriptedInference

HERE = ENVIRONMENTS / "multimodal_dpo"
FIXTURES = ENVIRONMENTS / "fixtures"


def _module(name: str) -> ModuleType:
    """A module of environments/multimodal_dpo, registered under the bare name its siblings import."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


image_qa = _module("image_qa")
generate_fixtures = _module("generate_fixtures")

ENVS = ["ocr_vqa", "clevr_cogen_a_train", "clevr_complex"]


def fixture_rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / name / "train.jsonl").read_text().splitlines()]


def question_and_gold(name: str, row: dict[str, Any]) -> tuple[str, str]:
    if name == "ocr_vqa":
        return row["questions"][0], row["answers"][0]
    return row["problem"], row["solution"].replace("<answer>", "").replace("</answer>", "").strip()


def golds(name: str) -> dict[str, str]:
    return dict(question_and_gold(name, row) for row in fixture_rows(name))


def in_format(name: str, answer: str) -> str:
    if name == "ocr_vqa":
        return f"Reading the cover, the answer is <answer>{answer}</answer>"
    return f"Looking at the scene carefully, the answer is \\boxed{{{answer}}}"


def scripted(name: str, replies: Callable[[str, int], str]) -> Callable[[str, int], str]:
    """Answers choice `index` of the fixture question in the prompt with ``replies(gold, index)``."""
    table = golds(name)

    def answer(prompt: str, index: int) -> str:
        question = max((q for q in table if q in prompt), key=len)
        return replies(table[question], index)
    return answer


def decoded_question(name: str, group: dict[str, Any], tokenizer: Any) -> str:
    text = tokenizer.decode(group["tokens"][0])
    return max((q for q in golds(name) if q in text), key=len)


def fixture_image(name: str, question: str) -> Image.Image:
    row = next(r for r in fixture_rows(name) if question_and_gold(name, r)[0] == question)
    return Image.open(FIXTURES / name / row["image"]).convert("RGB")


def run(name: str, tmp_path: Path, tokenizer_dir: Path, replies: Callable[[str, int], str], steps: int = 2,
        group_size: int = 4) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from transformers import AutoTokenizer

    with ScriptedInference(scripted(name, replies), AutoTokenizer.from_pretrained(str(tokenizer_dir))) as server:
        groups = process_groups(f"multimodal_dpo/{name}.py", tmp_path, server.url, tokenizer_dir,
                                "--env.train_file", str(FIXTURES / name / "train.jsonl"),
                                steps=steps, group_size=group_size)
    return groups, server.requests


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


@pytest.mark.parametrize("name", ENVS)
def test_process_scores_right_and_wrong_answers_and_carries_the_image(
        name: str, tmp_path: Path, tokenizer_dir: Path, tokenizer: Any) -> None:
    def replies(gold: str, index: int) -> str:
        return [in_format(name, gold), in_format(name, "certainly not this"),
                in_format(name, f"  {gold.upper()} "), in_format(name, gold + " 7")][index % 4]

    groups, requests = run(name, tmp_path, tokenizer_dir, replies)
    assert len(groups) == 2
    for group in groups:
        assert group["scores"] == [1.0, -1.0, 1.0, -1.0]
        question = decoded_question(name, group, tokenizer)
        expected = fixture_image(name, question)
        assert len(group["images"]) == 4 and len(set(group["images"])) == 1
        image = Image.open(io.BytesIO(base64.b64decode(group["images"][0])))
        assert image.format == "PNG" and image.convert("RGB").tobytes() == expected.tobytes()
        # Trained tokens are the reply: the prompt is masked.
        first_trained = next(i for i, m in enumerate(group["masks"][0]) if m != -100)
        assert question in tokenizer.decode(group["tokens"][0][:first_trained])
    assert len(requests) == 2
    for body in requests:
        system, user = body["messages"]
        assert system["role"] == "system" and ("<answer>" in system["content"] if name == "ocr_vqa"
                                               else "\\boxed{" in system["content"])
        kinds = [part["type"] for part in user["content"]]
        assert kinds == ["text", "image_url"]
        url = user["content"][1]["image_url"]["url"]
        assert url.startswith("data:image/png;base64,") and url.split(",", 1)[1] in {g["images"][0] for g in groups}
        assert body["n"] == 4 and body["max_tokens"] == (512 if name == "ocr_vqa" else 2048)


def test_clevr_needs_the_boxed_format_and_ocr_takes_tags_or_the_bare_reply(tmp_path: Path, tokenizer_dir: Path) -> None:
    def clevr(gold: str, index: int) -> str:  # right, but only the boxed ones count
        return [f"\\boxed{{{gold}}} is what I count here", f"I count {gold} of them, so the answer is {gold}",
                f"<answer>{gold}</answer> is what I count"][index % 3]

    groups, _ = run("clevr_cogen_a_train", tmp_path / "clevr", tokenizer_dir, clevr, group_size=3)
    assert [g["scores"] for g in groups] == [[1.0, -1.0, -1.0]] * 2

    def ocr(gold: str, index: int) -> str:  # a bare reply is read whole: it counts only when it is the answer
        return [f"\n\n{gold}\n\n", "<answer>nobody you know</answer>", f"The cover says {gold}"][index % 3]

    groups, _ = run("ocr_vqa", tmp_path / "ocr", tokenizer_dir, ocr, group_size=3)
    assert [g["scores"] for g in groups] == [[1.0, -1.0, -1.0]] * 2


def test_replies_too_short_to_train_on_leave_the_group(tmp_path: Path, tokenizer_dir: Path) -> None:
    def replies(gold: str, index: int) -> str:
        return [in_format("clevr_complex", gold), "\\boxed{1}", in_format("clevr_complex", "many")][index % 3]

    groups, _ = run("clevr_complex", tmp_path, tokenizer_dir, replies, group_size=3)
    assert len(groups) == 2
    for group in groups:
        assert group["scores"] == [1.0, -1.0] and len(group["images"]) == 2
        assert group["group_overrides"]["group_size"] == 2


@pytest.mark.parametrize(("reply", "answer"), [
    ("so \\boxed{3}", "3"), ("\\boxed{2} then \\boxed{ Yes }", "Yes"), ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("3", None), ("\\boxed{3", None),
])
def test_boxed_takes_the_last_complete_box(reply: str, answer: Any) -> None:
    assert image_qa.boxed(reply) == answer


@pytest.mark.parametrize(("reply", "gold", "right"), [
    ("<answer>Mara Ellison</answer>", "Mara Ellison", True), ("<ANSWER> mara  ellison </ANSWER>", "Mara Ellison", True),
    ("Mara Ellison", "Mara Ellison", True), ("It is Mara Ellison", "Mara Ellison", False),
    ("<answer></answer>", "", False), ("<answer>Yes</answer> <answer>No</answer>", "yes", True),
])
def test_ocr_answers_match_ignoring_case_and_spacing(reply: str, gold: str, right: bool) -> None:
    assert image_qa.same_answer(image_qa.tagged_or_raw(reply), gold) is right


def test_a_written_group_shows_in_view_run_multimodal(tmp_path: Path, tokenizer_dir: Path, tokenizer: Any) -> None:
    from atroposlib.cli.view_run import _jsonl_feed
    from atroposlib.cli.viewer_images import group_image, text_prompt
    from atroposlib.cli.viewer_render import view_group

    def replies(gold: str, index: int) -> str:
        return in_format("clevr_cogen_a_train", gold if index == 0 else "12")

    run("clevr_cogen_a_train", tmp_path, tokenizer_dir, replies, steps=1, group_size=2)
    feed = _jsonl_feed(str(tmp_path / "clevr_cogen_a_train_groups.jsonl"), tokenizer)  # what --jsonl reads
    group = feed[0].group
    view = view_group(group, tokenizer)
    question = decoded_question("clevr_cogen_a_train", group, tokenizer)
    image = group_image(group, view.prompt)
    assert image is not None
    assert image.convert("RGB").tobytes() == fixture_image("clevr_cogen_a_train", question).tobytes()
    assert question in text_prompt(view.prompt)
    assert [c.score for c in view.completions] == [1.0, -1.0]
    assert "\\boxed{12}" in view.completions[1].text


def test_local_images_may_be_paths_records_or_bytes(tmp_path: Path) -> None:
    picture = Image.new("RGB", (6, 4), (10, 200, 30))
    picture.save(tmp_path / "p.png")
    raw = (tmp_path / "p.png").read_bytes()
    for value in ("p.png", str(tmp_path / "p.png"), {"bytes": raw, "path": None}, {"bytes": None, "path": "p.png"},
                  raw, picture, Image.new("CMYK", (6, 4))):
        decoded = Image.open(io.BytesIO(base64.b64decode(image_qa.png_base64(value, tmp_path))))
        assert decoded.format == "PNG" and decoded.size == (6, 4)
    with pytest.raises(FileNotFoundError):
        image_qa.png_base64("missing.png", tmp_path)


def test_the_fixtures_are_the_generators_output(tmp_path: Path) -> None:
    generate_fixtures.main(tmp_path)
    for name in ENVS:
        assert (tmp_path / name / "train.jsonl").read_text() == (FIXTURES / name / "train.jsonl").read_text()
        for row in fixture_rows(name):
            made, shipped = Image.open(tmp_path / name / row["image"]), Image.open(FIXTURES / name / row["image"])
            assert made.size == shipped.size


@pytest.mark.parametrize("name", ENVS)
def test_config_init_matches_atropos(name: str) -> None:
    import runpy

    module = runpy.run_path(str(HERE / f"{name}.py"))
    env_cls = next(v for v in module.values() if isinstance(v, type) and getattr(v, "name", None) == name)
    env_config, servers = env_cls.config_init()
    assert (env_config.tokenizer_name, env_config.group_size, env_config.max_token_length, env_config.wandb_name,
            env_config.batch_size, env_config.max_num_workers, env_config.train_file) == (
        "Qwen/Qwen2-VL-2B-Instruct", 8, 2048, name, 12, 2, None)
    assert [(s.model_name, s.base_url) for s in servers] == [("Qwen/Qwen2-VL-2B-Instruct", "http://localhost:9001/v1")]
