"""`BaseEnv`: the class every environment subclasses.

An environment turns *items* (``get_next_item``) into scored *groups* of rollouts
(``collect_trajectories``), which are checked, stamped with how their rollouts were sampled
(``handle_send_to_api``, `atroposlib.envs.sampling_stamp`) and either sent to the
trajectory API (``serve``) or written to JSONL (``process``). The modes
themselves live in `atroposlib.envs.serve_mode`, `process_mode` and `runner`; this
module holds the hooks and the per-group bookkeeping environments rely on.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import statistics
import threading
import time
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

from atroposlib.envs import accept
from atroposlib.envs.config import BaseEnvConfig
from atroposlib.envs.eval import evaluate_log as write_eval_results
from atroposlib.envs.rescore_hooks import RESCORE_FACTS_FIELD, RescoreHooks
from atroposlib.envs.sampling_stamp import stamp_group
from atroposlib.envs.server_handling.api_server import APIServer
from atroposlib.envs.server_handling.configs import APIServerConfig, ServerBaseline, ServerManagerConfig
from atroposlib.envs.server_handling.reasoning import ReasoningConfig
from atroposlib.envs.server_handling.sampling_record import current_record
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.envs.chat_template_ids import keep_transformers4_chat_ids
from atroposlib.envs.tokenizer_loading import found_locally, load_tokenizer
from atroposlib.envs.types import EvalHandlingEnum, ScoredDataGroup, ScoredDataItem
from atroposlib.envs.wandb_logging import WandbRun
from atroposlib.type_definitions import Item
from atroposlib.utils.metrics import get_std_min_max_avg

__all__ = [
    "APIServer", "APIServerConfig", "BaseEnv", "BaseEnvConfig", "EvalHandlingEnum", "ScoredDataGroup",
    "ScoredDataItem", "ServerBaseline", "ServerManager", "ServerManagerConfig",
]

log = logging.getLogger("atroposlib.envs")
# How long the first rollouts run before the tokenizer thread competes with them for the GIL.
TOKENIZER_HEAD_START_S = 0.25

Groups = Union[ScoredDataGroup, list[Optional[ScoredDataGroup]], None]


def first_free_path(path: Path) -> Path:
    """`path`, or ``<stem>_1<suffix>``, ``<stem>_2<suffix>``, ... if it exists."""
    candidate, k = path, 0
    while candidate.exists():
        k += 1
        candidate = path.with_name(f"{path.stem}_{k}{path.suffix}")
    return candidate



class EvaluationLogged:
    """What `BaseEnv.evaluate_log` returns: awaiting it is allowed and does nothing (the
    results are already written), so both ``self.evaluate_log(...)`` and Atropos's
    ``await self.evaluate_log(...)`` work."""

    def __await__(self) -> Iterator[None]:
        return iter(())

class BaseEnv(RescoreHooks, ABC):
    """An RL environment: subclass it, implement the hooks, run ``MyEnv.cli()``."""

    name: Optional[str] = None
    env_config_cls: type[BaseEnvConfig] = BaseEnvConfig
    server_cls: type[APIServer] = APIServer
    # The (lowest, highest) score this env gives, when it declares one: ``check`` holds scores to it.
    score_range: Optional[tuple[float, float]] = None

    def __init__(
        self,
        config: BaseEnvConfig,
        server_configs: Union[ServerBaseline, APIServerConfig, list[APIServerConfig]],
        slurm: bool = False,
        testing: bool = False,
    ) -> None:
        self.config = config
        manager = getattr(self, "_manager_settings", None) or ServerManagerConfig()
        self.server = ServerManager(
            server_configs, server_class=self.server_cls, slurm=slurm, testing=testing,
            max_n_completions=manager.max_n_completions, proxy_url=manager.proxy_url,
            reasoning_config=ReasoningConfig.from_env_config(config),
        )
        self._tokenizer: Any = None
        self._tokenizer_lock = threading.Lock()
        if not getattr(self, "_tokenizer_on_demand", False) and not found_locally(config.tokenizer_name):
            self.tokenizer  # downloads it now, or says in one line why it cannot
        self.workers: set[asyncio.Task[Any]] = set()
        self.eval_workers: set[asyncio.Task[Any]] = set()
        self.backlog: list[Item] = []
        self.rollouts_for_wandb: list[list[tuple[str, float]]] = []
        self.running_items: dict[str, dict[str, Any]] = {}
        self.completion_lengths: list[int] = []
        self.curr_step = 0
        self.max_token_len = -1
        self.wandb_prepend: Optional[str] = None
        self.wandb_project: Optional[str] = None
        self.wandb_group: Optional[str] = None
        self.checkpoint_dir = ""
        self.checkpoint_interval = -1
        self.items_sent_this_step = 0
        self.groups_sent = 0
        self.rollouts_sent = 0
        self.rollouts_finished = 0
        self.on_rollouts_finished: Optional[Callable[[int], None]] = None
        self.evaluation_started_at: Optional[float] = None
        self.eval_runner: Optional[asyncio.Task[Any]] = None
        self.last_completed_item: Optional[Item] = None
        self.task_duration: list[float] = []
        self.succeeded_task_duration: list[float] = []
        self.failed_task_duration: list[float] = []
        self.mainloop_timings: list[float] = []
        self.workers_added_list: list[int] = []
        self.task_successful: list[int] = []
        self.last_loop_time: Optional[float] = None
        self.env_id: Optional[int] = None
        self.status_dict: dict[str, Any] = {}
        self.skipped = accept.SkipCounter()
        self.wandb = WandbRun()
        self.max_num_workers = self.resolved_max_num_workers()
        self.jsonl_writer = self._open_jsonl_writer()

    @property
    def tokenizer(self) -> Any:
        """The tokenizer named by ``tokenizer_name``, loaded at first use or in the background
        (`start_loading_tokenizer`): importing transformers takes seconds on a small CPU, and
        the first inference requests need not wait for it."""
        if self._tokenizer is None:
            with self._tokenizer_lock:
                if self._tokenizer is None:
                    # environment files of Atropos's era expect transformers 4's token-id lists
                    self._tokenizer = keep_transformers4_chat_ids(load_tokenizer(self.config.tokenizer_name))
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def start_loading_tokenizer(self) -> None:
        """Load the tokenizer in a thread while the first requests are out; a failure there is
        left for the first use to raise, where the run reports it.

        Called from a running event loop, the thread starts `TOKENIZER_HEAD_START_S` later:
        its imports hold the GIL most of the time, and the rollouts just started need it to
        build and send their first requests. A rollout that needs the tokenizer sooner loads
        it itself (the thread then finds it loaded).
        """

        def load() -> None:
            try:
                self.tokenizer
            except Exception:
                pass

        def start() -> None:
            if self._tokenizer is None:
                threading.Thread(target=load, name="tokenizer-loader", daemon=True).start()

        try:
            asyncio.get_running_loop().call_later(TOKENIZER_HEAD_START_S, start)
        except RuntimeError:  # no event loop: start now
            start()

    # -- configuration ---------------------------------------------------------------------
    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, Union[ServerBaseline, APIServerConfig, list[APIServerConfig]]]:
        """Default (env config, server configs); command-line flags and YAML override them."""
        return cls.env_config_cls(), ServerBaseline()

    def resolved_max_num_workers(self) -> int:
        if self.config.max_num_workers > 0:
            return self.config.max_num_workers
        return self.config.max_num_workers_per_node * max(1, len(self.server.servers))

    def _open_jsonl_writer(self) -> Optional[Any]:
        if not self.config.data_path_to_save_groups:
            return None
        path = first_free_path(Path(self.config.data_path_to_save_groups))
        path.parent.mkdir(parents=True, exist_ok=True)
        self.config.data_path_to_save_groups = str(path)
        return open(path, "a", encoding="utf-8")

    def close_jsonl_writer(self) -> None:
        """Close the groups file; one that holds nothing is removed rather than left empty."""
        if self.jsonl_writer is not None:
            self.jsonl_writer.close()
            self.jsonl_writer = None
            path = Path(self.config.data_path_to_save_groups)
            if path.is_file() and path.stat().st_size == 0:
                path.unlink()

    @property
    def derived_batch_size(self) -> int:
        """This env's share of a trainer batch, from the API's latest status."""
        if not self.status_dict or self.config.batch_size == -1:
            return self.config.batch_size
        share = self.status_dict.get("unallocated_fraction", 1.0) + (self.config.min_batch_allocation or 0)
        return int(self.config.batch_size * share)

    # -- hooks ------------------------------------------------------------------------------
    async def setup(self) -> None:
        """Load data and resources (override)."""
        raise NotImplementedError(f"{type(self).__name__} must implement setup()")

    @abstractmethod
    async def get_next_item(self) -> Item:
        """The next item to roll out, or None when there is nothing to do right now."""

    async def collect_trajectory(self, item: Item) -> tuple[Optional[ScoredDataItem], list[Item]]:
        """One scored rollout of `item` (used by the default `collect_trajectories`)."""
        raise NotImplementedError(f"{type(self).__name__} must implement collect_trajectory or collect_trajectories")

    async def collect_trajectories(self, item: Item) -> tuple[Groups, list[Item]]:
        """A scored group for `item` (default: `group_size` concurrent `collect_trajectory`)."""

        async def one_rollout() -> tuple[Optional[ScoredDataItem], list[Item]]:
            result = await self.collect_trajectory(item)
            self.note_rollouts_finished(1)
            return result

        results = await asyncio.gather(*(one_rollout() for _ in range(self.config.group_size)))
        return _group_from_items([r for r in results if r[0] is not None], self.config.group_size), [
            entry for _, backlog in results for entry in (backlog or [])
        ]

    def note_rollouts_finished(self, count: int) -> None:
        """Count rollouts as they finish (progress displays listen through `on_rollouts_finished`)."""
        self.rollouts_finished += count
        if self.on_rollouts_finished is not None:
            self.on_rollouts_finished(count)

    async def postprocess_histories(self, trajectories: Groups) -> Groups:
        return trajectories

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """Run this environment's evaluation (override)."""
        raise NotImplementedError(f"{type(self).__name__} must implement evaluate()")

    async def cleanup(self) -> None:
        """Called after every rollout (override to release per-rollout resources)."""

    # -- groups -------------------------------------------------------------------------------
    async def handle_send_to_api(
        self,
        scored_data: Groups,
        item: Item = None,
        do_send_to_api: bool = True,
        abort_on_any_max_length_exceeded: bool = True,
    ) -> list[ScoredDataGroup]:
        """Check groups, stamp them with how they were sampled (from the sampling record the
        mode opened for `item`), record them (W&B table, JSONL) and send the kept ones to
        the API. Returns the kept groups."""
        single = isinstance(scored_data, dict)
        record = current_record()
        candidates = [scored_data] if single else list(scored_data or [])
        if self.max_token_len <= 0 and abort_on_any_max_length_exceeded and do_send_to_api:
            log.warning("the trainer's max token length is unknown: groups are not length-checked")
        kept: list[ScoredDataGroup] = []
        for group in candidates:
            if group is None:
                continue
            facts = group.pop(RESCORE_FACTS_FIELD, None)
            if group.get("group_overrides") is None and "group_overrides" in group:
                group["group_overrides"] = {}
            reason = accept.drop_reason(
                group, self.config.group_size, self.config.ensure_scores_are_not_same,
                self.max_token_len, abort_on_any_max_length_exceeded,
            )
            self.completion_lengths.extend(accept.trainable_lengths(group))
            if reason is not None:
                if not self.skipped[reason]:
                    log.warning("%s; later drops are counted, not logged", accept.explain_drop(reason))
                self.skipped[reason] += 1
                continue
            if record is not None:
                stamp_group(group, record)
            accept.complete_group(group, self.tokenizer, self.config.include_messages)
            logged = self.add_rollouts_for_wandb(group, item)
            if inspect.isawaitable(logged):  # Atropos's hook is async; plain overrides work too
                await logged
            if self.jsonl_writer is not None:
                self.jsonl_writer.write(self._saved_row(group, item, facts) + "\n")
                self.jsonl_writer.flush()
            kept.append(group)
        if kept and do_send_to_api:
            await self._send(kept, single)
        return kept

    async def _send(self, groups: list[ScoredDataGroup], single: bool) -> None:
        client = getattr(self, "api", None)
        if client is None:
            raise RuntimeError("not connected to a trajectory API (serve mode sets self.api)")
        payload = [dict(g, env_id=self.env_id, submission_id=uuid.uuid4().hex) for g in groups]
        self.items_sent_this_step += len(payload)
        self.groups_sent += len(payload)
        self.rollouts_sent += sum(len(group["tokens"]) for group in payload)
        if single and len(payload) == 1:
            await client.submit("/scored_data", payload[0])
        else:
            await client.submit("/scored_data_list", payload)

    async def add_rollouts_for_wandb(self, group: ScoredDataGroup, item: Item = None) -> None:
        keep = self.config.num_rollouts_per_group_for_logging
        count = len(group["tokens"]) if keep == -1 else min(keep, len(group["tokens"]))
        self.rollouts_for_wandb.append(
            [(self.tokenizer.decode(group["tokens"][i]), group["scores"][i]) for i in range(count)]
        )
        while len(self.rollouts_for_wandb) > self.config.num_rollouts_to_keep:
            self.rollouts_for_wandb.pop(0)

    # -- logging and checkpoints ---------------------------------------------------------------
    async def wandb_log(self, metrics: Optional[dict[str, Any]] = None) -> None:
        """Add the framework's metrics to `metrics` and log them (no-op without W&B)."""
        metrics = dict(metrics or {})
        server_metrics: dict[str, float] = {}
        for i, server in enumerate(self.server.servers):
            server.wandb_metrics(server_metrics, f"server_{i}")
        if self.completion_lengths:
            lengths = self.completion_lengths
            metrics["train/completion_lengths"] = statistics.fmean(lengths)
            metrics["train/completion_lengths_std"] = statistics.pstdev(lengths)
            metrics["train/completion_lengths_max"] = max(lengths)
            metrics["train/completion_lengths_min"] = min(lengths)
            if self.max_token_len > 0:
                metrics["train/completion_lengths_p95"] = sum(l > 0.95 * self.max_token_len for l in lengths) / len(lengths)
        if self.rollouts_for_wandb and self.wandb.active:
            rows = [[text, score] for group in self.rollouts_for_wandb for text, score in group]
            metrics["train/rollouts"] = self.wandb.table(["text", "score"], rows)
        for key, values in (
            ("train_perf/task_duration", self.task_duration),
            ("train_perf/succeeded_task_duration", self.succeeded_task_duration),
            ("train_perf/failed_task_duration", self.failed_task_duration),
            ("train_perf/mainloop_timings", self.mainloop_timings),
            ("train_perf/workers_added_per_attempt", self.workers_added_list),
        ):
            if len(values) > 1:
                get_std_min_max_avg(key, values, metrics)
                if key == "train_perf/succeeded_task_duration":
                    metrics["train/items_sent_to_api"] = len(values)
                if key == "train_perf/failed_task_duration":
                    metrics["train/items_rejected"] = len(values)
                values.clear()
        metrics.update(self.skipped.metrics())
        self.rollouts_for_wandb.clear()
        self.completion_lengths.clear()
        if self.wandb.active:
            if self.wandb_prepend:
                metrics = {f"{self.wandb_prepend}_{k}": v for k, v in metrics.items()}
            self.wandb.log({**metrics, **server_metrics}, step=self.curr_step)

    def _checkpoint_folder(self) -> Path:
        return Path(self.checkpoint_dir) / "env_checkpoints" / str(self.wandb_prepend)

    def save_checkpoint(self, step: int, data: Optional[dict[str, Any]] = None) -> None:
        """Write `data` as this env's checkpoint for `step` (no-op without data)."""
        if data is None:
            return
        folder = self._checkpoint_folder()
        folder.mkdir(parents=True, exist_ok=True)
        temporary = folder / f".step-{step}.json.tmp"
        temporary.write_text(json.dumps(data))
        os.replace(temporary, folder / f"step-{step}.json")

    def load_checkpoint(self) -> None:
        """Restore attributes from the newest checkpoint at or before the current step."""
        folder = self._checkpoint_folder()
        steps = [int(p.stem.split("-", 1)[1]) for p in folder.glob("step-*.json")] if folder.is_dir() else []
        usable = [s for s in steps if s <= self.curr_step]
        if not usable:
            return
        for key, value in json.loads((folder / f"step-{max(usable)}.json").read_text()).items():
            setattr(self, key, value)

    def evaluate_log(
        self, metrics: dict[str, Any], task_name: Optional[str] = None, model_name: Optional[str] = None,
        start_time: Optional[float] = None, end_time: Optional[float] = None,
        generation_parameters: Optional[dict[str, Any]] = None,
        samples: Optional[list[dict[str, Any]]] = None, verbose: bool = True,
    ) -> "EvaluationLogged":
        """Save evaluation results to ``data_dir_to_save_evals`` (metrics.json, samples.jsonl).

        The results are written before this returns. Atropos's method is a coroutine, so its
        environments ``await`` it: the value returned may be awaited (it does nothing more)."""
        if self.config.data_dir_to_save_evals is None:
            log.warning("data_dir_to_save_evals is not set: evaluation results are not saved")
            return EvaluationLogged()
        write_eval_results(
            metrics,
            eval_dir=self.config.data_dir_to_save_evals,
            task_name=task_name or f"{self.name or type(self).__name__}_eval",
            model_name=model_name or getattr(self.config, "model_name", None) or self.server.servers[0].config.model_name,
            start_time=start_time or self.evaluation_started_at or time.time(),
            end_time=end_time or time.time(),
            generation_parameters={"max_new_tokens": self.config.max_token_length, **(generation_parameters or {})},
            samples=samples,
            verbose=verbose,
        )
        if self.wandb.active:
            self.wandb.log(metrics, step=self.curr_step)
        return EvaluationLogged()

    # -- running ---------------------------------------------------------------------------------
    async def run_evaluation(self) -> None:
        """`evaluate()`, timed: `evaluate_log` reports the wall time since this started."""
        self.evaluation_started_at = time.time()
        await self.evaluate()

    async def env_manager(self) -> None:
        """Serve mode: register with the trajectory API and keep it supplied."""
        from atroposlib.envs.serve_mode import serve

        await serve(self)

    async def process_manager(self) -> None:
        """Process mode: write `total_steps` groups to JSONL and render them as HTML."""
        from atroposlib.envs.process_mode import process

        await process(self)

    @classmethod
    def cli(cls) -> None:
        """Run ``python my_env.py {serve,process,evaluate,check} [flags]``."""
        from atroposlib.envs.runner import main

        main(cls)


