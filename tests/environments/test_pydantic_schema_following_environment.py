"""pydantic_schema_following_environment/: generation and editing tasks scored by Pydantic validation
(process and evaluate modes, offline, with the project's schemas), and error_introduction."""

from __future__ import annotations

import asyncio
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from transformers import AutoTokenizer

from atroposlib.envs.base import APIServerConfig
from environments.pydantic_schema_following_environment.error_introduction import (
    ErrorIntroductionConfig,
    ErrorType,
    generate_valid_data,
    introduce_error_for_pydantic,
    sample_matching,
)
from environments.pydantic_schema_following_environment.pydantic_schema_following_environment import (
    OutputContainerFormat,
    PydanticEnvConfig,
    PydanticSchemaFollowingEnv,
    StructuredOutputFormat,
    build_model,
)
from tests.environments.harness import ROOT, process_groups, run_cli
from tests.environments.scripted_inference import ScriptedInference

SCRIPT = "pydantic_schema_following_environment/pydantic_schema_following_environment.py"
TRAIN = ROOT / "environments" / "fixtures" / "pydantic_schema_following" / "train.jsonl"
ROWS = [json.loads(line) for line in TRAIN.read_text().splitlines()]
THINK = "<think>I list the fields the model needs and pick values that satisfy each constraint.</think>\n"
VALID: dict[str, dict[str, Any]] = {
    "LibraryBook": {"title": "Dune", "author": "Frank Herbert", "year": 1965, "genres": ["science fiction", "epic"]},
    "WeatherReading": {"station_id": "ALP-07", "temperature_c": 3.5, "humidity": 80, "condition": "cloudy",
                       "recorded_at": "2025-03-01T07:30:00"},
    "ShopOrder": {"order_id": "1b4e28ba-2fa1-41d2-883f-0016d3cca427", "customer": "Ada",
                  "lines": [{"sku": "A1", "quantity": 2, "unit_price": 3.5}, {"sku": "B2", "quantity": 1,
                                                                              "unit_price": 10.0}],
                  "status": "shipped"},
    "Recipe": {"name": "Leek soup", "servings": 4, "ingredients": {"leeks": "3", "stock": "1 litre"},
               "vegetarian": True, "prep_minutes": 40},
    "Employee": {"full_name": "Sam Lee", "department": "support", "salary": 52000.0, "manager_id": 17},
    "Meetup": {"title": "Python meetup", "starts": "2025-05-10", "ends": "2025-05-11",
               "attendees": ["Ana", "Ben", "Chloe"]},
}


def model_of(row: dict) -> Any:
    info = json.loads(row["verification_info"])
    return build_model(info["pydantic_config"], info["model_name"])


# -- writing documents the way a model would ------------------------------------------------------
def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)


def to_toml(data: dict) -> str:
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items()
             if not isinstance(v, dict) and not (isinstance(v, list) and v and isinstance(v[0], dict))]
    for key, value in data.items():
        if isinstance(value, dict):
            lines += [f"[{key}]"] + [f"{k} = {_toml_value(v)}" for k, v in value.items()]
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            for entry in value:
                lines += [f"[[{key}]]"] + [f"{k} = {_toml_value(v)}" for k, v in entry.items()]
    return "\n".join(lines)


def _xml_children(data: Any) -> str:
    if isinstance(data, dict):
        return "".join(f"<{k}>{_xml_children(v)}</{k}>" for k, v in data.items())
    if isinstance(data, list):
        return "".join(f"<item>{_xml_children(v)}</item>" for v in data)
    return str(data).lower() if isinstance(data, bool) else str(data)


def document(data: dict, structured: str, root: str) -> str:
    if structured == "json":
        return json.dumps(data, indent=2)
    if structured == "yaml":
        return yaml.safe_dump(data, sort_keys=False)
    if structured == "toml":
        return to_toml(data)
    return f"<{root}>{_xml_children(data)}</{root}>"


def contained(text: str, structured: str, container: str) -> str:
    if container == "tagged":
        return f"<{structured}_output>\n{text}\n</{structured}_output>"
    if container == "markdown":
        return f"```{structured}\n{text}\n```"
    return text


def request_formats(prompt: str) -> tuple[str, str, str]:
    structured = re.search(r"You write (\w+) data", prompt).group(1).lower()
    container = ("tagged" if f"<{structured}_output>" in prompt else
                 "markdown" if "Markdown code block" in prompt else "none")
    model = next(name for name in VALID if f"class {name}(BaseModel)" in prompt)
    return structured, container, model


def four_ways(prompt: str, index: int) -> str:
    """0: valid data as asked; 1: a required field missing; 2: no thinking block; 3: wrong container."""
    structured, container, model = request_formats(prompt)
    valid = document(VALID[model], structured, model)
    invalid = document({k: v for k, v in list(VALID[model].items())[1:]}, structured, model)
    wrong_container = "none" if container != "none" else "tagged"
    return [THINK + contained(valid, structured, container), THINK + contained(invalid, structured, container),
            "Straight to it.\n" + contained(valid, structured, container),
            THINK + contained(valid, structured, wrong_container)][index % 4]


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path):
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


@pytest.mark.parametrize("structured,container", [("json", "tagged"), ("yaml", "markdown"), ("toml", "none"),
                                                  ("xml", "tagged")])
