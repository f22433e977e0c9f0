"""Loading the policy model: dtype, attention, gradient checkpointing, layer freezing, LoRA
and resuming, on a tiny saved Llama."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from example_trainer import model as model_module
from example_trainer.config import TrainingConfig
from example_trainer.model import apply_train_layer_filter, attention_implementation, load_model_and_tokenizer
from tests.example_trainer.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"), tokenizer_dir)


def config(model_dir: Path, **overrides: Any) -> TrainingConfig:
    return TrainingConfig(model_name=str(model_dir), device="cpu", dtype="float32", **overrides)


def trainable_names(model: torch.nn.Module) -> list[str]:
    return [name for name, param in model.named_parameters() if param.requires_grad]


def test_full_model_loads_for_training(tiny_model_dir: Path, capsys: pytest.CaptureFixture) -> None:
    model, tokenizer = load_model_and_tokenizer(config(tiny_model_dir))
    assert model.dtype == torch.float32 and model.device.type == "cpu"
    assert model.config._attn_implementation == "sdpa"
    assert model.training and not model.is_activation_checkpointing  # on a CPU compute, not memory, runs out
    assert all(param.requires_grad for param in model.parameters())
    assert len(tokenizer) == model.config.vocab_size
    assert "float32 (asked for with --dtype), attention sdpa" in capsys.readouterr().out
    checkpointed, _ = load_model_and_tokenizer(config(tiny_model_dir, gradient_checkpointing=True))
    assert checkpointed.is_activation_checkpointing and checkpointed.config.use_cache is False


def test_attention_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    assert attention_implementation("cpu") == "sdpa"
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(model_module.importlib.util, "find_spec",
                        lambda name: object() if name == "flash_attn" else real_find_spec(name))
    assert attention_implementation("cuda:0") == "flash_attention_2"
    assert attention_implementation("cpu") == "sdpa"


def test_train_layer_indices_freeze_the_other_layers(tiny_model_dir: Path) -> None:
    model, tokenizer = load_model_and_tokenizer(config(tiny_model_dir, train_layer_indices=[1]))
    names = trainable_names(model)
    assert names and all(".layers.1." in name for name in names)
    # Checkpointed blocks still pass gradients although the embeddings are frozen.
    tokens = torch.tensor([tokenizer("Hello there")["input_ids"]])
    model(tokens, labels=tokens).loss.backward()
    assert all(param.grad is not None for name, param in model.named_parameters() if name in names)


def test_layer_index_beyond_the_model_is_a_value_error(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"--train-layer-indices \[2\]: the model has 2 layers"):
        load_model_and_tokenizer(config(tiny_model_dir, train_layer_indices=[0, 2]))


def test_no_matching_parameter_is_a_runtime_error() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=32, n_positions=32))
    with pytest.raises(RuntimeError, match="matched no parameter"):
        apply_train_layer_filter(gpt2, [0])  # GPT-2 names its blocks transformer.h.<i>


def test_lora_mode_trains_adapters_only(tiny_model_dir: Path) -> None:
    model, _ = load_model_and_tokenizer(config(tiny_model_dir, weight_bridge_mode="lora_only", lora_r=4,
                                               lora_layer_indices=[1]))
    names = trainable_names(model)
    assert names and all("lora_" in name and ".layers.1." in name for name in names)
    assert {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in names} == {"q_proj", "v_proj"}
    assert model.training


def test_lora_layer_index_beyond_the_model_is_a_value_error(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="--lora-layer-indices"):
        load_model_and_tokenizer(config(tiny_model_dir, weight_bridge_mode="lora_restart", lora_layer_indices=[7]))


def test_resume_from_a_full_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    model, tokenizer = load_model_and_tokenizer(config(tiny_model_dir))
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    model.save_pretrained(tmp_path / "step_1")
    tokenizer.save_pretrained(tmp_path / "step_1")
    resumed, _ = load_model_and_tokenizer(config(tiny_model_dir, resume_from=str(tmp_path / "step_1")))
    assert torch.equal(resumed.lm_head.weight, model.lm_head.weight)


def test_resume_from_an_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = config(tiny_model_dir, weight_bridge_mode="lora_only", lora_r=4)
    model, _ = load_model_and_tokenizer(cfg)
    adapter = {name: param for name, param in model.named_parameters() if "lora_B" in name}
    with torch.no_grad():
        for param in adapter.values():
            param.fill_(0.5)
    model.save_pretrained(tmp_path / "adapter_step_1")
    resumed, _ = load_model_and_tokenizer(cfg.model_copy(update={"resume_from": str(tmp_path / "adapter_step_1")}))
    restored = dict(resumed.named_parameters())
    assert all(torch.equal(restored[name], param) for name, param in adapter.items())
    assert trainable_names(resumed) and all("lora_" in name for name in trainable_names(resumed))