def _group_from_items(results: list[tuple[ScoredDataItem, list[Item]]], group_size: int) -> Optional[ScoredDataGroup]:
    if not results:
        return None
    for rollout, _ in results:
        if not isinstance(rollout, dict):
            raise ValueError(f"collect_trajectory must return a dict, got {type(rollout).__name__}")
    group: ScoredDataGroup = ScoredDataGroup(
        tokens=[], masks=[], scores=[], advantages=[], ref_logprobs=[], messages=[], overrides=[], images=[],
        group_overrides={},
    )
    if any(rollout.get("inference_logprobs") is not None for rollout, _ in results):
        group["inference_logprobs"] = []
    for rollout, _ in results:
        group["tokens"].append(rollout["tokens"])
        group["masks"].append(rollout["masks"])
        group["scores"].append(rollout["scores"])
        for key in ("advantages", "ref_logprobs", "messages", "overrides", "images", "inference_logprobs"):
            if rollout.get(key) is not None and key in group:
                group[key].append(rollout[key])
        group["group_overrides"].update(rollout.get("group_overrides") or {})
        if rollout.get("generation_params") is not None and group.get("generation_params") is None:
            group["generation_params"] = rollout["generation_params"]
    if len(results) < group_size:
        group["group_overrides"]["group_size"] = len(results)
    return group
