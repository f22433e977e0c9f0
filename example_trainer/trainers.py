"""The GRPO training loop, and Atropos's entry points for each weight-bridge mode.

`train` reads top to bottom: prepare the weight sync (remote inference servers are checked
here), load the model, register with the trajectory API, start vLLM, then per step take a
batch, train on it, and, every ``vllm_restart_interval`` steps, save a checkpoint and hand
it to vLLM (how depends on the mode: `example_trainer.weight_sync`). A batch is acknowledged
to the API only after the step that used it, so the API's step equals the trainer's and a
trainer that dies mid-step loses no data (the lease runs out and the batch is served again).

Each checkpoint reaches vLLM with its step as the *policy version* the server then reports,
so every group says which weights sampled it; the trainer logs each batch's staleness (its
step minus the groups' versions) and registers ``--max-staleness``, beyond which the API
serves no group (`atroposlib.policy_version`).

Under torchrun (or with ``--world-size``) every process runs `train`; rank 0 alone talks to
the API and vLLM and hands each batch to the others, and every rank trains its share of it
(`example_trainer.distributed`).
"""

from __future__ import annotations

import shutil
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
import transformers

from atroposlib.local.allocator import describe_allocator
from atroposlib.policy_version import staleness
from example_trainer import distributed
from example_trainer.api import AtroposApiError, BatchFeed, check_atropos_api, register_trainer
from example_trainer.checkpointing import (TrainerState, load_resume_state, restore_optimizer_and_rng,
                                           save_checkpoint, save_lora_checkpoint, save_tokenizer)
from example_trainer.config import TrainingConfig
from example_trainer.data import PreparedBatch, prepare_batch
from example_trainer.distributed import Ranks, SharedFeed
from example_trainer.logprobs import ReferenceLogprobs
from example_trainer.model import load_model_and_tokenizer, reference_logprobs
from example_trainer.precision import precision_for
from example_trainer.training import (create_optimizer, finalize_training, log_metrics, run_training_step,
                                      setup_wandb)
from example_trainer.vllm_manager import GenerationMeter
from example_trainer.weight_sync import FollowerSync, WeightSync, make_weight_sync


class TrainerError(RuntimeError):
    """Training cannot start or go on; the message says why in one line."""


class GpuRequiredError(TrainerError):
    """The chosen mode needs an NVIDIA GPU and this machine has none."""


class RegistrationMismatchError(TrainerError):
    """The API holds a run registered with settings this trainer would silently break."""


# Registered settings that change what a batch is: a trainer must not carry on with another run's.
BATCH_SHAPING = ("batch_size", "max_token_len", "max_staleness")
# Steps in a row whose loss or gradient norm was not finite (each skipped) before the run stops.
MAX_SKIPPED_STEPS = 3


@dataclass
class Run:
    """What the steps of one training run share."""

    config: TrainingConfig
    model: torch.nn.Module
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    sync: WeightSync
    feed: SharedFeed
    use_wandb: bool
    reference: Optional[ReferenceLogprobs] = None
    ranks: Ranks = Ranks()
    generation: GenerationMeter = field(default_factory=lambda: GenerationMeter(None))
    scaler: Optional[torch.amp.GradScaler] = None
    skipped_in_a_row: int = 0
    timings: dict[str, list[float]] = field(default_factory=lambda: {
        "step_times": [], "sync_times": [], "data_fetch_times": [], "checkpoint_times": []})


def train(config: TrainingConfig) -> None:
    """Train for ``config.training_steps`` optimizer steps, one API batch each."""
    ranks = distributed.start(config)
    try:
        train_ranks(config, ranks)
    except BaseException as exc:
        if ranks.distributed:  # the failed frames' locals hold the DDP model, to be freed before the group
            traceback.clear_frames(exc.__traceback__)  # (distributed.stop); one process keeps them for debuggers
        failure = distributed.peer_failure(exc, ranks)
        if failure is None:
            raise
        raise failure from None
    finally:
        distributed.stop(ranks)


