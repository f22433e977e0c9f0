"""AutoTokenizer's choice of class, remembered: same tokenizer, faster start, no torch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from atroposlib.envs import tokenizer_class_memo
from atroposlib.envs.tokenizer_class_memo import load_with_memo, memo_key, memo_path
from atroposlib.envs.tokenizer_loading import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "What is 2 + 3? ünï"}, {"role": "assistant", "content": "5"}]


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def declaring(tokenizer_dir: Path, folder: Path, tokenizer_class: str) -> Path:
    """A copy of the test tokenizer whose tokenizer_config.json names `tokenizer_class`."""
    shutil.copytree(tokenizer_dir, folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = tokenizer_class
    config_file.write_text(json.dumps(config))
    return folder


def assert_same_tokenizer(expected: object, got: object) -> None:
    assert type(got) is type(expected)
    text = "Hello world, 12+34 = 46\n\n  ünïcode"
    assert got(text)["input_ids"] == expected(text)["input_ids"]
    assert got.apply_chat_template(MESSAGES, tokenize=False) == expected.apply_chat_template(MESSAGES, tokenize=False)
    assert got.special_tokens_map == expected.special_tokens_map and got.name_or_path == expected.name_or_path


@pytest.mark.parametrize("declared", ["PreTrainedTokenizerFast", "Qwen2Tokenizer", "LlamaTokenizerFast"])
def test_the_remembered_class_gives_what_autotokenizer_gives(tokenizer_dir: Path, tmp_path: Path,
                                                            declared: str) -> None:
    # LlamaTokenizerFast over a byte-level tokenizer.json is one where AutoTokenizer does not
    # load the class the file names: the memo must hold its choice, not the file's word.
    folder = declaring(tokenizer_dir, tmp_path / declared, declared)
    expected = AutoTokenizer.from_pretrained(str(folder))
    first, second = load_with_memo(str(folder)), load_with_memo(str(folder))
    assert_same_tokenizer(expected, first)
    assert_same_tokenizer(expected, second)
    remembered = json.loads(memo_path().read_text())
    assert remembered[memo_key(str(folder))].endswith(type(expected).__name__)


def test_changed_files_are_a_new_key(tokenizer_dir: Path, tmp_path: Path) -> None:
    folder = declaring(tokenizer_dir, tmp_path / "changing", "PreTrainedTokenizerFast")
    before = memo_key(str(folder))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "Qwen2Tokenizer"}))
    assert memo_key(str(folder)) != before
    assert memo_key(str(tmp_path / "nothing-here")) is None


def test_a_broken_or_unwritable_memo_costs_only_speed(tokenizer_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    memo_path().parent.mkdir(parents=True)
    memo_path().write_text("{not json")
    assert load_with_memo(str(tokenizer_dir)).encode("hello")
    key = memo_key(str(tokenizer_dir))
    memo_path().write_text(json.dumps({key: "transformers.no_such_module.NoSuchTokenizer"}))
    assert load_with_memo(str(tokenizer_dir)).encode("hello")
    monkeypatch.setattr(tokenizer_class_memo, "memo_path", lambda: tmp_path / "file" / "under-a-file.json")
    (tmp_path / "file").write_text("a file, not a folder")
    assert load_with_memo(str(tokenizer_dir)).encode("hello")


def test_a_remembered_class_that_fails_falls_back_to_autotokenizer(tokenizer_dir: Path) -> None:
    key = memo_key(str(tokenizer_dir))
    memo_path().parent.mkdir(parents=True)
    # a class that cannot load these files (it wants a sentencepiece model)
    memo_path().write_text(json.dumps({key: "transformers.models.t5.tokenization_t5.T5Tokenizer"}))
    assert_same_tokenizer(AutoTokenizer.from_pretrained(str(tokenizer_dir)), load_tokenizer(str(tokenizer_dir)))


def test_the_second_start_imports_neither_autotokenizer_nor_torch(tokenizer_dir: Path, tmp_path: Path) -> None:
    probe = ("import sys; from atroposlib.envs.tokenizer_loading import load_tokenizer; "
             f"load_tokenizer({str(tokenizer_dir)!r}); "
             "print(sorted(m for m in ('torch', 'transformers.models.auto.tokenization_auto') if m in sys.modules))")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                           check=True).stdout.strip() for _ in range(2)]
    assert "tokenization_auto" in runs[0]
    assert runs[1] == "[]"
