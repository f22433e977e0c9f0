"""The configuration reference names every flag `run-api` has."""

from __future__ import annotations

from pathlib import Path

import pytest

from atroposlib.api.settings import ApiSettings

ROOT = Path(__file__).resolve().parent.parent


def test_config_md_documents_every_run_api_flag() -> None:
    text = (ROOT / "CONFIG.md").read_text()
    for name in ApiSettings.model_fields:
        assert f"`--{name.replace('_', '-')}`" in text, name


def test_readme_has_the_two_quickstart_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert "## Quickstart" in text
    assert "bash scripts/test.sh" in text


def test_config_md_documents_every_environment_flag() -> None:
    from atroposlib.envs.config import BaseEnvConfig
    from atroposlib.envs.server_handling.configs import APIServerConfig, ServerManagerConfig

    text = (ROOT / "CONFIG.md").read_text()
    for prefix, model in (("env.", BaseEnvConfig), ("openai.", APIServerConfig), ("", ServerManagerConfig)):
        for name in model.model_fields:
            assert f"`--{prefix}{name}`" in text, prefix + name


def test_config_md_documents_every_trainer_flag() -> None:
    import argparse

    pytest.importorskip("torch")
    from example_trainer.cli import create_full_parser

    text = (ROOT / "CONFIG.md").read_text()
    for action in create_full_parser()._actions:
        if action.help != argparse.SUPPRESS and action.option_strings and action.dest != "help":
            assert f"`{action.option_strings[0]}`" in text, action.option_strings[0]


@pytest.mark.parametrize("module", ["sft", "dpo", "view_run", "inference_node_wandb_watcher"])
def test_config_md_documents_every_tool_flag(module: str) -> None:
    import argparse
    import importlib

    parser = importlib.import_module(f"atroposlib.cli.{module}").build_parser()
    text = (ROOT / "CONFIG.md").read_text()
    for action in parser._actions:
        if action.help != argparse.SUPPRESS and action.option_strings and action.dest != "help":
            assert f"`{action.option_strings[0]}`" in text, (module, action.option_strings[0])
