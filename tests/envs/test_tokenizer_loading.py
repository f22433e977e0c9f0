"""A tokenizer that cannot be loaded gives one line naming it and the fix, at once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from atroposlib.envs import tokenizer_loading
from atroposlib.envs.tokenizer_loading import TokenizerUnavailable, load_tokenizer
from tests.envs.conftest import ROOT, env_command
from tests.helpers import free_port


def test_a_local_folder_loads(tokenizer_dir: Path) -> None:
    assert load_tokenizer(str(tokenizer_dir)).encode("hello")


def test_missing_or_broken_folders_are_named(tmp_path: Path) -> None:
    with pytest.raises(TokenizerUnavailable, match=f"no tokenizer folder at {tmp_path}/absent"):
        load_tokenizer(str(tmp_path / "absent"))
    with pytest.raises(TokenizerUnavailable, match=f"cannot load the tokenizer in {tmp_path}"):
        load_tokenizer(str(tmp_path))


def test_an_unknown_model_gives_the_first_line_of_the_hub_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    def refuse(name: str, **kwargs: object) -> None:
        raise OSError(f"{name} is not a local folder and is not a valid model identifier\nmore\nlines")

    monkeypatch.setattr(tokenizer_loading, "_hub_problem", lambda endpoint: None)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", refuse)
    with pytest.raises(TokenizerUnavailable) as error:
        load_tokenizer("nobody/no-such-model")
    message = str(error.value)
    assert "\n" not in message and "'nobody/no-such-model'" in message
    assert "is not a valid model identifier" in message and "--env.tokenizer_name" in message


@pytest.mark.slow
@pytest.mark.parametrize("offline", [False, True])
def test_process_testing_without_a_reachable_hub_fails_at_once(offline: bool, tmp_path: Path) -> None:
    environment = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "WANDB_MODE": "disabled",
                   "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}  # nothing listens there: "offline"
    if offline:
        environment["HF_HUB_OFFLINE"] = "1"
    result = subprocess.run(env_command("process", "--testing", "--env.total_steps", "2"), cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, env=environment)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "tokenizer" in line]
    assert "'NousResearch/DeepHermes-3-Llama-3-3B-Preview'" in line and "--env.tokenizer_name" in line
    assert ("HF_HUB_OFFLINE is set" if offline else "cannot be reached") in line


@pytest.mark.parametrize("server_type", ["vllm", "trl"])
def test_a_server_without_a_loadable_tokenizer_names_the_openai_flag(server_type: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    from atroposlib.envs.server_handling.configs import APIServerConfig
    from atroposlib.envs.server_handling.trl_vllm_server import TrlVllmServer
    from atroposlib.envs.server_handling.vllm_server import VLLMServer

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    config = APIServerConfig(model_name="smollm2", base_url="http://127.0.0.1:9/v1", api_key="x",
                             server_type=server_type)
    server_class = VLLMServer if server_type == "vllm" else TrlVllmServer
    with pytest.raises(TokenizerUnavailable, match="'smollm2'.*--openai.tokenizer_name"):
        server_class(config).tokenizer  # vLLM's loads at first use, TRL's at once


def test_a_broken_tokenizer_found_at_first_use_stops_process_in_one_line(tokenizer_dir: Path, tmp_path: Path,
                                                                         inference_url: str) -> None:
    # the tokenizer loads after the first requests are out; its failure must still end the run
    # in one line, not as a failed group after another
    broken = tmp_path / "broken-tokenizer"
    shutil.copytree(tokenizer_dir, broken)
    (broken / "tokenizer.json").write_text("{not json")
    out = tmp_path / "groups.jsonl"
    result = subprocess.run(
        env_command("process", "--env.tokenizer_name", str(broken), "--openai.base_url", inference_url,
                    "--openai.model_name", "m", "--env.total_steps", "4", "--env.use_wandb", "false",
                    "--env.data_path_to_save_groups", str(out)),
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**os.environ, "WANDB_MODE": "disabled"})
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "a group failed" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "tokenizer" in line]
    assert f"cannot load the tokenizer in {broken}" in line
    assert not out.exists()


def test_building_an_environment_does_not_import_transformers(tokenizer_dir: Path) -> None:
    probe = ("import sys; from environments.arithmetic_env import ArithmeticEnv; "
             "from atroposlib.envs.server_handling.configs import APIServerConfig; "
             f"env = ArithmeticEnv(ArithmeticEnv.env_config_cls(tokenizer_name={str(tokenizer_dir)!r}, use_wandb=False), "
             "APIServerConfig(model_name='m', base_url='http://127.0.0.1:9/v1')); "
             "print('transformers' in sys.modules); print(len(env.tokenizer.encode('hi')) > 0)")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "WANDB_MODE": "disabled"})
    assert result.stdout.split() == ["False", "True"], result.stderr[-3000:]
