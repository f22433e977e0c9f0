"""environments/README.md's shell variables (block offline-server-flags) complete the catalogue's
offline commands: with the tokenizer folder and the server URL replaced by the test's, the
arithmetic environment's offline command from the table, ``$SERVER`` split as the shell splits
it, writes its groups. (Block textworld-yaml runs in test_textworld_env.py.)"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.doc_blocks import ROOT, doc_block
from tests.environments.harness import run_cli
from tests.envs.conftest import start_fake_inference

README = "environments/README.md"
OFFLINE_COMMAND = re.compile(r"`(python environments/arithmetic_env\.py process \$SERVER[^`]*)`")


def _server_words(tokenizer_dir: Path, inference_url: str) -> list[str]:
    """The words ``$SERVER`` expands to once the block has run in bash."""
    block = doc_block(README, "offline-server-flags")
    block = block.replace("/path/to/model-or-tokenizer", str(tokenizer_dir)).replace("http://127.0.0.1:9001/v1",
                                                                                    inference_url)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block + 'printf "%s\\n" $SERVER'], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_server_variables_complete_the_offline_command(tokenizer_dir: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (offline,) = OFFLINE_COMMAND.findall((ROOT / README).read_text())
    python, script, mode, *flags = shlex.split(offline)
    inference, url = start_fake_inference()
    try:
        server = _server_words(tokenizer_dir, url)
        monkeypatch.chdir(tmp_path)  # the command writes data/arithmetic.jsonl where it runs
        run_cli(ROOT / script, mode, *[word for flag in flags for word in (server if flag == "$SERVER" else [flag])],
                "--env.spool_dir", str(tmp_path / "spool"))
    finally:
        inference.terminate()
        inference.wait(10)
    groups = [json.loads(line) for line in (tmp_path / "data" / "arithmetic.jsonl").read_text().splitlines()]
    assert len(groups) == int(flags[flags.index("--env.total_steps") + 1])
    assert all(set(group["scores"]) == {1.0, -1.0} for group in groups)  # the fake server: right, wrong, ...
