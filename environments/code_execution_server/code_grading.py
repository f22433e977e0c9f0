"""Grading model-written Python against a problem's tests, through a program runner.

The runner is the local sandbox (`code_sandbox.LocalSandbox`) or one of Atropos's remote
executors defined here (`FlaskRunner`, `ModalGrader`). A solution is wrapped in a small
program (stdin/stdout, a function call, or HumanEval's ``check``); its output is compared
outside the sandbox, so a solution cannot grade itself.
"""

from __future__ import annotations

import json
import secrets
import time
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Optional

try:
    from environments.code_execution_server.code_sandbox import ProgramRunner, RunResult
except ImportError:  # run as a script: this folder is on sys.path
    from code_sandbox import ProgramRunner, RunResult


# --------------------------------------------------------------------------------------------------
# Remote runners (Atropos's executors), selectable instead of the local sandbox.

class FlaskRunner:
    """A remote executor speaking Atropos's ``server.py`` protocol: POST ``{"code", "input"}`` to
    `url` (``.../execute``), answered with ``{"output", "error"}``; it runs ``python`` itself,
    in its own container, with its own 5 s timeout."""

    def __init__(self, url: str, timeout: float = 60.0) -> None:
        self.url = url
        self.timeout = timeout

    async def run(self, program: str, stdin: str = "") -> RunResult:
        import httpx

        started = time.monotonic()
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                reply = (await client.post(self.url, json={"code": program, "input": stdin})).json()
        except Exception as exc:  # unreachable server, bad JSON: the run did not happen
            return RunResult("", f"executor request failed: {exc}", None, "error", time.monotonic() - started)
        duration = time.monotonic() - started
        error = str(reply.get("error") or "")
        if "output" not in reply:
            status = "timeout" if "timed out" in error.lower() else "error"
            return RunResult("", error, None, status, duration)
        status = "error" if "Traceback (most recent call last)" in error else "ok"
        return RunResult(str(reply["output"]), error, None, status, duration)

    async def run_each(self, program: str, stdins: list[str],
                       keep_going: Optional[Callable[[int, RunResult], bool]] = None) -> list[RunResult]:
        results = []
        for index, stdin in enumerate(stdins):
            results.append(await self.run(program, stdin))
            if keep_going is not None and not keep_going(index, results[-1]):
                break
        return results


