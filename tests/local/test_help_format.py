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
    assert (args.groups, args.group_size, args.max_tokens, args.dtype) == (8, 8, 128, "auto")


def test_help_runs_from_the_command_line() -> None:
    for module in ("atroposlib.local.quickstart", "atroposlib.local.prepare_model"):
        result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True)
        assert result.returncode == 0 and "(default: " in result.stdout, result.stderr
    result = subprocess.run([sys.executable, "-m", "atroposlib.local.vllm_service", "serve", "--help"],
                            capture_output=True, text=True)
    assert result.returncode == 0 and "(default: auto)" in result.stdout
