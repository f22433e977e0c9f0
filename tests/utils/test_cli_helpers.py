"""Namespaced-model helpers of atroposlib.utils.cli."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from atroposlib.utils.cli import (
    adjust_model_defaults,
    extract_namespace,
    get_double_dash_flags,
    get_prefixed_pydantic_model,
    merge_dicts,
)


class Settings(BaseModel):
    size: int = Field(default=4, description="how many")
    tags: list[str] = Field(default_factory=list)


def test_prefixed_model_and_namespace() -> None:
    prefixed = get_prefixed_pydantic_model(Settings, "env.")
    assert prefixed.__name__ == "Env.Settings" and set(prefixed.model_fields) == {"env.size", "env.tags"}
    assert prefixed.model_fields["env.size"].description == "how many"
    assert extract_namespace({"env.size": 2, "openai.x": 1}, "env.") == {"size": 2}
    with pytest.raises(TypeError):
        extract_namespace(3, "env.")


def test_merge_and_defaults() -> None:
    left = {"a": {"b": 1, "c": 2}}
    assert merge_dicts(left, {"a": {"c": 3}}, {"d": 4}) == {"a": {"b": 1, "c": 3}, "d": 4}
    assert left == {"a": {"b": 1, "c": 2}}
    adjusted = adjust_model_defaults(Settings, {"size": 8, "tags": None})
    assert adjusted.__name__ == "SettingsWithDefaults" and adjusted().size == 8 and adjusted().tags == []


def test_double_dash_flags() -> None:
    assert get_double_dash_flags(["serve", "--env.group_size", "8", "--slurm", "--custom=1"]) == {
        "env.group_size": "8", "slurm": "true", "custom": "1"}
