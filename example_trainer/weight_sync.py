"""Weight sync: how the trainer's new weights reach the vLLM server the environments sample from.

The training loop (`example_trainer.trainers.train`) is the same in every weight-bridge mode;
after a sync step it saves a checkpoint and hands its folder to the mode's `WeightSync`:

==============  ==============================================  =======================================
mode            vLLM                                            after a sync step
==============  ==============================================  =======================================
``none``        started by the trainer on the base model        restarted on ``step_N/``
``reload``      started by the trainer on the base model        ``step_N/`` read in place, no restart
``reload`` with started by the user (the bundled server), on    ``step_N/`` read in place by every one
remote servers  other machines, on the base model               (and ``final_model/`` at the end)
``lora_only``   started by the user with ``--enable-lora``      ``adapter_step_N/`` hot-swapped (and
                                                                ``final_adapter/`` at the end)
``lora_restart``started by the trainer with ``--enable-lora``   restarted with ``adapter_step_N/``
==============  ==============================================  =======================================

Remote servers are ``--inference-server-urls`` or ``--slurm-inference-servers``
(`example_trainer.inference_servers`); only ``reload`` can use them.

``shared_vllm`` (one copy of the weights shared with vLLM through CUDA IPC) has no strategy
here: it needs a GPU (see `example_trainer.trainers.train_shared_vllm`).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

from example_trainer.config import REMOTE_NEEDS_RELOAD, TrainingConfig
from example_trainer.inference_servers import InferenceServers
from atroposlib.local.vllm_service import PortInUseError, port_in_use
from example_trainer.vllm_manager import (SERVER_SCRIPT, TrainerVLLM, VLLMPythonNotFoundError, check_vllm_health,
                                         hotswap_lora_adapter)


class WeightSyncError(RuntimeError):
    """vLLM could not be given the new weights (or was not there to receive them)."""


class WeightSync(ABC):
    """One mode's vLLM life cycle: `start` before the first step, `publish` after each sync
    step, and (as a context manager) stopping whatever it started, however training ends."""

    saves_adapters = False

    def __init__(self, config: TrainingConfig, vllm: Optional[TrainerVLLM]) -> None:
        self.config = config
        self.vllm = vllm
        self.can_pause = True

    def launch(self, policy_version: int) -> None:
        """Start the trainer's own vLLM on `served_model` as the run's first `policy_version`
        before the trainer loads its model, so that the two load side by side; `start` then waits
        for it. On a CPU only: there each is mostly one core's work (on 2 cores the trainer end to
        end took 6 s less), while on a GPU vLLM sizes its cache by the memory free as it starts."""
        if self.vllm is not None and self.vllm.on_cpu:
            self.vllm.launch(self.served_model(), policy_version)

    def served_model(self) -> str:
        """The model vLLM starts on: the checkpoint the run resumes from, else the base model."""
        return self.config.resume_from or self.config.model_name

    def start(self, weights: str, policy_version: int) -> float:
        """Make vLLM serve `weights` (a model folder or name, or an adapter folder in the LoRA
        modes) as `policy_version`, the step they are from; returns the seconds it took."""
        assert self.vllm is not None
        return self.vllm.start(weights, policy_version=policy_version)

    def before_training(self, sync_step: bool) -> None:
        """Called before each training step; vLLM keeps serving unless told otherwise."""
        if sync_step and self.config.vllm_stop_during_train and self.vllm is not None:
            self.vllm.stop()

    @contextmanager
    def training(self) -> Iterator[None]:
        """Around each training step, the writing of its checkpoint and `publish`: with
        ``vllm_pause_during_train`` (the default on a CPU, where vLLM and the trainer share the
        cores), the trainer's own vLLM freezes its requests meanwhile and goes on with them after
        (in ``reload`` mode on the new weights: a frozen server reloads without draining them)."""
        pause = (self.config.pauses_vllm_during_train and self.can_pause and self.vllm is not None
                 and self.vllm.is_running())
        if pause:
            assert self.vllm is not None
            pause = self.can_pause = self.vllm.pause_generation()
            if not pause:
                print("the vLLM server has no /bridge/pause route: it keeps generating while steps train")
        try:
            yield
        finally:
            if pause and self.vllm is not None and self.vllm.is_running():
                self.vllm.resume_generation()

    @abstractmethod
    def publish(self, checkpoint: str, step: int) -> float:
        """Give vLLM the weights saved in `checkpoint` after `step` (their policy version);
        returns the seconds it took."""

    def finish(self, final: str, step: int) -> None:
        """Called with the final weights after the last step, `step`. A server the trainer
        started stops right after, so giving them to it would only delay the end."""

    def close(self) -> None:
        if self.vllm is not None:
            self.vllm.close()

    def __enter__(self) -> "WeightSync":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class RestartSync(WeightSync):
    """``none``: restart vLLM on each new checkpoint (Atropos's legacy mode), serving under the
    same model name so the environments notice nothing but a short outage."""

    def publish(self, checkpoint: str, step: int) -> float:
        assert self.vllm is not None
        return self.vllm.restart(checkpoint, policy_version=step)


class ReloadSync(WeightSync):
    """``reload``: vLLM keeps running and reads the new checkpoint in place (no restart, no
    outage: generation pauses for the reload only)."""

    def before_training(self, sync_step: bool) -> None:
        """vLLM never stops in this mode: the reload needs the running engine."""

    def publish(self, checkpoint: str, step: int) -> float:
        assert self.vllm is not None
        return self.vllm.reload_weights(checkpoint, policy_version=step)


class LoraHotSwapSync(WeightSync):
    """``lora_only``: the user runs vLLM with ``--enable-lora``; each new adapter is loaded into
    it by name (``step_N``), and the server, which outlives the run, ends on ``final_adapter``."""

    saves_adapters = True

    def start(self, weights: str, policy_version: int) -> float:
        """Load the run's first adapter: the resumed one, or a fresh (no-op) one that replaces
        whatever adapter the server was left with."""
        port = self.config.vllm_port
        if not check_vllm_health(port):
            raise WeightSyncError(f"lora_only needs a vLLM server with LoRA on port {port}, and none answers "
                                  f"there; start one with\n  {self._launch_command()}")
        return self._hotswap(Path(weights).name, weights, policy_version)

    def _launch_command(self) -> str:
        """The command the trainer would run itself (python, flags, CPU environment)."""
        try:
            vllm = TrainerVLLM(self.config, Path(self.config.log_dir) / "vllm.log")
        except VLLMPythonNotFoundError as exc:
            return (f"PYTHON_WITH_VLLM {SERVER_SCRIPT} --model {self.config.model_name} --port {self.config.vllm_port} "
                    f"--enable-lora --enforce-eager\n({exc})")
        return vllm.command_line(self.config.model_name)

    def before_training(self, sync_step: bool) -> None:
        """The server is the user's: the trainer never stops it."""

    def publish(self, checkpoint: str, step: int) -> float:
        return self._hotswap(f"step_{step}", checkpoint, step)

    def finish(self, final: str, step: int) -> None:
        print(f"vLLM now serves {final} ({self._hotswap(Path(final).name, final, step):.1f} s)")

    def _hotswap(self, name: str, adapter: str, policy_version: int) -> float:
        started = time.monotonic()
        if not hotswap_lora_adapter(name, adapter, self.config.vllm_port, policy_version):
            raise WeightSyncError(f"vLLM on port {self.config.vllm_port} did not load the adapter in {adapter}")
        return time.monotonic() - started


class LoraRestartSync(WeightSync):
    """``lora_restart``: vLLM runs the frozen base model with LoRA enabled; after each sync step
    it is restarted and given the new adapter."""

    saves_adapters = True

    def served_model(self) -> str:
        return self.config.model_name

    def start(self, weights: str, policy_version: int) -> float:
        assert self.vllm is not None
        return self.vllm.start(self.served_model(), adapter=weights, policy_version=policy_version)

    def publish(self, checkpoint: str, step: int) -> float:
        assert self.vllm is not None
        return self.vllm.restart(self.config.model_name, adapter=checkpoint, policy_version=step)


class RemoteReloadSync(WeightSync):
    """``reload`` with remote inference servers: the trainer runs no vLLM; every server reads
    each new checkpoint in place, and the final weights too, as the servers outlive the run."""

    def __init__(self, config: TrainingConfig, servers: InferenceServers) -> None:
        super().__init__(config, None)
        self.servers = servers

    def start(self, weights: str, policy_version: int) -> float:
        """The servers already serve the base model; a resumed run gives them its checkpoint."""
        print(f"inference servers taking the weights ({len(self.servers.roots)}): {', '.join(self.servers.roots)}")
        return 0.0 if weights == self.config.model_name else self.servers.reload(weights, policy_version)

    def before_training(self, sync_step: bool) -> None:
        """The servers are not the trainer's: they keep serving."""

    def publish(self, checkpoint: str, step: int) -> float:
        return self.servers.reload(checkpoint, step)

    def finish(self, final: str, step: int) -> None:
        print(f"inference servers now serve {final} ({self.servers.reload(final, step):.1f} s)")


class FollowerSync(WeightSync):
    """Every rank but 0 of a distributed run: rank 0 alone hands the weights to vLLM."""

    def __init__(self, config: TrainingConfig) -> None:
        super().__init__(config, None)
        self.saves_adapters = config.weight_bridge_mode in ("lora_only", "lora_restart")

    def start(self, weights: str, policy_version: int) -> float:
        return 0.0

    def before_training(self, sync_step: bool) -> None:
        """Nothing to stop: this rank runs no vLLM."""

    def publish(self, checkpoint: str, step: int) -> float:
        return 0.0

    def finish(self, final: str, step: int) -> None:
        """Rank 0 gives the final weights to the servers that outlive the run."""


STRATEGIES: dict[str, type[WeightSync]] = {
    "none": RestartSync,
    "reload": ReloadSync,
    "lora_only": LoraHotSwapSync,
    "lora_restart": LoraRestartSync,
}


def make_weight_sync(config: TrainingConfig) -> WeightSync:
    """The strategy for `config.weight_bridge_mode`; vLLM's log goes to ``<log_dir>/vllm.log``.
    Remote inference servers are found and checked here, so that an unreachable one stops the
    run before the model loads."""
    if config.uses_remote_inference:
        if config.weight_bridge_mode != "reload":
            raise WeightSyncError(REMOTE_NEEDS_RELOAD.format(mode=config.weight_bridge_mode))
        servers = InferenceServers.from_config(config)
        servers.check()
        return RemoteReloadSync(config, servers)
    strategy = STRATEGIES.get(config.weight_bridge_mode)
    if strategy is None:
        raise WeightSyncError(f"weight_bridge_mode {config.weight_bridge_mode!r} has no weight sync here; "
                              f"choose one of {', '.join(STRATEGIES)}")
    owns_vllm = strategy is not LoraHotSwapSync
    if owns_vllm and port_in_use(config.vllm_port):  # before registering with the API, not after the model load
        raise PortInUseError(f"--vllm-port {config.vllm_port} is already in use by another process: stop it or "
                             "choose another port (it is never stopped for you)")
    vllm = TrainerVLLM(config, Path(config.log_dir) / "vllm.log") if owns_vllm else None
    return strategy(config, vllm)
