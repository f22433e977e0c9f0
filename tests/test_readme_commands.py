"""The README's named command blocks, run (scaled down where they take long) in the environment
of ``tests/doc_commands.py``: a mirror of the repository as working directory, ``.venv/bin``
first on ``PATH``, home and state folders in a temporary folder, W&B off.

Substitutions: ``8000`` (the API) becomes a free port; ``$MODEL`` is the test tokenizer folder
where a tokenizer is all the command needs; benchmarks get smaller sizes (``--rounds 3`` becomes
one round of 16 groups, 10,000 pages become 20, ``process`` runs 2 groups with no latency); the
quickstart makes 1 group of 2 rollouts of 16 tokens (``--groups 16`` becomes ``--groups 1``) into
a temporary folder, then block
model-folder runs in the clone. Blocks (or lines) run by a test that already starts the same
program, which reads them from the README:

* console-tools ``atropos-vllm serve``: tests/local/test_real_vllm.py (the real engine);
  ``atropos-grpo``: tests/example_trainer/test_trainers.py (tiny model, stand-in vLLM);
  ``view-run``, ``view-run-multimodal``: the viewers' fixtures in tests/cli;
  ``inference-node-wandb-watcher``: tests/cli/test_inference_node_wandb_watcher.py;
  ``atropos-quickstart``: the quickstart test here (``scripts/quickstart.sh`` runs it).
* training-commands: tests/example_trainer/test_end_to_end.py (the real engine, two steps; its
  ``run-api`` line is console-tools' first).
* pip-install: tests/envs/test_fresh_install.py (a fresh virtual environment).
* minimal-env, minimal-env-run, lease-loop: tests/test_doc_examples.py.

The benchmarks of blocks bench-weight-sync, bench-vllm-start, bench-vllm-restart, bench-learning-demo,
bench-trl-compare, bench-trl-compare-epyc, bench-trl-levers and bench-train-step take minutes even at
one update or one step (they start vLLM and train; the last two are the README's learning figures, run alone on an
idle machine), beyond CI's time budget: their test starts the script and checks that it knows
every flag of the command.
The real engine runs once here, for the quickstart.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from atroposlib.local.paths import atropos_home
from atroposlib.local.runtime import Runtime
from tests.cli.viewer_helpers import make_group, write_jsonl
from tests.doc_blocks import ROOT, doc_block
from tests.doc_commands import block_environment, command, command_line, command_lines, mirror_of_repository
from tests.helpers import free_port
from tests.real_engine import installed_runtime

_SCRIPTS_SECTION = (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1].split("\n[")[0]
SCRIPTS = dict(re.findall(r'^([\w-]+) = "([\w.:]+)"', _SCRIPTS_SECTION, re.MULTILINE))  # tomllib needs Python 3.11
REFERENCE_PYTHON = ROOT / ".cache" / "refvenv" / "bin" / "python"


def _run_in_process(program: str, args: list[str]) -> int:
    """The console script `program` ([project.scripts]) called with `args` here; its exit status."""
    module, _, function = SCRIPTS[program].partition(":")
    try:
        returned = getattr(importlib.import_module(module), function)(args)
    except SystemExit as ended:
        return ended.code if isinstance(ended.code, int) else (0 if ended.code is None else 1)
    return returned if isinstance(returned, int) else 0


def _bash(script: str, cwd: Path, environment: dict[str, str],
          timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=environment, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _failure(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit status {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"


# -- console tools ----------------------------------------------------------------------------

def test_every_console_script_has_a_line() -> None:
    programs = [shlex.split(line, comments=True)[0] for line in command_lines("README.md", "console-tools")]
    assert sorted(programs) == sorted([*SCRIPTS, "atropos-vllm"]), "a line per console script (atropos-vllm: two)"


def test_run_api_serves_on_its_port_and_keeps_state_in_the_users_data_dir(tmp_path: Path) -> None:
    # the same command is terminal 1 of the training commands
    assert command("README.md", "training-commands", "run-api") == command("README.md", "console-tools", "run-api")
    port = free_port()
    line = command_line("README.md", "console-tools", "run-api", {"8000": str(port)})
    server = subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=mirror_of_repository(tmp_path / "work"),
                              env=block_environment(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        deadline = time.monotonic() + 60
        while not _answers(f"http://127.0.0.1:{port}/health"):
            assert server.poll() is None and time.monotonic() < deadline, server.communicate(timeout=10)[0]
            time.sleep(0.1)
        server.send_signal(signal.SIGTERM)
        output = server.communicate(timeout=30)[0]
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode in (0, -signal.SIGTERM) and "Application shutdown complete" in output, output
    assert list((tmp_path / "home" / ".local" / "share").rglob("*.sqlite*")), output


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_atropos_vllm_install_keeps_an_installed_runtime(tmp_path: Path) -> None:
    runtime = installed_runtime()  # skips where there is none: installing takes minutes and 2.5 GB
    line = command_line("README.md", "console-tools", "atropos-vllm install")
    done = _bash(line, mirror_of_repository(tmp_path / "work"),
                 block_environment(tmp_path, ATROPOS_HOME=str(atropos_home()), ATROPOS_VLLM_RUNTIME=str(runtime.path)))
    assert done.returncode == 0 and "vLLM runtime" in done.stdout and str(runtime.path) in done.stdout, _failure(done)


def test_atropos_prepare_model_finds_the_prepared_model(real_model_dir: Path, tmp_path: Path) -> None:
    line = command_line("README.md", "console-tools", "atropos-prepare-model")
    done = _bash(line, mirror_of_repository(tmp_path / "work"),
                 block_environment(tmp_path, ATROPOS_HOME=str(atropos_home())))
    assert done.returncode == 0 and f"model ready in {real_model_dir}" in done.stdout, _failure(done)


def test_atropos_grpo_run_without_a_gpu_exits_2_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: shared_vllm would start")
    args = command("README.md", "console-tools", "atropos-grpo-run", variables={"MODEL": str(tmp_path)})[1:]
    assert _run_in_process("atropos-grpo-run", args) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "GPU" in error, error


@pytest.fixture(scope="module")
def groups_workdir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    """A mirror of the repository whose data/addition.jsonl holds scored groups of the test
    tokenizer, as the README's minimal environment writes them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    workdir = mirror_of_repository(tmp_path_factory.mktemp("console") / "work")
    (workdir / "data").mkdir()
    groups = []
    for a in range(3):
        question, answers = f"What is {a} + 1?", [f"The answer is {a + 1}.", "Hello there", f"{a + 1}"]
        chats = [[{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
                 for answer in answers]
        groups.append(make_group(tokenizer, question, answers, [1.0, -1.0, 0.5], messages=chats))
    write_jsonl(workdir / "data" / "addition.jsonl", groups)
    return workdir


@pytest.mark.parametrize("program, wrote", [
    ("atropos-jsonl2html", "data/addition.html"), ("atropos-sft-gen", "sft.jsonl"), ("atropos-dpo-gen", "dpo.jsonl")],
    ids=["atropos-jsonl2html", "atropos-sft-gen", "atropos-dpo-gen"])
def test_the_data_tools_read_the_groups_file(program: str, wrote: str, groups_workdir: Path, tokenizer_dir: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(groups_workdir)
    args = command("README.md", "console-tools", program, variables={"MODEL": str(tokenizer_dir)})[1:]
    assert _run_in_process(program, args) == 0
    output = (groups_workdir / wrote).read_text()
    if program == "atropos-jsonl2html":
        assert "No groups." not in output and "Hello there" in output
        return
    rows = [json.loads(row) for row in output.splitlines()]
    assert {row["prefix"] for row in rows} == {f"<|user|>What is {a} + 1?<|end|><|assistant|>" for a in range(3)}
    if program == "atropos-sft-gen":  # the rollouts scored above 0
        assert sorted(row["score"] for row in rows) == [0.5, 0.5, 0.5, 1.0, 1.0, 1.0]
    else:  # the best against one at least 0.5 below it
        assert all(row["pos"].startswith("The answer") and row["neg"] == "Hello there<|end|>" for row in rows)


# -- the quickstart ---------------------------------------------------------------------------

def _quickstart_runtime() -> Path:
    """The vLLM runtime the quickstart uses: ``$ATROPOS_HOME``, else ``.cache/atropos`` of the clone,
    as scripts/test.sh and scripts/quickstart.sh choose it (skip without one)."""
    home = Path(os.environ.get("ATROPOS_HOME") or ROOT / ".cache" / "atropos")
    if not Runtime(home / "vllm-runtime").is_installed():
        pytest.skip(f"no vLLM runtime in {home}: `bash scripts/test.sh` installs it (here it would take minutes)")
    return home


@pytest.mark.real_vllm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_quickstart_makes_real_rollouts_then_the_model_folder_is_where_the_readme_says(tmp_path: Path) -> None:
    home = _quickstart_runtime()
    tests = shlex.join(command("README.md", "quickstart-commands", "bash scripts/test.sh"))
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()  # CI runs the second command as written
    quickstart = command("README.md", "quickstart-commands", "bash scripts/quickstart.sh")
    flags = command("README.md", "console-tools", "atropos-quickstart", {"--groups 16": "--groups 1"})[1:]
    out = tmp_path / "out"
    environment = block_environment(tmp_path, ATROPOS_HOME=str(home))
    environment.pop("ATROPOS_VLLM_RUNTIME", None)
    done = _bash(shlex.join([*quickstart, *flags, "--group-size", "2", "--max-tokens", "16", "--out-dir", str(out)]),
                 ROOT, environment, timeout=840)
    assert done.returncode == 0 and "1 groups, 2 rollouts" in done.stdout, _failure(done)
    assert re.search(r"[01] of 1 groups carry a learning signal", done.stdout), _failure(done)
    assert "generate GSM8K-style problems" not in done.stdout  # the default task (small sums) needs none
    (rollouts,) = out.glob("small_sums-*.jsonl")
    (group,) = [json.loads(line) for line in rollouts.read_text().splitlines()]
    assert len(group["tokens"]) == len(group["masks"]) == 2
    check = 'test -f "$MODEL/config.json" && test -f "$MODEL/tokenizer_config.json" && command -v run-api atropos-grpo'
    done = _bash(doc_block("README.md", "model-folder") + check, ROOT, block_environment(tmp_path))
    assert done.returncode == 0, _failure(done)


# -- benchmarks -------------------------------------------------------------------------------

def _reference_python() -> None:
    if not REFERENCE_PYTHON.exists():
        pytest.skip(f"no reference atroposlib at {REFERENCE_PYTHON} (bash bench/setup_reference.sh .cache/refvenv)")


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary folder with a short path, for TMPDIR: Chromium puts its singleton socket
    under TMPDIR, and a socket's path must fit in 107 bytes (pytest's folders, under
    pytest-xdist's worker folders, can be longer)."""
    with tempfile.TemporaryDirectory(prefix="atropos-") as folder:
        yield Path(folder)


@pytest.mark.slow
@pytest.mark.parametrize("name, start, replace, result", [
    pytest.param("bench-api", ".venv/bin/python bench/api_throughput.py",
                 {"--rounds 3": "--rounds 1 --groups 16 --mixed-groups 16 --clients 2"},
                 "every acknowledged group was served exactly once", id="bench-api"),
    pytest.param("bench-jsonl2html", ".venv/bin/python bench/jsonl2html.py",
                 {"bench/jsonl2html.py": "bench/jsonl2html.py --groups 20 --rollouts 2"},
                 "time ratio (reference / this project)", id="bench-jsonl2html"),
    pytest.param("bench-process", ".venv/bin/python bench/process_throughput.py",
                 {"--groups 128 --latency 0.2": "--groups 2 --latency 0 --repeats 1"},
                 "speed-up:", id="bench-process"),
])
def test_the_benchmark_runs_scaled_down(name: str, start: str, replace: dict[str, str], result: str,
                                        tmp_path: Path, short_tmp: Path) -> None:
    _reference_python()
    line = command_line("README.md", name, start, replace)
    done = _bash(line, ROOT, block_environment(tmp_path, TMPDIR=str(short_tmp)), timeout=300)
    assert done.returncode == 0 and result in done.stdout, _failure(done)


@pytest.mark.slow
def test_the_gpu_smoke_passes_on_a_cpu(tmp_path: Path) -> None:
    line = command_line("README.md", "bench-gpu-smoke", ".venv/bin/python bench/gpu_smoke.py",
                        {"bench/gpu_smoke.py": "bench/gpu_smoke.py --device cpu"})
    done = _bash(line, ROOT, block_environment(tmp_path, TMPDIR=str(tmp_path)), timeout=600)
    assert done.returncode == 0 and done.stdout.count("PASS ") == 3, _failure(done)


@pytest.mark.parametrize("name, start", [
    pytest.param("bench-weight-sync", ".venv/bin/python bench/weight_sync.py", id="bench-weight-sync"),
    pytest.param("bench-learning-demo", ".venv/bin/python bench/learning_demo.py", id="bench-learning-demo"),
    pytest.param("bench-learning-demo-bfloat16", ".venv/bin/python bench/learning_demo.py",
                 id="bench-learning-demo-bfloat16"),
    pytest.param("bench-precision", ".venv/bin/python bench/precision.py", id="bench-precision"),
    pytest.param("bench-trl-compare", ".venv/bin/python bench/trl_compare.py", id="bench-trl-compare"),
    pytest.param("bench-trl-levers", ".venv/bin/python bench/trl_compare.py", id="bench-trl-levers"),
    pytest.param("bench-trl-compare-epyc", ".venv/bin/python bench/trl_compare.py", id="bench-trl-compare-epyc"),
    pytest.param("bench-train-step", ".venv/bin/python bench/train_step.py", id="bench-train-step"),
    pytest.param("bench-train-step-race-shape", ".venv/bin/python bench/train_step.py",
                 id="bench-train-step-race-shape"),
    pytest.param("bench-allocator", ".venv/bin/python bench/allocator.py", id="bench-allocator"),
    pytest.param("bench-vllm-start", ".venv/bin/python bench/vllm_start.py", id="bench-vllm-start"),
    pytest.param("bench-vllm-restart", ".venv/bin/python bench/vllm_restart.py", id="bench-vllm-restart"),
])
def test_the_long_benchmark_knows_every_flag_of_its_command(name: str, start: str, tmp_path: Path) -> None:
    words = command("README.md", name, start, variables={"PWD": str(ROOT)})
    done = subprocess.run([sys.executable, str(ROOT / words[1]), "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=block_environment(tmp_path))
    assert done.returncode == 0, _failure(done)
    for flag in (word.split("=", 1)[0] for word in words[2:] if word.startswith("--")):
        assert f"{flag} " in done.stdout, f"{start} has no flag {flag}:\n{done.stdout}"
