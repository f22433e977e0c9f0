"""Every flag of atropos-quickstart, atropos-vllm (both commands) and atropos-prepare-model
has help text, and the help shows every default there is."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from atroposlib.local import prepare_model, quickstart, vllm_service


def _parsers() -> list[argparse.ArgumentParser]:
    found = []
    for parser in (quickstart.build_parser(), vllm_service.build_parser(), prepare_model.build_parser()):
        found.append(parser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                found.extend(action.choices.values())
    return found


@pytest.mark.parametrize("parser", _parsers(), ids=lambda parser: parser.prog)
def test_each_flag_is_explained_with_its_default(parser: argparse.ArgumentParser) -> None:
    text = " ".join(parser.format_help().split())
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        assert action.help and action.help.strip(), action.dest
        if action.default not in (None, False):
            assert f"(default: {action.default})" in text, action.dest
    assert "(default: None)" not in text and "(default: False)" not in text


def test_the_quickstart_defaults_are_the_documented_job() -> None:
    args = quickstart.parse_args([])
    assert (args.task, args.groups, args.group_size, args.max_tokens, args.dtype) == ("small_sums", 8, 8, 32, "auto")
    assert args.env_file == quickstart.REPO_ROOT / "environments" / "small_sums_env.py"


def test_gsm8k_is_one_flag_away_and_keeps_its_own_budget() -> None:
    args = quickstart.parse_args(["--task", "gsm8k"])
    assert (args.max_tokens, args.env_file.name) == (128, "gsm8k_server.py")
    args = quickstart.parse_args(["--task", "gsm8k", "--max-tokens", "64", "--env-file", "my_env.py"])
    assert (args.max_tokens, str(args.env_file)) == (64, "my_env.py")


def test_an_unknown_task_is_a_one_line_error() -> None:
    result = subprocess.run([sys.executable, "-m", "atroposlib.local.quickstart", "--task", "chess"],
                            capture_output=True, text=True)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == "error: unknown task 'chess' (--task is one of small_sums, gsm8k)\n"


def test_help_runs_from_the_command_line() -> None:
    for module in ("atroposlib.local.quickstart", "atroposlib.local.prepare_model"):
        result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True)
        assert result.returncode == 0 and "(default: " in result.stdout, result.stderr
    result = subprocess.run([sys.executable, "-m", "atroposlib.local.vllm_service", "serve", "--help"],
                            capture_output=True, text=True)
    assert result.returncode == 0 and "(default: auto)" in result.stdout
