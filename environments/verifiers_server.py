"""Any Prime Intellect *verifiers* environment, run by ``serve``, ``process`` and ``evaluate``.

Needs the ``verifiers`` package (``pip install 'atroposlib[verifiers]'``: Atropos's pin,
``verifiers==0.1.9.post2``) and the environment itself as a Python module (``prime env
install owner/name``, or pip). ``--env.vf_env_name`` names it as verifiers does: ``wordle``,
``will/wordle`` or ``owner/name@version`` (the module imported is ``name``, ``-`` read as
``_``). ``--env.env_args`` is a JSON object of keyword arguments for its
``load_environment()`` (a mapping in a ``--config`` YAML such as ``configs/verifiers.yaml``).

Items are the dataset's rows, in order, cycling. A group is ``group_size`` rollouts of a row,
each played by the verifiers environment itself (``rollout()``: its prompt, turns and tools)
at ``--env.temperature`` with ``max_token_length`` tokens per reply, then scored together by
its rubric (``score_group``: plain and async reward functions, group reward functions, the
weights; the score is the rubric's weighted sum). Every rollout samples in a
`managed_server()` session of its own, so its tokens, masks and logprobs are the server's,
over all its turns (one extending node): ``--openai.server_type vllm`` or ``sglang``.
``process`` also takes an OpenAI-style endpoint (data generation, e.g. for SFT): the
conversation is then tokenised by ``tokenize_for_trainer`` (every assistant turn trained),
without ``inference_logprobs``.

``evaluate`` plays each eval row once (the training rows when there are none; at most
``--env.eval_limit``) at ``--env.eval_temperature`` through plain chat requests and reports
``eval/avg_total_score``, the mean of each reward function and verifiers metric
(``eval/<name>``, e.g. ``num_turns``) and ``eval/failed`` (failed requests, left out).

    python environments/verifiers_server.py serve --env.vf_env_name primeintellect/gsm8k \\
        --openai.server_type vllm --openai.base_url http://localhost:9001/v1
    python environments/verifiers_server.py process --env.vf_env_name will/wordle \\
        --env.env_args '{"use_think": false}' --openai.model_name gpt-4.1-mini \\
        --openai.base_url https://api.openai.com/v1 --openai.server_type openai

A missing ``verifiers`` package, an unset, uninstalled or failing environment end the command
with one line (exit status 1).

Differences from Atropos 0.4.0: a managed session per rollout (Atropos shared one per group
and paired nodes with rollouts by position); ``score_group``, so group reward functions work;
``evaluate`` runs the eval rows (Atropos's is a no-op); ``env_args`` a JSON string or a
mapping; ``temperature``, ``eval_temperature``, ``eval_limit`` added; atroposlib's signal
handlers are put back after verifiers installs its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import signal
import statistics
import sys
import threading
import time
from collections import defaultdict
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from openai.types.chat import ChatCompletion, ChatCompletionMessage
from pydantic import Field, field_validator

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.server_handling.managed_server import ManagedServerAdapter, SequenceNode
from atroposlib.envs.server_handling.server_manager import ManagedServerUnsupported
from atroposlib.utils.tokenize_for_trainer import token_ids, tokenize_for_trainer

try:
    import verifiers as vf
    from verifiers.utils.error_utils import ErrorChain  # an error and its causes, on one line
except ImportError as _missing:  # an optional extra: the error says how to install it
    vf = None
    VERIFIERS_IMPORT_ERROR: Optional[ImportError] = _missing
else:
    VERIFIERS_IMPORT_ERROR = None

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'atroposlib[verifiers]'"


class VerifiersEnvError(RuntimeError):
    """A verifiers environment that cannot run here; the command line prints it as one line."""


def parse_env_args(value: Union[str, dict[str, Any], None]) -> dict[str, Any]:
    """`env_args` as keyword arguments: a mapping as it is, a string read as a JSON object."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, dict):
        return dict(value)
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"env_args is not JSON ({exc.msg}); give an object, e.g. '{{\"use_think\": false}}'") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"env_args must be a JSON object, not {type(parsed).__name__}")
    return parsed


def module_of(env_id: str) -> tuple[str, str]:
    """(the id verifiers loads, the module it imports) for ``name``, ``owner/name`` or
    ``owner/name@version``."""
    loadable = env_id.strip().split("@", 1)[0].strip()
    return loadable, loadable.split("/")[-1].replace("-", "_")