class ModalGrader:
    """Atropos's Modal path: ``modal.Function.from_name(app, function)`` called as
    ``run_test.remote.aio({"tests": tests}, code)``, which grades remotely and returns
    ``(results, metadata)``. Needs the `modal` package and a deployed app."""

    def __init__(self, app_name: str, function_name: str = "run_test") -> None:
        import modal  # only this path needs it

        self.function = modal.Function.from_name(app_name, function_name)

    async def grade(self, code: str, tests: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        try:
            results, metadata = await self.function.remote.aio({"tests": tests}, code)
        except Exception as exc:  # noqa: BLE001 - a remote failure fails the rollout, as in Atropos
            return [False], {"error": f"remote grader failed: {exc}"}
        return list(results), dict(metadata or {})


# --------------------------------------------------------------------------------------------------
# Grading: programs that wrap a solution, and the comparisons made outside the sandbox.

PRELUDE = r'''
import sys as _sys
_sys.setrecursionlimit(50000)
_names = {}
for _module in ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
                "statistics", "itertools", "functools", "operator", "io", "sys", "json", "builtins", "typing"):
    _imported = __import__(_module)
    _public = getattr(_imported, "__all__", None) or [n for n in dir(_imported) if not n.startswith("_")]
    _names.update({n: getattr(_imported, n) for n in _public if hasattr(_imported, n)})
for _module in ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
                "statistics", "itertools", "functools", "operator", "io", "sys", "json"):
    _names[_module] = __import__(_module)
'''

STDIO_PROGRAM = PRELUDE + r'''
_scope = dict(_names, __name__="__main__", __builtins__=__builtins__)
try:
    exec(compile(SOLUTION, "solution.py", "exec"), _scope)
except SystemExit:
    pass
_sys.stdout.flush()
'''

CALL_PROGRAM = PRELUDE + r'''
import io as _io, json as _json
_nonce = _sys.stdin.readline().strip()
_raw = _json.loads(_sys.stdin.read())
_args = [_json.loads(line) for line in _raw.split("\n")] if isinstance(_raw, str) else _raw
_real_stdout = _sys.stdout
_sys.stdout = _io.StringIO()
_scope = dict(_names, __name__="solution", __builtins__=__builtins__)
exec(compile(SOLUTION, "solution.py", "exec"), _scope)
if "class Solution" in SOLUTION and "Solution" in _scope:
    _target = getattr(_scope["Solution"](), FN_NAME, None)
else:
    _target = _scope.get(FN_NAME)
if _target is None:
    raise NameError("the solution does not define %s" % FN_NAME)
_value = _target(*_args)
if isinstance(_value, tuple):
    _value = list(_value)

def _tag(value, depth=0):
    if depth > 200:
        return {"r": "too deep"}
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        value = value.item()
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if type(value) is int else {"r": repr(value)}
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else {"f": repr(value)}
    if type(value) is list:
        return [_tag(v, depth + 1) for v in value]
    if type(value) is tuple:
        return {"t": [_tag(v, depth + 1) for v in value]}
    if type(value) is dict:
        return {"d": [[_tag(k, depth + 1), _tag(v, depth + 1)] for k, v in value.items()]}
    return {"r": repr(value)[:200]}

_sys.stdout = _real_stdout
_sys.stdout.write("\n" + _nonce + _json.dumps(_tag(_value)) + "\n")
_sys.stdout.flush()
'''

CHECK_PROGRAM = PRELUDE + r'''
_nonce = _sys.stdin.readline().strip()
_scope = dict(_names, __name__="solution", __builtins__=__builtins__)
exec(compile(SOLUTION, "solution.py", "exec"), _scope)
exec(compile(CHECK, "tests.py", "exec"), _scope)
_scope["check"](_scope[FN_NAME])
_sys.stdout.write("\n" + _nonce + "passed\n")
_sys.stdout.flush()
'''


class _Unequal:
    """A decoded value the sandbox could not express: equal to nothing."""

    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return True

    __hash__ = None  # type: ignore[assignment]


def _untag(value: Any) -> Any:
    if isinstance(value, list):
        return [_untag(v) for v in value]
    if isinstance(value, dict):
        if "t" in value:
            return tuple(_untag(v) for v in value["t"])
        if "d" in value:
            try:
                return {_untag(k): _untag(v) for k, v in value["d"]}
            except TypeError:
                return _Unequal()
        if "f" in value:
            return float(value["f"])
        return _Unequal()
    return value


def truncate(value: Any, length: int = 300) -> str:
    text = value if isinstance(value, str) else str(value)
    if len(text) <= length:
        return text
    return text[: length // 2] + "...(truncated) ..." + text[-length // 2:]


def _stripped_lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _as_decimals(line: str) -> Optional[list[Decimal]]:
    try:
        return [Decimal(token) for token in line.split()]
    except (InvalidOperation, ValueError):
        return None


def stdout_matches(produced: str, expected: Any) -> tuple[bool, str]:
    """Whether `produced` is the expected output by the stdin/stdout rules; the reason if not."""
    got = _stripped_lines(produced)
    want = _stripped_lines(expected) if isinstance(expected, str) else list(expected)
    if len(got) != len(want):
        return False, "Wrong answer: mismatched output length"
    for index, (mine, theirs) in enumerate(zip(got, want)):
        if mine == theirs:
            continue
        reason = f"Wrong answer at output_line_idx={index}: {truncate(mine)} != {truncate(theirs)}"
        mine_numbers, their_numbers = _as_decimals(mine), _as_decimals(str(theirs))
        if mine_numbers is None or their_numbers is None:
            return False, reason
        if mine_numbers == their_numbers:
            continue
        try:
            close = len(mine_numbers) == len(their_numbers) and all(
                abs(a - b) <= Decimal("1e-4") for a, b in zip(mine_numbers, their_numbers))
        except InvalidOperation:
            close = False
        if not close:
            return False, reason
    return True, ""


def _failure(run: RunResult, test_input: Any, expected: Any) -> tuple[int, dict[str, Any]]:
    """The result code and metadata of a run that did not finish cleanly."""
    if run.status in ("timeout", "cpu_limit"):
        code, message = -3, "Time Limit Exceeded"
    else:
        code, message = -4, "Runtime Error"
    return code, {"error": truncate(run.stderr.strip()[-2000:], 2000), "error_code": code, "error_message": message,
                  "status": run.status, "inputs": truncate(test_input), "expected": truncate(expected)}


def _marked_value(stdout: str, nonce: str) -> Optional[str]:
    """What follows the last line starting with `nonce`, or None."""
    found = None
    for line in stdout.split("\n"):
        if line.startswith(nonce):
            found = line[len(nonce):]
    return found


def _program(template: str, code: str, fn_name: str = "", check: str = "") -> str:
    return f"SOLUTION = {code!r}\nFN_NAME = {fn_name!r}\nCHECK = {check!r}\n" + template


async def grade(code: str, tests: dict[str, Any], runner: ProgramRunner) -> tuple[list[Any], dict[str, Any]]:
    """Run `code` on `tests` ({"input", "output", "fn_name"} or {"check", "fn_name"}) with `runner`.

    Returns (results, metadata): one entry per test case run, ``True`` when it passed; the
    first failure ends grading with -2 (wrong answer), -3 (time limit) or -4 (runtime error).
    """
    fn_name = tests.get("fn_name") or "none"
    nonce = f"@@{secrets.token_hex(16)}@@"
    if tests.get("check"):
        run = (await runner.run_each(_program(CHECK_PROGRAM, code, fn_name, tests["check"]), [nonce + "\n"]))[0]
        if not run.ok:
            code_, meta = _failure(run, fn_name, "check() passes")
            if run.status == "error" and "AssertionError" in run.stderr:
                code_, meta["error_code"], meta["error_message"] = -2, -2, "Wrong Answer"
            return [code_], meta
        if _marked_value(run.stdout, nonce) != "passed":
            return [-4], {"error_code": -4, "error_message": "Runtime Error", "error": "check() did not finish"}
        return [True], {"execution time": run.duration}

    cases = list(zip(tests.get("input") or [], tests.get("output") or []))
    if not cases:
        return [-4], {"error_code": -4, "error_message": "no test cases"}
    call_based = fn_name != "none"
    if call_based:
        program = _program(CALL_PROGRAM, code, fn_name)
        stdins = [nonce + "\n" + json.dumps(test_input) for test_input, _ in cases]
    else:
        program = _program(STDIO_PROGRAM, code)
        stdins = ["\n".join(test_input) if isinstance(test_input, list) else str(test_input) for test_input, _ in cases]
    results: list[Any] = []
    failure: dict[str, Any] = {}

    def judge(index: int, run: RunResult) -> bool:
        test_input, expected = cases[index]
        if call_based:
            expected = json.loads(expected) if isinstance(expected, str) else expected[0]
        if not run.ok:
            code_, meta = _failure(run, test_input, expected)
            results.append(code_)
            failure.update(meta)
            return False
        if call_based:
            marked = _marked_value(run.stdout, nonce)
            try:
                got = _untag(json.loads(marked)) if marked is not None else _Unequal()
            except ValueError:
                got = _Unequal()
            matched, reason = bool(got == expected), "Wrong Answer"
            shown: Any = "(no result)" if isinstance(got, _Unequal) else got
        else:
            matched, reason = stdout_matches(run.stdout, expected)
            shown = run.stdout
        if not matched:
            results.append(-2)
            failure.update({"output": truncate(shown), "inputs": truncate(test_input), "expected": truncate(expected),
                            "error_code": -2, "error_message": reason})
            return False
        results.append(True)
        return True

    runs = await runner.run_each(program, stdins, judge)
    if failure:
        return results, failure
    return results, {"execution time": sum(run.duration for run in runs)}


def passed(results: list[Any]) -> bool:
    """All test cases passed (Atropos: ``set(res) == {True}``)."""
    return bool(results) and all(r is True for r in results)
