"""Environment files written for transformers 4 get token-id lists from chat templates, in
``process`` and ``serve``, while files written for transformers 5 keep their dict answers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from atroposlib.envs.chat_template_ids import ChatTokenIds, keep_transformers4_chat_ids
from tests.conftest import registration
from tests.helpers import ApiProcess

ENV_FILE = Path(__file__).parent / "atropos_style" / "chat_ids_env.py"
CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path):
    return keep_transformers4_chat_ids(AutoTokenizer.from_pretrained(str(tokenizer_dir)))


def test_a_plain_tokenizing_call_gives_ids_that_also_answer_dict_lookups(tokenizer) -> None:
    ids = tokenizer.apply_chat_template(CHAT)
    assert isinstance(ids, ChatTokenIds) and all(isinstance(token, int) for token in ids)
    assert json.loads(json.dumps(ids)) == list(ids) and ids[1:] == list(ids)[1:]
    assert ids["input_ids"] == ids.input_ids == list(ids)
    assert ids["attention_mask"] == [1] * len(ids) and set(ids.keys()) == {"input_ids", "attention_mask"}
    batched = tokenizer.apply_chat_template([CHAT, CHAT[:1]])
    assert [list(row) for row in batched] == [list(ids), list(tokenizer.apply_chat_template(CHAT[:1]))]


def test_calls_that_choose_their_answer_get_what_transformers_gives(tokenizer) -> None:
    assert isinstance(tokenizer.apply_chat_template(CHAT, tokenize=False), str)
    as_dict = tokenizer.apply_chat_template(CHAT, return_dict=True)
    assert not isinstance(as_dict, list) and as_dict["input_ids"] == list(tokenizer.apply_chat_template(CHAT))
    assert type(tokenizer.apply_chat_template(CHAT, return_dict=False)) is list


def scripted_flags(tokenizer_dir: Path, inference_url: str, tmp_path: Path) -> list[str]:
    return ["--env.tokenizer_name", str(tokenizer_dir), "--openai.base_url", inference_url,
            "--openai.model_name", "fake-model", "--env.use_wandb", "false", "--env.spool_dir", str(tmp_path / "spool")]


def test_the_transformers4_file_writes_its_groups_in_process(tokenizer_dir: Path, inference_url: str,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "groups.jsonl"
    result = subprocess.run([sys.executable, str(ENV_FILE), "process", *scripted_flags(tokenizer_dir, inference_url,
                                                                                       tmp_path),
                             "--env.data_path_to_save_groups", str(out), "--env.total_steps", "2"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2
    for group in groups:
        assert all(len(tokens) == len(masks) and masks[0] == -100 for tokens, masks in zip(group["tokens"],
                                                                                         group["masks"]))


def test_the_transformers4_file_feeds_the_api_in_serve(tokenizer_dir: Path, inference_url: str,
                                                       tmp_path: Path) -> None:
    with ApiProcess(tmp_path / "state") as api:
        httpx.post(api.url + "/register", json=registration(4)).raise_for_status()
        httpx.get(api.url + "/batch")
        flags = scripted_flags(tokenizer_dir, inference_url, tmp_path) + [
            "--env.rollout_server_url", api.url, "--env.total_steps", "1000", "--env.max_num_workers", "2"]
        with open(tmp_path / "env.log", "wb") as log:
            env = subprocess.Popen([sys.executable, str(ENV_FILE), "serve", *flags], cwd=tmp_path, stdout=log,
                                   stderr=subprocess.STDOUT)
            try:
                served: list[dict] = []
                deadline = time.monotonic() + 90
                while len(served) < 2 and time.monotonic() < deadline:
                    served += httpx.get(api.url + "/batch").json()["batch"] or []
                    time.sleep(0.2)
                assert len(served) >= 2, (tmp_path / "env.log").read_text()[-3000:]
                assert all(len(group["tokens"]) == 2 for group in served)
            finally:
                env.send_signal(signal.SIGTERM)
                assert env.wait(60) == 0, (tmp_path / "env.log").read_text()[-3000:]