def _importable(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a dotted name whose parent is missing, or an empty one
        return False


def _below_error(record: logging.LogRecord) -> bool:
    return record.levelno < logging.ERROR


@contextlib.contextmanager
def _building() -> Iterator[None]:
    """Around the build of a verifiers environment. It replaces the SIGINT and SIGTERM handlers
    (its teardown, then exit); atroposlib's modes stop in order on both (groups in flight, spool
    kept), so theirs are put back (verifiers still tears down at exit). And verifiers logs a
    failed load before raising it: the error raised is reported instead, once."""
    loader = logging.getLogger("verifiers.utils.env_utils")
    loader.addFilter(_below_error)
    main_thread = threading.current_thread() is threading.main_thread()
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)} if main_thread else {}
    try:
        yield
    finally:
        loader.removeFilter(_below_error)
        for signum, handler in saved.items():
            if handler is not None:
                signal.signal(signum, handler)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load_vf_environment(env_id: str, env_args: dict[str, Any]) -> Any:
    """The verifiers environment `env_id` built with `env_args`; `VerifiersEnvError` when it cannot be."""
    if vf is None:
        raise VerifiersEnvError(f"VerifiersEnv needs the verifiers package ({VERIFIERS_IMPORT_ERROR}): {INSTALL_HINT}")
    if not env_id.strip():
        raise VerifiersEnvError("--env.vf_env_name is not set: name the verifiers environment to run, "
                                "e.g. --env.vf_env_name primeintellect/gsm8k")
    loadable, module = module_of(env_id)
    if not _importable(module):
        hub_id = loadable if "/" in loadable else f"OWNER/{loadable}"
        raise VerifiersEnvError(f"verifiers environment {env_id!r} is not installed (no module {module!r}); "
                                f"install it, e.g. prime env install {hub_id}")
    try:
        with _building():
            environment = vf.load_environment(loadable, **env_args)
    except Exception as exc:
        reason = _first_line(exc.__cause__ or exc)  # verifiers wraps the environment's own error
        raise VerifiersEnvError(f"cannot load verifiers environment {env_id!r}: {reason}") from exc
    if not isinstance(environment, vf.Environment):
        raise VerifiersEnvError(f"{module}.load_environment() returned a {type(environment).__name__}, "
                                "not a verifiers Environment")
    return environment


def typed_tool_calls(response: ChatCompletion) -> ChatCompletion:
    """`response` with its tool calls as OpenAI's models: verifiers reads them with
    ``model_dump()``, and a managed session with a tool parser returns plain dicts."""
    for choice in response.choices:
        calls = choice.message.tool_calls
        if calls and any(isinstance(call, dict) for call in calls):
            choice.message = ChatCompletionMessage.model_validate({
                "role": "assistant", "content": choice.message.content,
                "tool_calls": [call if isinstance(call, dict) else call.model_dump() for call in calls],
            })
    return response


