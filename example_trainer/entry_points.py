"""Which function trains each ``--weight-bridge-mode``, and the errors that end a run with one
``error:`` line rather than a traceback (`example_trainer.grpo.run_training` turns them into
exit statuses). Importing this loads torch and transformers."""

from __future__ import annotations

from typing import Callable

import requests

from atroposlib.local.vllm_service import VLLMStartError
from example_trainer.api import AtroposApiError
from example_trainer.checkpointing import CheckpointError
from example_trainer.config import TrainingConfig
from example_trainer.distributed import DistributedError
from example_trainer.inference_servers import InferenceServerError
from example_trainer.trainers import (GpuRequiredError, RegistrationMismatchError, TrainerError, train_legacy,
                                      train_lora, train_lora_restart, train_shared_vllm)
from example_trainer.vllm_manager import PortInUseError, VLLMPythonNotFoundError, VLLMRequestError
from example_trainer.weight_sync import WeightSyncError

__all__ = ["ENTRY_POINTS", "STOPPING_ERRORS", "GpuRequiredError", "RegistrationMismatchError", "train_legacy"]

ENTRY_POINTS: dict[str, Callable[[TrainingConfig], None]] = {
    "shared_vllm": train_shared_vllm,
    "lora_only": train_lora,
    "lora_restart": train_lora_restart,
}
STOPPING_ERRORS = (TrainerError, WeightSyncError, InferenceServerError, VLLMStartError, PortInUseError,
                   VLLMPythonNotFoundError, VLLMRequestError, AtroposApiError, CheckpointError,
                   DistributedError, requests.RequestException, OSError)