def train_ranks(config: TrainingConfig, ranks: Ranks) -> None:
    """`train` on this process, one of ``ranks.world_size``; rank 0 alone talks to the API and vLLM."""
    if ranks.is_main:
        announce(config, ranks)
    # a line per step is the trainer's progress; transformers' per-file bars would interleave with it
    transformers.utils.logging.disable_progress_bar()
    check_inputs(config, ranks)
    # before the slow model load: no python for vLLM, or a remote server that cannot take weights, fails at once
    with (make_weight_sync(config) if ranks.is_main else FollowerSync(config)) as sync:
        sync.launch(load_resume_state(config.resume_from).step if config.resume_from else 0)
        model, tokenizer = load_model_and_tokenizer(config)
        reference = reference_logprobs(model, config)
        model = distributed.wrap(model, config, ranks)
        optimizer = create_optimizer(model, config)
        first_step = resume(config, model, optimizer)
        if ranks.is_main:
            Path(config.save_path).mkdir(parents=True, exist_ok=True)
            register(config, first_step)
        use_wandb = setup_wandb(config) if ranks.is_main else False
        started = time.time()
        with leased_batches(config, ranks) as feed:
            run = Run(config, model, tokenizer, optimizer, sync, SharedFeed(feed, ranks), use_wandb, reference, ranks,
                      GenerationMeter(sync.vllm), precision_for(config, ranks.world_size).grad_scaler())
            initial = save(run, first_step) if sync.saves_adapters else config.resume_from or config.model_name
            ready = sync.start(initial, first_step)
            if ranks.is_main:
                print(f"vLLM ready in {ready:.1f} s")
            for step in range(first_step, config.training_steps):
                train_step(run, step)
            final = save(run, config.training_steps, final=True)
            if ranks.is_main:
                print(f"final weights: {final}")
            sync.finish(final, config.training_steps)
    if ranks.is_main:
        finalize_training(use_wandb, started, mode=config.weight_bridge_mode,
                          total_steps=config.training_steps - first_step, benchmark_stats=run.timings,
                          benchmark=config.benchmark)


@contextmanager
def leased_batches(config: TrainingConfig, ranks: Ranks) -> Iterator[Optional[BatchFeed]]:
    """Rank 0's feed of leased batches (given back however training ends); None on other ranks."""
    if not ranks.is_main:
        yield None
        return
    with BatchFeed(config.atropos_url, config.max_prefetch_batches, config.lease_seconds) as feed:
        yield feed


def train_step(run: Run, step: int) -> None:
    """One optimizer step on the next batch, then (on a sync step) the new weights to vLLM."""
    config = run.config
    fetch_started = time.monotonic()
    leased, items = run.feed.next()
    batch = prepare_batch(items, config.batch_size, use_env_advantages=config.use_env_advantages,
                          pad_multiple=config.pad_multiple, pack=True, scale_rewards=config.scale_rewards,
                          max_length=config.seq_len, rank=run.ranks.rank, world_size=run.ranks.world_size,
                          share_prefix=config.shares_prompt_prefix and not run.ranks.distributed)
    data_fetch_time = time.monotonic() - fetch_started
    done = step + 1
    last = done == config.training_steps
    sync_step = done % max(config.vllm_restart_interval, 1) == 0 or last
    run.sync.before_training(sync_step)
    step_started = time.monotonic()
    # the checkpoint is written and handed over inside the pause too: beside a generating vLLM, writing it
    # took 1.4-2 s on 2 cores instead of 0.8 s, and a frozen vLLM reloads at once (nothing to drain) and
    # goes on with the requests it holds on the new weights
    with run.sync.training():
        metrics = run_training_step(run.model, run.optimizer, batch, config, step, run.reference, run.ranks,
                                    run.scaler)
        step_time = time.monotonic() - step_started
        check_finite(run, metrics, done)
        saving_started = time.monotonic()
        checkpoint = (save(run, done, recovery=checkpoint_due(config, done))
                      if sync_step or checkpoint_due(config, done) else None)
        checkpoint_time = time.monotonic() - saving_started if checkpoint is not None else 0.0
        sync_time = 0.0
        # after the last step vLLM is about to stop: publishing would only delay the end
        if checkpoint is not None and sync_step and not last and run.ranks.is_main:
            sync_time = run.sync.publish(checkpoint, done)
            print(f"step {done}: vLLM now serves {checkpoint} ({sync_time:.1f} s)")
    try:
        api_step = run.feed.ack(leased)
    except AtroposApiError as err:
        raise TrainerError(f"{err}{set_aside(checkpoint)}") from None
    if not run.ranks.is_main:
        return
    for name, value in (("step_times", step_time), ("sync_times", sync_time), ("data_fetch_times", data_fetch_time),
                        ("checkpoint_times", checkpoint_time)):
        run.timings[name].append(value)
    scores = [score for item in items for score in item["scores"]]
    metrics.update(step_time=step_time, sync_time=sync_time, data_fetch_time=data_fetch_time,
                   checkpoint_time=checkpoint_time,
                   mean_score=sum(scores) / len(scores), **staleness_metrics(batch, step))
    metrics["train/tokens_per_s"] = batch.positions / step_time if step_time > 0 else 0.0
    generation = run.generation.tokens_per_s()
    if generation is not None:
        metrics["vllm/generation_tokens_per_s"] = generation
    log_metrics(metrics, done, run.use_wandb, benchmark=config.benchmark, extra_metrics={
        "train/batch_mean_score": metrics["mean_score"], "train/sequences": batch.num_sequences,
        "train/api_step": api_step})


