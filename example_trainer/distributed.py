"""The trainer on several processes: torch.distributed, one process per device, DDP or FSDP2.

    torchrun --nproc-per-node 2 -m example_trainer.grpo --model-name M ...       # or: atropos-grpo under torchrun
    atropos-grpo --world-size 2 --trainer-rank 1 --init-method tcp://host:29500  # Atropos's fields, set by hand

Rank 0 alone talks to the trajectory API (registration with the global batch size, leases,
acknowledgements) and to the inference servers (weight syncs); it broadcasts each leased
batch to every rank. Every rank prepares the same batch, keeps its share of the rollouts (every
``world_size``-th after sorting by length, so each rank gets similar lengths) and trains on
them with the step's global sequence and token counts, so the ranks' gradients add up to the
gradient of the whole batch: with ``--data-parallel ddp`` each rank holds the whole model and
gradients are averaged (the loss is multiplied by the world size to turn the average into the
sum); with ``fsdp`` (PyTorch's FSDP2, ``fully_shard`` per transformer block) parameters,
gradients and optimizer state are sharded, in float32, and gathered in the compute dtype
(`example_trainer.precision`), gradients reduced in float32. Checkpoints are always full (rank 0 writes them,
the optimizer state keyed by parameter name), so a run resumes at any world size.

The backend is NCCL on GPUs and gloo on CPUs. A rank that fails ends its process; torchrun
then stops the others, and rank 0, stopped mid-collective or by the signal, gives its leased
batches back to the API.
"""

from __future__ import annotations

import datetime
import gc
import os
import signal
import threading
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from example_trainer.config import TrainingConfig
from example_trainer.precision import precision_for

# Ranks other than 0 wait in a broadcast while rank 0 waits for the environments: allow long waits.
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=4)
# How long a process waits for the others to join before it says so and stops.
JOIN_TIMEOUT = datetime.timedelta(minutes=10)


class DistributedError(RuntimeError):
    """The processes of a distributed run cannot start or go on together."""


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that talks to the API and the inference servers, and writes checkpoints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def ranks_from(config: TrainingConfig, environ: Optional[dict[str, str]] = None) -> Ranks:
    """Where this process stands: torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, else the
    config's ``trainer_rank``/``world_size`` (Atropos's fields), else a single process."""
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" in env and "RANK" in env:
        world, rank = int(env["WORLD_SIZE"]), int(env["RANK"])
        return Ranks(rank=rank, world_size=world, local_rank=int(env.get("LOCAL_RANK", rank)))
    return Ranks(rank=config.trainer_rank, world_size=config.world_size, local_rank=config.trainer_rank)


def start(config: TrainingConfig) -> Ranks:
    """Join the process group (when the run has several processes) and pick this rank's device;
    returns where this process stands. `config.device` becomes ``cuda:<local rank>`` on GPUs."""
    ranks = ranks_from(config)
    if not ranks.distributed:
        return ranks
    if not 0 <= ranks.rank < ranks.world_size:
        raise DistributedError(f"rank {ranks.rank} is outside a world of {ranks.world_size} processes")
    on_gpu = config.device.startswith("cuda")
    if on_gpu:
        torch.cuda.set_device(ranks.local_rank)
        config.device = f"cuda:{ranks.local_rank}"
    if not dist.is_initialized():
        join(ranks, "env://" if "RANK" in os.environ else config.init_method, "nccl" if on_gpu else "gloo")
    return ranks


def join(ranks: Ranks, init_method: str, backend: str) -> None:
    """Meet the other processes at `init_method` (saying so, and stopping after `JOIN_TIMEOUT`),
    then form the process group. Ctrl-C and SIGTERM stop the process at once while it waits:
    the wait is in C++, where Python's handlers do not run, and nothing has been started yet."""
    print(f"rank {ranks.rank} of {ranks.world_size}: waiting for the other processes to join at {init_method} "
          f"(up to {JOIN_TIMEOUT.seconds // 60} min; start ranks 0-{ranks.world_size - 1} with --trainer-rank, "
          "or launch them all with torchrun)", flush=True)
    on_main_thread = threading.current_thread() is threading.main_thread()  # only it may set handlers
    handlers = {signum: signal.signal(signum, signal.SIG_DFL)
                for signum in ((signal.SIGINT, signal.SIGTERM) if on_main_thread else ())}
    try:
        store, _, _ = next(dist.rendezvous(init_method, ranks.rank, ranks.world_size, timeout=JOIN_TIMEOUT))
        store.set_timeout(COLLECTIVE_TIMEOUT)
        dist.init_process_group(backend, store=store, rank=ranks.rank, world_size=ranks.world_size,
                                timeout=COLLECTIVE_TIMEOUT)
    except (RuntimeError, ValueError) as exc:
        raise DistributedError(f"rank {ranks.rank} of {ranks.world_size} could not join the run at {init_method}: "
                               f"{str(exc).strip().splitlines()[0][:200]}") from None
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