class ServerRequests:
    """verifiers' OpenAI-style requests, handed to an atroposlib server: a managed session
    (token-level routes, which take every sampling field at the top level) or the server
    manager (OpenAI routes, in the `split` semaphore)."""

    def __init__(self, target: Any, token_level: bool, split: Optional[str] = None) -> None:
        self.target = target
        self.token_level = token_level
        self.split = split

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        return typed_tool_calls(await self.target.chat_completion(**self.request(kwargs)))

    async def completion(self, **kwargs: Any) -> Any:
        return await self.target.completion(**self.request(kwargs))

    def request(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments the target takes (the server names the model itself)."""
        request = {key: value for key, value in kwargs.items() if key not in ("model", "extra_body")}
        extra = kwargs.get("extra_body") or {}
        if self.token_level:
            request.update(extra)
            if "max_completion_tokens" in request:  # verifiers' name for chat; the token routes take max_tokens
                request.setdefault("max_tokens", request.pop("max_completion_tokens"))
        elif extra:
            request["extra_body"] = extra
        if self.split is not None:
            request["split"] = self.split
        return request


@dataclass
class Rollout:
    """One played rollout: the verifiers state and, when the server returns token ids, the
    managed node that holds its tokens, masks and logprobs."""

    state: Any
    node: Optional[SequenceNode]


def conversation(state: Any) -> list[dict[str, Any]]:
    """The rollout as chat messages (a completion-style prompt and reply as a user and an
    assistant message); a missing content is an empty string, as the API requires one."""
    prompt, completion = state["prompt"], state.get("completion")
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": str(completion or "")}]
    return [{**message, "content": "" if message.get("content") is None else message["content"]}
            for message in [*prompt, *(completion or [])]]


def question_of(state: Any) -> str:
    """The prompt's last user message (the whole prompt of a completion-style environment)."""
    prompt = state["prompt"]
    if isinstance(prompt, str):
        return prompt
    users = [message.get("content") for message in prompt if message.get("role") == "user"]
    return str(users[-1]) if users else ""


def finish_reason(state: Any) -> str:
    return "length" if state.get("is_truncated") else "stop"


def metric_values(states: list[Any]) -> dict[str, list[float]]:
    """Each verifiers metric's values over `states` (its reward functions' and its own)."""
    values: dict[str, list[float]] = defaultdict(list)
    for state in states:
        for metric, value in (state.get("metrics") or {}).items():
            if isinstance(value, (int, float)):
                values[metric].append(float(value))
    return values


class VfEnvConfig(BaseEnvConfig):
    """The verifiers environment to run, its load arguments, and how it is sampled."""

    vf_env_name: str = Field(default="",
                             description="The verifiers environment: name, owner/name or owner/name@version.")
    env_args: Union[dict[str, Any], str] = Field(
        default_factory=dict,
        description="Keyword arguments for the environment's load_environment(): a JSON object (a mapping in YAML).")
    temperature: float = Field(default=1.0, description="Sampling temperature of training rollouts.")
    eval_temperature: float = Field(default=0.0, description="Sampling temperature of evaluate().")
    eval_limit: int = Field(default=-1, description="Evaluate on at most this many eval rows; -1: all.")

    @field_validator("env_args")
    @classmethod
    def _env_args_are_an_object(cls, value: Union[dict[str, Any], str]) -> Union[dict[str, Any], str]:
        parse_env_args(value)
        return value

    def get_env_args(self) -> dict[str, Any]:
        """`env_args` as keyword arguments."""
        return parse_env_args(self.env_args)


class VerifiersEnv(BaseEnv):
    """A verifiers environment's dataset, rollouts and rubric as an atroposlib environment."""

    name = "verifiers"
    env_config_cls = VfEnvConfig

    def __init__(self, config: VfEnvConfig, server_configs: Any, slurm: bool = False, testing: bool = False) -> None:
        # Loaded first: a missing package or environment stops the command before the
        # tokenizer is loaded and the groups file opened.
        self.vf_env = load_vf_environment(config.vf_env_name, config.get_env_args())
        super().__init__(config, server_configs, slurm, testing)
        self.rubric = self.vf_env.rubric
        self.system_prompt = self.vf_env.system_prompt
        self.plain_requests = False
        self.train: list[dict[str, Any]] = []
        self.iter = 0
        self.reward_buffer: list[float] = []
        self.metrics_buffer: dict[str, list[float]] = defaultdict(list)
        self.num_turns_buffer: list[int] = []
        self.eval_metrics: list[tuple[str, float]] = []

    @classmethod
    def config_init(cls) -> tuple[VfEnvConfig, list[APIServerConfig]]:
        env_config = VfEnvConfig(
            tokenizer_name="Qwen/Qwen2.5-1.5B-Instruct", group_size=8, use_wandb=True,
            rollout_server_url="http://localhost:8000", total_steps=1000, batch_size=4, steps_per_eval=100,
            max_token_length=2048, wandb_name="verifiers",
        )
        servers = [APIServerConfig(model_name="Qwen/Qwen2.5-1.5B-Instruct", base_url="http://localhost:9001/v1",
                                   api_key="x", num_requests_for_eval=4, server_type="sglang")]
        return env_config, servers

    @classmethod
    def cli(cls) -> None:
        """Run the command line; a `VerifiersEnvError` ends it with one line and exit status 1."""
        try:
            super().cli()
        except VerifiersEnvError as exc:
            print(f"{Path(sys.argv[0]).name}: {exc}", file=sys.stderr)
            raise SystemExit(1) from None

    # -- data ---------------------------------------------------------------------------------
    async def setup(self) -> None:
        dataset = self.vf_env.dataset
        self.train = dataset.to_list() if dataset is not None else []
        self.iter = 0

    def save_checkpoint(self, step: int, data: Optional[dict[str, Any]] = None) -> None:
        super().save_checkpoint(step, {"iter": self.iter} if data is None else data)

    async def get_next_item(self) -> dict[str, Any]:
        if not self.train:
            raise VerifiersEnvError(f"verifiers environment {self.config.vf_env_name!r} has no training dataset; "
                                    "only evaluate can run it")
        row = self.train[self.iter % len(self.train)]
        self.iter += 1
        return dict(row)

    # -- requests -------------------------------------------------------------------------------
    def _server_config(self, field: str, default: str) -> str:
        servers = getattr(self.server, "servers", None)
        return str(getattr(servers[0].config, field, None) or default) if servers else default

    @property
    def model_name(self) -> str:
        """The model verifiers is told it samples (the server uses its own configured name)."""
        return self._server_config("model_name", self.config.tokenizer_name)

    def client(self, target: Any, token_level: bool, split: Optional[str] = None) -> ManagedServerAdapter:
        """An AsyncOpenAI look-alike over `target`, for verifiers."""
        return ManagedServerAdapter(ServerRequests(target, token_level, split), self._server_config("base_url", ""))

    def sampling(self, temperature: float) -> dict[str, Any]:
        """The environment's own sampling arguments, with this run's temperature and reply budget."""
        return {**deepcopy(self.vf_env.sampling_args), "temperature": temperature,
                "max_tokens": self.config.max_token_length}

    # -- rollouts -------------------------------------------------------------------------------
    async def _managed_rollout(self, item: dict[str, Any]) -> Rollout:
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            state = await self.vf_env.rollout(item, self.client(managed, token_level=True), self.model_name,
                                              self.sampling(self.config.temperature))
            nodes = managed.get_state()["nodes"]
        # A multi-turn rollout extends one node; if the environment rewrote the history, the
        # node that covers the most of the conversation is the one to train on.
        return Rollout(state, max(nodes, key=lambda node: len(node.tokens)) if nodes else None)

    async def rollout(self, item: dict[str, Any]) -> Rollout:
        """One rollout of `item`, through a managed session when the server returns token ids."""
        if not self.plain_requests:
            try:
                return await self._managed_rollout(item)
            except ManagedServerUnsupported:
                if not getattr(self, "process_mode", False):
                    raise  # serve trains on these tokens: they must be the ones the server sampled
                if not self.plain_requests:
                    log.warning("the inference server returns no token ids: rollouts are tokenised with "
                                "tokenize_for_trainer and carry no inference logprobs")
                self.plain_requests = True
        state = await self.vf_env.rollout(item, self.client(self.server, token_level=False), self.model_name,
                                          self.sampling(self.config.temperature))
        return Rollout(state, None)

    async def score_states(self, states: list[Any]) -> None:
        """Score the rollouts of one item together with the environment's rubric."""
        if self.vf_env.score_rollouts:
            await self.vf_env.rubric.score_group(states, score_sem=contextlib.nullcontext())
        else:
            await self.vf_env.rubric.dummy_score_group(states)

    async def collect_trajectories(self, item: dict[str, Any]) -> tuple[Optional[ScoredDataGroup], list[Any]]:
        rollouts = list(await asyncio.gather(*(self.rollout(item) for _ in range(self.config.group_size))))
        failed = [rollout.state["error"] for rollout in rollouts if rollout.state.get("error") is not None]
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(rollouts)} rollouts of example {item.get('example_id')} "
                               f"failed: {ErrorChain(failed[0])}")
        if not self.plain_requests and any(rollout.node is None for rollout in rollouts):
            log.warning("example %s: a rollout got no completion (prompt longer than the context?); group dropped",
                        item.get("example_id"))
            return None, []
        await self.score_states([rollout.state for rollout in rollouts])
        self._record([rollout.state for rollout in rollouts])
        return self.scored_group(rollouts), []

    def _tokenized(self, state: Any) -> tuple[list[int], list[int]]:
        """Tokens and masks of a rollout the server returned no token ids for."""
        if isinstance(state["prompt"], str):
            prompt_ids = token_ids(self.tokenizer.encode(state["prompt"]))
            ids = token_ids(self.tokenizer.encode(state["prompt"] + str(state.get("completion") or "")))
            return ids, [-100] * len(prompt_ids) + ids[len(prompt_ids):]
        tokenized = tokenize_for_trainer(self.tokenizer, conversation(state), train_on_all_assistant_turns=True,
                                         finish_reason=finish_reason(state))
        return tokenized["tokens"], tokenized["masks"]

    def scored_group(self, rollouts: list[Rollout]) -> ScoredDataGroup:
        """The group sent to the trainer: the server's tokens and logprobs when it returned
        them, else the conversation tokenised here."""
        exact = all(rollout.node is not None for rollout in rollouts)
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
        if exact:
            group["inference_logprobs"] = []
        for rollout in rollouts:
            if exact and rollout.node is not None:
                group["tokens"].append(list(rollout.node.tokens))
                group["masks"].append(list(rollout.node.masked_tokens))
                group["inference_logprobs"].append(list(rollout.node.logprobs))
            else:
                tokens, masks = self._tokenized(rollout.state)
                group["tokens"].append(tokens)
                group["masks"].append(masks)
            group["scores"].append(float(rollout.state.get("reward") or 0.0))
            group["messages"].append(conversation(rollout.state))
        return group

    def _record(self, states: list[Any]) -> None:
        for state in states:
            self.reward_buffer.append(float(state.get("reward") or 0.0))
            self.num_turns_buffer.append(len(state.get("trajectory") or []))
        for metric, values in metric_values(states).items():
            self.metrics_buffer[metric].extend(values)

    # -- evaluation ----------------------------------------------------------------------------
    def eval_rows(self) -> list[dict[str, Any]]:
        """The eval dataset's rows (the training rows when there is none), at most `eval_limit`."""
        dataset = self.vf_env.eval_dataset
        if dataset is None:  # verifiers environments have one dataset at least
            log.info("%s has no eval dataset: evaluating on its training rows", self.config.vf_env_name)
            dataset = self.vf_env.dataset
        if 0 <= self.config.eval_limit < len(dataset):
            dataset = dataset.select(range(self.config.eval_limit))
        return dataset.to_list()

    @staticmethod
    def eval_sample(state: Any) -> dict[str, Any]:
        reward = float(state.get("reward") or 0.0)
        sample = {"messages": conversation(state), "question": question_of(state),
                  "gold_answer": str(state.get("answer", "")), "score": reward, "correct": reward > 0,
                  "finish_reason": finish_reason(state), "metrics": dict(state.get("metrics") or {})}
        if state.get("error") is not None:
            sample["error"] = str(ErrorChain(state["error"]))
        return sample

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        start = time.time()
        results = await self.vf_env.generate(
            self.eval_rows(), client=self.client(self.server, token_level=False, split="eval"),
            model=self.model_name, sampling_args=self.sampling(self.config.eval_temperature),
            max_concurrent=max(1, self.config.max_eval_workers), use_tqdm=False,
        )
        states = list(results["state"])
        answered = [state for state in states if state.get("error") is None]
        failed = len(states) - len(answered)
        if failed:
            log.warning("%d of %d eval rollouts failed: left out of the means", failed, len(states))
        metrics = {"eval/avg_total_score": statistics.fmean(float(s.get("reward") or 0.0) for s in answered)
                   if answered else 0.0}
        metrics.update({f"eval/{name}": statistics.fmean(values) for name, values in metric_values(answered).items()})
        metrics["eval/failed"] = float(failed)
        self.eval_metrics = list(metrics.items())
        self.evaluate_log(metrics, samples=[self.eval_sample(state) for state in states], start_time=start,
                          end_time=time.time(), generation_parameters={
                              "temperature": self.config.eval_temperature, "max_tokens": self.config.max_token_length})
        return metrics

    async def wandb_log(self, wandb_metrics: Optional[dict[str, Any]] = None) -> None:
        metrics = dict(wandb_metrics or {})
        if self.reward_buffer:
            metrics["metrics/mean_reward"] = statistics.fmean(self.reward_buffer)
            metrics["metrics/reward_std"] = statistics.pstdev(self.reward_buffer)
        for metric, values in self.metrics_buffer.items():
            metrics[f"metrics/{metric}"] = statistics.fmean(values)
        if self.num_turns_buffer:
            metrics["metrics/avg_num_turns"] = statistics.fmean(self.num_turns_buffer)
            metrics["metrics/max_num_turns"] = max(self.num_turns_buffer)
        metrics.update(self.eval_metrics)
        self.reward_buffer, self.num_turns_buffer, self.eval_metrics = [], [], []
        self.metrics_buffer = defaultdict(list)
        await super().wandb_log(metrics)


if __name__ == "__main__":
    VerifiersEnv.cli()