def set_aside(checkpoint: Optional[str]) -> str:
    """Rename the checkpoint of a step whose batch the API did not take back as trained (resuming
    from it would train that batch twice); the words that say so, or '' without one."""
    if checkpoint is None or not Path(checkpoint).is_dir():
        return ""
    aside = Path(f"{checkpoint}.unacknowledged")
    shutil.rmtree(aside, ignore_errors=True)
    Path(checkpoint).rename(aside)
    return f"; {checkpoint} was written before that and is set aside as {aside.name}: resume from the step before it"


def check_finite(run: Run, metrics: dict[str, Any], done: int) -> None:
    """Stop the run (`TrainerError`) after `MAX_SKIPPED_STEPS` steps in a row skipped for a
    non-finite loss or gradient norm; the batch of the last one is not acknowledged."""
    run.skipped_in_a_row = run.skipped_in_a_row + 1 if metrics.get("train/skipped_step") else 0
    if run.skipped_in_a_row >= MAX_SKIPPED_STEPS:
        raise TrainerError(f"steps {done - run.skipped_in_a_row + 1}-{done} all had a non-finite loss or gradient "
                           f"norm (loss {metrics['loss']}, grad norm {metrics['grad_norm']}) and changed nothing: "
                           "lower --lr, or check the rollouts' inference_logprobs and scores")


def staleness_metrics(batch: PreparedBatch, step: int) -> dict[str, float]:
    """How many steps old the weights that sampled the batch's groups are, trained at `step`."""
    known = [value for value in (staleness(step, v) for v in batch.policy_versions) if value is not None]
    metrics: dict[str, float] = {"staleness/unknown_groups": len(batch.policy_versions) - len(known)}
    if known:
        metrics.update({"staleness/mean": sum(known) / len(known), "staleness/max": max(known)})
    return metrics


def register(config: TrainingConfig, first_step: int) -> None:
    """Register with the API; a stored run whose batch-shaping settings differ stops the trainer
    (`RegistrationMismatchError`) unless ``--replace-run`` replaces them."""
    answer = register_trainer(config, starting_step=first_step)
    values = answer.get("config_mismatch_values") or {}
    differing = [name for name in answer.get("config_mismatch") or [] if name in BATCH_SHAPING]
    if differing:
        described = ", ".join(
            f"{name} {values.get(name, {}).get('stored', '?')} (this trainer: {values.get(name, {}).get('requested', '?')})"
            for name in differing)
        if not config.replace_run:
            raise RegistrationMismatchError(
                f"the API at {config.atropos_url} holds a run registered with {described}: pass --replace-run to "
                "replace its settings (queued groups stay), or start run-api on a fresh database")
        register_trainer(config, starting_step=first_step, replace=True)
        print(f"replaced the API's run settings ({described})")
    elif answer.get("registered") in ("existing", "restored") and answer.get("current_step", first_step) != first_step:
        held = answer["current_step"]
        if not config.replace_run:
            raise RegistrationMismatchError(
                f"the API at {config.atropos_url} holds a run at step {held} and this trainer starts at step "
                f"{first_step}: {resume_hint(config, held)}pass --replace-run to restart the run at step {first_step} "
                "(queued groups stay), or start run-api with --fresh")
        register_trainer(config, starting_step=first_step, replace=True)
        print(f"the API's run was at step {held}: restarted at step {first_step} (--replace-run)")
    staleness_bound = config.registered_max_staleness
    print(f"registered with {config.atropos_url}: {config.registered_batch_size} sequences per batch, "
          f"max {config.seq_len} tokens, staleness bound "
          f"{'none' if staleness_bound is None else f'{staleness_bound} steps'}, starting at step {first_step}")


