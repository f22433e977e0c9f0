"""TrainingConfig: Atropos's fields and defaults, the added fields, dtype choice, deprecations."""

from __future__ import annotations

import warnings

import pytest
from pydantic import ValidationError

from example_trainer.config import DEPRECATED_DEFAULTS, TrainingConfig

ATROPOS_DEFAULTS = {
    "lr": 1e-5, "training_steps": 10, "batch_size": 2, "seq_len": 2048, "gradient_accumulation_steps": 32,
    "warmup_steps": 0, "optimizer": "adamw_8bit", "adafactor_scale_parameter": False,
    "adafactor_relative_step": False, "clip_eps": 0.2, "save_path": "trained_model_checkpoints",
    "checkpoint_interval": 3, "vllm_restart_interval": 3, "vllm_port": 9001, "vllm_gpu": None,
    "vllm_gpu_memory_utilization": 0.45, "max_model_len": 4096, "use_wandb": False, "wandb_project": None,
    "wandb_group": None, "weight_bridge_mode": "none", "train_layer_indices": None, "trainer_rank": 0,
    "world_size": 1, "init_method": "env://", "num_inference_nodes": 0, "lora_r": 16, "lora_alpha": 32,
    "lora_dropout": 0.05, "lora_target_modules": None, "lora_layer_indices": None, "single_copy": False,
    "vllm_config_path": None, "debug_loading": False, "benchmark": False, "atropos_url": "http://localhost:8000",
}
ADDED_DEFAULTS = {
    "dtype": "auto", "resume_from": None, "use_env_advantages": False, "missing_logprobs": "on_policy",
    "vllm_stop_during_train": False, "kl_coef": 0.0, "max_prefetch_batches": 4, "vllm_python": None,
    "save_total_limit": 3, "log_dir": "./logs", "lease_seconds": 1800.0, "inference_server_urls": None,
    "slurm_inference_servers": False, "loss_type": "grpo", "epsilon_high": None, "dual_clip": None,
    "tis_cap": None, "scale_rewards": "group", "kl_reference": "sampler", "loss_norm_length": None,
    "match_sampler_truncation": True, "max_staleness": None, "pad_to_multiple": None, "share_prompt_prefix": None, "replace_run": False, "vllm_pause_during_train": None, "vllm_dtype": None,
    "gradient_checkpointing": None, "data_parallel": "ddp", "cpu_allocator": "auto", "vllm_fork_server": True,
}


def test_defaults_are_atroposs_plus_the_added_fields() -> None:
    config = TrainingConfig(model_name="m")
    assert {name: getattr(config, name) for name in ATROPOS_DEFAULTS} == ATROPOS_DEFAULTS
    assert {name: getattr(config, name) for name in ADDED_DEFAULTS} == ADDED_DEFAULTS
    assert set(TrainingConfig.model_fields) == {"model_name", "device"} | set(ATROPOS_DEFAULTS) | set(ADDED_DEFAULTS)


def test_device_defaults_to_what_torch_sees() -> None:
    import torch

    assert TrainingConfig(model_name="m").device == ("cuda" if torch.cuda.is_available() else "cpu")


def test_model_name_is_required_and_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError, match="model_name"):
        TrainingConfig()  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="learning_rate"):
        TrainingConfig(model_name="m", learning_rate=1.0)  # type: ignore[call-arg]


@pytest.mark.parametrize("field,value", [
    ("lr", 0), ("batch_size", 0), ("max_prefetch_batches", 0), ("weight_bridge_mode", "ipc"),
    ("dtype", "int8"), ("missing_logprobs", "skip"), ("save_total_limit", -1), ("train_layer_indices", [-1]),
    ("inference_server_urls", ["gpu02:9000"]), ("loss_type", "ppo"), ("dual_clip", 1.0), ("tis_cap", 0),
    ("scale_rewards", "std"), ("kl_reference", "ref"), ("max_staleness", -2), ("pad_to_multiple", 0),
])
def test_invalid_values_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        TrainingConfig(model_name="m", **{field: value})


def test_registered_batch_size_is_micro_batch_times_accumulation() -> None:
    assert TrainingConfig(model_name="m", batch_size=4, gradient_accumulation_steps=8).registered_batch_size == 32


def test_layer_indices_are_sorted_without_duplicates() -> None:
    assert TrainingConfig(model_name="m", lora_layer_indices=[3, 1, 3]).lora_layer_indices == [1, 3]


def test_lora_targets_default_to_q_and_v() -> None:
    assert TrainingConfig(model_name="m").lora_targets == ["q_proj", "v_proj"]
    assert TrainingConfig(model_name="m", lora_target_modules=["o_proj"]).lora_targets == ["o_proj"]


