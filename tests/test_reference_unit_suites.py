"""Atropos 0.4.0's own unit tests of inference servers, the ManagedServer, its proxy, tool
calls and `tokenize_for_trainer` pass, unmodified, against this project.

Environments' own tests are written the same way (`ServerHarness`, mock tokenizers,
patched module attributes), so these suites check that such tests keep working. Only tests
that need a GPU, an API key or the internet may skip. ``test_reasoning_models.py`` also
imports ``environments.eval_environments.eval_helpers`` from the repository root.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.reference_tests import (
    REPO,
    TRANSFORMERS4_PYTHON,
    copy_reference_tests,
    offline_hub_cache,
    reference_tests_dir,
    run_reference_tests,
    set_eos_token,
)
from tests.tokenizer_fixture import build_tokenizer

SERVER_SUITES = [
    "test_managed_server.py", "test_managed_server_proxy.py", "test_tool_call_translator.py",
    "test_trl_vllm_server.py", "test_server_logprobs.py", "test_openai_api_workarounds.py",
]
TOKENIZE_SUITE = "test_utils/test_tokenize_for_trainer.py"
REASONING_SUITE = "test_reasoning_models.py"
# The hub tokenizer that suite loads (gated; its fallback is used when it cannot load).
TOKENIZE_SUITE_TOKENIZER = "meta-llama/Llama-3.2-1B-Instruct"
OFFLINE = {"HF_HUB_OFFLINE": "1"}  # no hub here: fail at once instead of retrying for a minute


def _reference_source() -> Path:
    source = reference_tests_dir()
    if source is None:
        pytest.skip("reference atroposlib 0.4.0 not installed (bench/setup_reference.sh)")
    return source


@pytest.mark.slow
def test_reference_server_suites_pass(tmp_path: Path) -> None:
    package = copy_reference_tests(_reference_source(), SERVER_SUITES, tmp_path)
    result = run_reference_tests(package, env=OFFLINE)
    assert not result.failed, f"{result.summary()}; failed: {result.failed}\n{result.output}"
    assert not result.disallowed_skips(), result.disallowed_skips()
    assert result.passed, result.summary()


@pytest.mark.slow
def test_reference_tokenize_for_trainer_suite_passes(tmp_path: Path) -> None:
    """The suite calls ``apply_chat_template`` itself and compares token lists, which
    transformers 5 returns as a mapping: it runs in the transformers 4 venv that
    scripts/test.sh builds. The Llama 3.2 Instruct tokenizer it asks for is not reachable
    offline; a small local tokenizer of the same shape (its end-of-turn token is also its
    end-of-sequence token) stands in for it under that name in a private hub cache."""
    if not TRANSFORMERS4_PYTHON.exists():
        pytest.skip(f"no transformers 4 venv at {TRANSFORMERS4_PYTHON} (scripts/test.sh builds it)")
    package = copy_reference_tests(_reference_source(), [TOKENIZE_SUITE], tmp_path)
    tokenizer = build_tokenizer(tmp_path / "tokenizer")
    set_eos_token(tokenizer, "<|end|>")
    cache = offline_hub_cache(tmp_path / "hub", TOKENIZE_SUITE_TOKENIZER, tokenizer)
    result = run_reference_tests(package, python=TRANSFORMERS4_PYTHON, env={**OFFLINE, "HF_HUB_CACHE": str(cache)})
    assert not result.failed, f"{result.summary()}; failed: {result.failed}\n{result.output}"
    assert result.passed == ["reftests.test_tokenize_for_trainer::test_tokenize_for_trainer_mask_len_last_turn_only"]


@pytest.mark.slow
def test_reference_reasoning_models_suite_passes(tmp_path: Path) -> None:
    """ReasoningConfig, BaseEnvConfig's reasoning fields and eval_helpers' Hermes prompts and
    reasoning extraction; the suite finds ``environments`` on the path, as from a checkout."""
    package = copy_reference_tests(_reference_source(), [REASONING_SUITE], tmp_path)
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    result = run_reference_tests(package, env={**OFFLINE, "PYTHONPATH": path})
    assert not result.failed, f"{result.summary()}; failed: {result.failed}\n{result.output}"
    assert not result.disallowed_skips(), result.disallowed_skips()
    assert len(result.passed) >= 12, result.summary()