# How gloo and NCCL word the loss of a peer when they raise a plain RuntimeError.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "gloo", "NCCL")


def peer_failure(exc: BaseException, ranks: Ranks) -> Optional[DistributedError]:
    """The one-line error for `exc` when it means another process of the run stopped (a
    collective failed); None when it is some other error."""
    if not ranks.distributed or not isinstance(exc, RuntimeError) or isinstance(exc, DistributedError):
        return None
    if not isinstance(exc, dist.DistError) and not any(marker in str(exc) for marker in _PEER_GONE):
        return None
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DistributedError(f"rank {ranks.rank}: another process of the distributed run stopped or cannot be "
                            f"reached ({detail[:200]}); see that process's output for why")


def stop(ranks: Ranks) -> None:
    """Leave the process group of a run of several processes (`leave_process_group`)."""
    if ranks.distributed:
        leave_process_group()


def leave_process_group() -> None:
    """Leave the process group, if there is one, once the garbage that may still hold it is collected.

    DDP's reducer holds the group, and the model it belongs to sits in reference cycles that
    only the collector frees. Were the reducer the group's last holder when the collector ran at
    exit, freeing the group would join its gloo threads with the GIL held (pybind frees the
    reducer without releasing it) while a thread needing the GIL to drop its last tensors waits:
    the process hangs after "Training finished". Collected here, while the group is still
    registered, the reducer lets go of a group that `destroy_process_group` then frees, with the
    GIL released."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def broadcast(value: Any, ranks: Ranks) -> Any:
    """Rank 0's `value`, on every rank."""
    if not ranks.distributed:
        return value
    box = [value if ranks.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(ranks: Ranks) -> None:
    if ranks.distributed:
        dist.barrier()


def sum_floats(values: list[float], ranks: Ranks) -> list[float]:
    """Each value summed over the ranks (float64)."""
    if not ranks.distributed:
        return values
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor)
    return tensor.tolist()


def max_float(value: float, ranks: Ranks) -> float:
    if not ranks.distributed:
        return value
    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def wrap(model: torch.nn.Module, config: TrainingConfig, ranks: Ranks) -> torch.nn.Module:
    """`model` made data-parallel over the ranks (unchanged for a single process)."""
    if not ranks.distributed:
        return model
    if config.data_parallel == "fsdp":
        return _fully_shard(model, precision_for(config, ranks.world_size).fsdp_policy())
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [ranks.local_rank] if config.device.startswith("cuda") else None
    return DistributedDataParallel(model, device_ids=device_ids)


def _fully_shard(model: torch.nn.Module, policy: Any) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    blocks = [module for name, module in model.named_modules() if _is_block(name)]
    for block in blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def _is_block(name: str) -> bool:
    """A transformer block: ``...layers.<i>`` (Llama, Qwen, Mistral, ...) or ``...h.<i>`` (GPT-2)."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-2] in ("layers", "h") and parts[-1].isdigit()


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DDP wrapper (FSDP2 shards in place: the model is itself)."""
    return model.module if hasattr(model, "module") and type(model).__name__ == "DistributedDataParallel" else model


def full_model_state(model: torch.nn.Module, ranks: Ranks) -> Optional[dict[str, torch.Tensor]]:
    """The full (unsharded) state dict on rank 0, None elsewhere; every rank must call it."""
    if not ranks.distributed:
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state if ranks.is_main else None


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state keyed by parameter name, full (unsharded), on CPU: loadable at any
    world size. Every rank must call it; only rank 0's copy is complete."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True,
                                                                                cpu_offload=True))


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a state `full_optimizer_state` wrote, resharded for this run."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, optim_state_dict=state,
                             options=StateDictOptions(full_state_dict=True))


class SharedFeed:
    """The batches rank 0 leases from the API, handed to every rank.

    Rank 0 holds the `BatchFeed` (leases, acknowledgements, giving batches back when it stops);
    the other ranks get each batch's groups by broadcast. ``next`` returns (the lease on rank 0,
    None elsewhere; the groups, on every rank)."""

    def __init__(self, feed: Optional[Any], ranks: Ranks) -> None:
        self.feed = feed
        self.ranks = ranks

    def next(self) -> tuple[Optional[Any], list[dict[str, Any]]]:
        leased = self.feed.next() if self.feed is not None else None
        return leased, broadcast(leased.items if leased is not None else None, self.ranks)

    def ack(self, leased: Optional[Any]) -> Optional[int]:
        """Commit the batch (rank 0); the API's step there, None elsewhere."""
        return self.feed.ack(leased) if self.feed is not None and leased is not None else None