def test_auto_dtype_on_a_cpu_without_bf16_instructions_is_float32() -> None:
    choice = TrainingConfig(model_name="m", device="cpu").resolved_dtype(cpu_flags={"avx2", "fma"})
    assert choice.dtype == "float32"
    assert "avx512_bf16" in choice.reason


@pytest.mark.parametrize("flags", [{"amx_bf16"}, {"avx512_bf16", "amx_bf16"}])
def test_auto_dtype_on_a_cpu_with_amx_is_bfloat16(flags: set[str]) -> None:
    assert TrainingConfig(model_name="m", device="cpu").resolved_dtype(cpu_flags={"avx2"} | flags).dtype == "bfloat16"


def test_auto_dtype_on_a_cpu_with_avx512_bf16_alone_is_float32_and_names_the_other_choice() -> None:
    choice = TrainingConfig(model_name="m", device="cpu").resolved_dtype(cpu_flags={"avx2", "avx512_bf16"})
    assert choice.dtype == "float32"
    assert "avx512_bf16 without amx_bf16" in choice.reason and "--dtype bfloat16" in choice.reason
    asked = TrainingConfig(model_name="m", device="cpu", dtype="bfloat16").resolved_dtype(cpu_flags={"avx512_bf16"})
    assert asked.dtype == "bfloat16"


def test_auto_dtype_on_cuda_is_bfloat16_and_an_explicit_dtype_wins() -> None:
    assert TrainingConfig(model_name="m", device="cuda:0").resolved_dtype(cpu_flags=set()).dtype == "bfloat16"
    explicit = TrainingConfig(model_name="m", device="cpu", dtype="bfloat16")
    assert explicit.resolved_dtype(cpu_flags=set()).dtype == "bfloat16"
    assert TrainingConfig(model_name="m", device="cuda", dtype="float16").resolved_dtype().dtype == "float16"


def test_resolved_dtype_reads_this_machines_cpu_by_default() -> None:
    assert TrainingConfig(model_name="m", device="cpu").resolved_dtype().dtype in ("bfloat16", "float32")


@pytest.mark.parametrize("field,value", [
    ("num_inference_nodes", 1), ("single_copy", True),
])
def test_deprecated_fields_warn_when_set(field: str, value: object) -> None:
    with pytest.warns(DeprecationWarning, match=field):
        config = TrainingConfig(model_name="m", **{field: value})
    assert getattr(config, field) == value


def test_deprecated_fields_at_their_defaults_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TrainingConfig(model_name="m", **DEPRECATED_DEFAULTS)


def test_remote_inference_servers_need_reload_mode_and_keep_server_roots() -> None:
    config = TrainingConfig(model_name="m", weight_bridge_mode="reload",
                            inference_server_urls=["http://gpu02:9000/v1", "http://gpu02:9000", "http://gpu03:9000/"])
    assert config.inference_server_urls == ["http://gpu02:9000", "http://gpu03:9000"]
    assert config.uses_remote_inference and not TrainingConfig(model_name="m").uses_remote_inference
    for mode in ("none", "lora_only", "lora_restart", "shared_vllm"):
        with pytest.raises(ValidationError, match=f"need --weight-bridge-mode reload .* mode {mode} works"):
            TrainingConfig(model_name="m", weight_bridge_mode=mode, slurm_inference_servers=True)


def test_derived_settings_staleness_bound_and_padding() -> None:
    assert TrainingConfig(model_name="m", vllm_restart_interval=5).registered_max_staleness == 10
    assert TrainingConfig(model_name="m", max_staleness=0).registered_max_staleness == 0
    assert TrainingConfig(model_name="m", max_staleness=-1).registered_max_staleness is None
    assert TrainingConfig(model_name="m", device="cpu").pad_multiple == 1
    assert TrainingConfig(model_name="m", device="cuda:0").pad_multiple == 64
    assert TrainingConfig(model_name="m", device="cpu", pad_to_multiple=8).pad_multiple == 8
    on_cpu, on_gpu = TrainingConfig(model_name="m", device="cpu"), TrainingConfig(model_name="m", device="cuda")
    assert on_cpu.pauses_vllm_during_train and not on_gpu.pauses_vllm_during_train
    assert not on_cpu.uses_gradient_checkpointing and on_gpu.uses_gradient_checkpointing
    assert TrainingConfig(model_name="m", device="cpu", gradient_checkpointing=True).uses_gradient_checkpointing


def test_a_rank_outside_the_world_is_refused() -> None:
    with pytest.raises(ValidationError, match="--trainer-rank 2 is outside a --world-size of 2"):
        TrainingConfig(model_name="m", world_size=2, trainer_rank=2)