def resume_hint(config: TrainingConfig, step: int) -> str:
    """'resume it with --resume-from ...; ' when this run's checkpoint of `step` is there."""
    for name in (f"step_{step}", f"adapter_step_{step}"):
        if (Path(config.save_path) / name / "trainer_state.json").is_file():
            return f"resume it with --resume-from {Path(config.save_path) / name}, "
    return ""


def checkpoint_due(config: TrainingConfig, done: int) -> bool:
    """A recovery checkpoint every ``checkpoint_interval`` steps (0: none besides the syncs)."""
    return config.checkpoint_interval > 0 and done % config.checkpoint_interval == 0


def save(run: Run, step: int, final: bool = False, recovery: bool = True) -> str:
    """The model (or its adapter, in the LoRA modes); with `recovery` (the final checkpoint and
    every ``--checkpoint-interval`` steps) also the optimizer state `resume` needs. A checkpoint
    written only to hand vLLM new weights leaves the optimizer state out: it is twice the size
    of the weights and vLLM never reads it. Every rank calls this (a sharded model is gathered);
    rank 0 writes; every rank gets the path."""
    config, ranks = run.config, run.ranks
    state = TrainerState(step=step, model_name=config.model_name, atropos_url=config.atropos_url,
                         weight_bridge_mode=config.weight_bridge_mode, dtype=config.resolved_dtype().dtype)
    weights = distributed.full_model_state(run.model, ranks)
    optimizer_state = (distributed.full_optimizer_state(run.model, run.optimizer) if recovery or final else None)
    model = distributed.unwrapped(run.model)
    path = None
    if ranks.is_main and run.sync.saves_adapters:
        if final:  # an adapter folder holds no tokenizer: one copy next to the adapters (Atropos's layout)
            save_tokenizer(run.tokenizer, config.save_path)
        path = save_lora_checkpoint(model, config.save_path, step, is_final=final, optimizer_state=optimizer_state,
                                    state=state, save_total_limit=config.save_total_limit)
    elif ranks.is_main:
        path = save_checkpoint(model, run.tokenizer, config.save_path, step, is_final=final, state_dict=weights,
                               optimizer_state=optimizer_state, state=state, save_total_limit=config.save_total_limit)
    return distributed.broadcast(path, ranks)