def test_process_scores_schema_validity(structured: str, container: str, tmp_path: Path, tokenizer_dir: Path,
                                        tokenizer) -> None:
    with ScriptedInference(four_ways, tokenizer) as server:
        groups = process_groups(SCRIPT, tmp_path, server.url, tokenizer_dir, "--env.train_file", str(TRAIN),
                                "--env.eval_set_percentage", "0", "--env.allowed_structured_formats", structured,
                                "--env.allowed_container_formats", container, "--env.error_introduction_seed", "4",
                                steps=len(ROWS), group_size=4)
    assert len(groups) == len(ROWS)
    for group in groups:
        assert sorted(group["scores"]) == [0.0, 0.0, 0.0, 1.0]
        right = group["messages"][group["scores"].index(1.0)][-1]["content"]
        assert right.startswith(THINK) and "Straight to it" not in right
    editing = [r["prompt"] for r in server.requests if "does not validate against the Pydantic model" in r["prompt"]]
    assert len(editing) == sum(row["task_type"] == "editing" for row in ROWS)
    for prompt in editing:
        faulty = json.loads(re.search(r"Data:\n```json\n(.*?)\n```", prompt, re.DOTALL).group(1))
        row = next(r for r in ROWS if f"class {json.loads(r['verification_info'])['model_name']}(" in prompt)
        with pytest.raises(Exception):
            model_of(row).model_validate(faulty)


def test_evaluate_reports_average_and_perfect(tmp_path: Path, tokenizer_dir: Path, tokenizer) -> None:
    with ScriptedInference(lambda prompt, i: four_ways(prompt, 0), tokenizer) as server:
        run_cli(SCRIPT, "evaluate", "--env.tokenizer_name", str(tokenizer_dir), "--env.use_wandb", "false",
                "--env.train_file", str(TRAIN), "--env.eval_set_percentage", "0.5",
                "--env.data_dir_to_save_evals", str(tmp_path / "eval"), "--openai.base_url", f"{server.url}/v1",
                "--openai.model_name", "scripted", "--openai.tokenizer_name", str(tokenizer_dir))
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())["results"]["all"]
    assert metrics == {"eval/avg_score": 1.0, "eval/percent_perfect": 1.0}
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 and {s["structured_format"] for s in samples} <= {"json", "yaml", "toml"}
    assert all(r["temperature"] == 0.1 for r in server.requests)


def test_group_rules_and_length_penalty(tokenizer_dir: Path) -> None:
    config = PydanticEnvConfig(tokenizer_name=str(tokenizer_dir), group_size=2, use_wandb=False, debug_logging=False)
    env = PydanticSchemaFollowingEnv(config, [APIServerConfig(model_name="m", base_url="http://127.0.0.1:9/v1")],
                                     slurm=False)
    row = dict(ROWS[0], selected_structured_format=StructuredOutputFormat.JSON,
               selected_container_format=OutputContainerFormat.NONE)
    prompt = [{"role": "user", "content": "Give a LibraryBook."}]

    def group(*texts: str):
        rollouts = [{"messages": prompt + [{"role": "assistant", "content": text}], "finish_reason": "stop",
                     "dataset_item": row} for text in texts]
        return asyncio.run(env.score(rollouts))

    good, bad = THINK + json.dumps(VALID["LibraryBook"]), THINK + '{"title": "Dune"}'
    long_good = THINK + json.dumps(dict(VALID["LibraryBook"], genres=["science fiction"] * 12))
    # a token budget between the two: 75 % of it lies above the short answer and below the long one
    config.max_token_length = int(sum(len(env.tokenizer.encode(t)) for t in (good, long_good)) / 2 / 0.75)
    assert group(bad, bad) is None  # all wrong: no signal
    assert sorted(group(good, bad)["scores"]) == [0.0, 1.0]
    assert group(good, good)["scores"] == [1.0, 1.0]  # all right and short: kept as is
    assert group(long_good, long_good)["scores"] == [0.9, 0.9]  # all right, longer than 75 % of the budget


def test_valid_data_and_every_error_kind() -> None:
    produced = set()
    for row in ROWS:
        model = model_of(row)
        data = generate_valid_data(model, random.Random(1))
        model.model_validate(data)
        for kind in ErrorType:
            faulty = introduce_error_for_pydantic(data, model, ErrorIntroductionConfig([kind], seed=3))
            if faulty is not None:
                produced.add(kind)
                with pytest.raises(Exception):
                    model.model_validate(faulty)
    assert produced == set(ErrorType) - {ErrorType.EXTRA_FIELD}  # the fixture's models allow extra fields
    book = model_of(ROWS[0])
    data = generate_valid_data(book, random.Random(2))
    assert introduce_error_for_pydantic(data, book, ErrorIntroductionConfig(probability=0.0)) is None
    seeded = ErrorIntroductionConfig.from_env_config(["type_error", "required_field_missing", "no_such_error"],
                                                     max_errors_per_item=2, error_introduction_seed=9)
    assert seeded.error_types == [ErrorType.TYPE_ERROR, ErrorType.REQUIRED_FIELD_MISSING]
    assert introduce_error_for_pydantic(data, book, seeded) == introduce_error_for_pydantic(data, book, seeded)
    assert re.fullmatch(r"[A-Z]{3}-[0-9]{2}", sample_matching(r"^[A-Z]{3}-[0-9]{2}$", random.Random(0)))