def resume(config: TrainingConfig, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """The first step to train: 0, or the step of the ``resume_from`` checkpoint, whose
    optimizer (at this run's world size) and random-number states are restored."""
    if not config.resume_from:
        return 0
    state = load_resume_state(config.resume_from)
    if not state.has_optimizer:
        print(f"warning: {config.resume_from} holds weights only (a checkpoint written for vLLM between recovery "
              "checkpoints): the optimizer starts afresh; resume from a step that is a multiple of "
              "--checkpoint-interval, or the final model, to continue exactly")
    restore_optimizer_and_rng(config.resume_from, optimizer, model)
    if state.step >= config.training_steps:
        raise TrainerError(f"{config.resume_from} is at step {state.step}, already at --training-steps "
                           f"{config.training_steps}: raise --training-steps to train further")
    print(f"resuming from {config.resume_from} at step {state.step}")
    return state.step


def check_inputs(config: TrainingConfig, ranks: Ranks = Ranks()) -> None:
    """Fail in one line, before the slow model load, on a model folder that is not there, a
    trajectory API that does not answer (rank 0 asks it) or a data-parallel setting this run
    cannot use."""
    looks_like_path = config.model_name.startswith((".", "/", "~")) or Path(config.model_name).exists()
    if looks_like_path and not (Path(config.model_name).expanduser() / "config.json").exists():
        raise TrainerError(f"no model folder at {config.model_name} (a folder with config.json, or a Hugging Face "
                           "model id; `atropos-prepare-model` makes one from the bundled SmolLM2)")
    if ranks.distributed and config.data_parallel == "fsdp" and config.weight_bridge_mode in ("lora_only",
                                                                                           "lora_restart"):
        raise TrainerError("--data-parallel fsdp shards full models; LoRA adapters train with --data-parallel ddp")
    if ranks.distributed and config.data_parallel == "fsdp" and config.resolved_dtype().dtype == "float16":
        raise TrainerError("--dtype float16 needs loss scaling, which this trainer does not do on FSDP shards: "
                           "use --dtype bfloat16, or --data-parallel ddp")
    if ranks.is_main and not check_atropos_api(config.atropos_url):
        raise TrainerError(f"no trajectory API answers at {config.atropos_url}: start one with `run-api` "
                           "or pass --atropos-url")


def announce(config: TrainingConfig, ranks: Ranks = Ranks()) -> None:
    dtype = config.resolved_dtype()
    # in lora_only, and with remote inference servers, the servers (and their logs) are the user's
    if config.uses_remote_inference:
        vllm = "vLLM: " + ("the Slurm job's inference servers" if config.slurm_inference_servers
                           else ", ".join(config.inference_server_urls or []))
    elif config.weight_bridge_mode == "lora_only":
        vllm = f"vLLM: yours, on port {config.vllm_port}"
    else:
        vllm = f"vLLM log: {Path(config.log_dir) / 'vllm.log'}"
        if config.vllm_dtype is not None:
            vllm += f", serving in {config.resolved_vllm_dtype().dtype} (--vllm-dtype)"
    processes = f", {ranks.world_size} processes ({config.data_parallel})" if ranks.distributed else ""
    precision = precision_for(config, ranks.world_size).describe()
    print(f"GRPO trainer: {config.model_name}, mode {config.weight_bridge_mode}, {config.training_steps} steps "
          f"on {config.device}{processes}\n  dtype: {precision} ({dtype.reason})\n"
          f"  memory allocator: {describe_allocator(config.cpu_allocator, config.device)}\n"
          f"  checkpoints: {config.save_path}, {vllm}")


def with_mode(config: TrainingConfig, mode: str, allowed: tuple[str, ...] = ()) -> TrainingConfig:
    """`config` in `mode`, unless its own mode is one of `allowed`."""
    if config.weight_bridge_mode in allowed:
        return config
    return config.model_copy(update={"weight_bridge_mode": mode})


def train_legacy(config: TrainingConfig) -> None:
    """Full-model training; vLLM restarted on each checkpoint (``none``) or, with
    ``weight_bridge_mode="reload"``, updated in place."""
    train(with_mode(config, "none", allowed=("none", "reload")))


def train_lora(config: TrainingConfig) -> None:
    """LoRA training with adapters hot-swapped into a running vLLM (``lora_only``)."""
    train(with_mode(config, "lora_only"))


def train_lora_restart(config: TrainingConfig) -> None:
    """LoRA training with vLLM restarted on each adapter (``lora_restart``)."""
    train(with_mode(config, "lora_restart"))


def train_shared_vllm(config: TrainingConfig, bridge_config_path: Optional[str] = None) -> None:
    """``shared_vllm``: the trainer would update vLLM's own weight tensors through CUDA IPC.

    That needs an NVIDIA GPU shared with vLLM, and this release has no implementation of the
    IPC attachment: use ``reload`` (new weights read in place after each sync, no restart) or
    ``none``."""
    if not torch.cuda.is_available():
        raise GpuRequiredError("weight_bridge_mode shared_vllm shares CUDA memory with vLLM and this machine "
                               "has no GPU: use --weight-bridge-mode reload (in-place update) or none")
    raise TrainerError("weight_bridge_mode shared_vllm is not available in this release: use "
                       "--weight-bridge-mode reload (in-place update, no restart) or none")
