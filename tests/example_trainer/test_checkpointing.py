"""Checkpoints: layout, atomic replacement, pruning, and resuming the optimizer and RNG states."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from example_trainer.checkpointing import (CheckpointError, TrainerState, load_resume_state,
                                           restore_optimizer_and_rng, save_checkpoint, save_lora_checkpoint)


def tiny_model(tie: bool = False) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=tie)
    return LlamaForCausalLM(config)


@pytest.fixture
def tokenizer(tokenizer_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def train_one_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    tokens = torch.randint(0, 128, (2, 8))
    model(input_ids=tokens, labels=tokens).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    other = b.state_dict()
    return all(torch.equal(tensor, other[name]) for name, tensor in a.state_dict().items())


def test_full_checkpoint_layout(tmp_path: Path, tokenizer: Any) -> None:
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = TrainerState(step=0, model_name="tiny", atropos_url="http://api:8000", weight_bridge_mode="none",
                         dtype="float32")
    path = save_checkpoint(model, tokenizer, str(tmp_path), 3, optimizer=optimizer, state=state)
    assert path == str(tmp_path / "step_3")
    files = {p.name for p in Path(path).iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "trainer_state.json",
            "optimizer.pt", "rng_state.pt"} <= files
    assert "pytorch_model.bin" not in files
    assert [p.name for p in tmp_path.iterdir()] == ["step_3"]  # no temporary directory left
    saved = json.loads((Path(path) / "trainer_state.json").read_text())
    assert saved["step"] == 3 and saved["atropos_url"] == "http://api:8000" and saved["has_optimizer"]
    assert load_resume_state(path).model_name == "tiny"
    assert same_weights(model, LlamaForCausalLM.from_pretrained(path))
    assert AutoTokenizer.from_pretrained(path).get_vocab() == tokenizer.get_vocab()


def test_final_checkpoint_and_tied_embeddings(tmp_path: Path) -> None:
    model = tiny_model(tie=True)
    path = save_checkpoint(model, None, str(tmp_path), 10, is_final=True)
    assert path == str(tmp_path / "final_model")
    reloaded = LlamaForCausalLM.from_pretrained(path)
    assert same_weights(model, reloaded)
    assert load_resume_state(path).step == 10 and not load_resume_state(path).has_optimizer


def test_views_into_a_larger_storage_are_saved_as_copies(tmp_path: Path) -> None:
    # shared_vllm's parameters are slices of vLLM's fused qkv tensors
    model = tiny_model()
    attention = model.model.layers[0].self_attn
    fused = torch.randn(32 + 16 + 16, 32)
    attention.q_proj.weight = torch.nn.Parameter(fused[:32])
    attention.k_proj.weight = torch.nn.Parameter(fused[32:48])
    path = save_checkpoint(model, None, str(tmp_path), 1)
    assert same_weights(model, LlamaForCausalLM.from_pretrained(path))


def test_a_failed_save_leaves_the_previous_checkpoint_intact(tmp_path: Path, tokenizer: Any) -> None:
    first = tiny_model()
    save_checkpoint(first, tokenizer, str(tmp_path), 5)
    second = tiny_model()
    with torch.no_grad():
        for parameter in second.parameters():
            parameter.add_(1.0)

    class BrokenTokenizer:
        def save_pretrained(self, directory: str) -> None:  # the weights are written by now
            assert (Path(directory) / "model.safetensors").exists()
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(second, BrokenTokenizer(), str(tmp_path), 5)
    assert [p.name for p in tmp_path.iterdir()] == ["step_5"]
    assert same_weights(first, LlamaForCausalLM.from_pretrained(tmp_path / "step_5"))
    # a successful save replaces it
    save_checkpoint(second, tokenizer, str(tmp_path), 5)
    assert same_weights(second, LlamaForCausalLM.from_pretrained(tmp_path / "step_5"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_5"]


def test_save_total_limit_prunes_older_step_checkpoints(tmp_path: Path) -> None:
    model = tiny_model()
    for step in (1, 2, 10, 3):
        save_checkpoint(model, None, str(tmp_path), step, save_total_limit=2)
    save_checkpoint(model, None, str(tmp_path), 11, is_final=True, save_total_limit=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final_model", "step_10", "step_3"]


def test_pruning_keeps_the_newest_checkpoint_to_resume_from(tmp_path: Path) -> None:
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters())
    save_checkpoint(model, None, str(tmp_path), 3, optimizer=optimizer, save_total_limit=1)
    for step in (4, 5):  # weight-sync checkpoints: weights only
        save_checkpoint(model, None, str(tmp_path), step, save_total_limit=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_3", "step_5"]


def test_lora_checkpoints(tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_model(), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                                    task_type="CAUSAL_LM"))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    for step in (1, 2, 3):
        save_lora_checkpoint(model, str(tmp_path), step, optimizer=optimizer, save_total_limit=2)
    final = save_lora_checkpoint(model, str(tmp_path), 4, is_final=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter_step_2", "adapter_step_3", "final_adapter"]
    files = {p.name for p in Path(final).iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "trainer_state.json", "rng_state.pt"} <= files
    assert load_resume_state(str(tmp_path / "adapter_step_3")).has_optimizer


def test_restore_gives_back_the_optimizer_and_every_random_state(tmp_path: Path) -> None:
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_one_step(model, optimizer)
    path = save_checkpoint(model, None, str(tmp_path), 1, optimizer=optimizer)
    expected = (torch.rand(4), random.random(), np.random.rand(3))
    saved_moments = {k: v["exp_avg"].clone() for k, v in optimizer.state_dict()["state"].items()}

    train_one_step(model, optimizer)  # the run goes on, then dies; a new process resumes:
    resumed = LlamaForCausalLM.from_pretrained(path)
    fresh = torch.optim.AdamW(resumed.parameters(), lr=1e-3)
    restore_optimizer_and_rng(path, fresh, resumed)

    state = fresh.state_dict()["state"]
    assert state.keys() == saved_moments.keys()
    assert all(torch.equal(state[k]["exp_avg"], saved_moments[k]) for k in state)
    assert int(state[0]["step"]) == 1
    assert torch.equal(torch.rand(4), expected[0])
    assert random.random() == expected[1]
    assert np.array_equal(np.random.rand(3), expected[2])


def test_the_optimizer_is_saved_by_parameter_name_and_earlier_checkpoints_still_load(tmp_path: Path) -> None:
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_one_step(model, optimizer)
    path = save_checkpoint(model, None, str(tmp_path), 1, optimizer=optimizer)
    saved = torch.load(Path(path) / "optimizer.pt", weights_only=True)
    assert "model.embed_tokens.weight" in saved["state"]  # loadable at any world size, sharded or not
    torch.save(optimizer.state_dict(), Path(path) / "optimizer.pt")  # an earlier release's layout
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
    restore_optimizer_and_rng(path, fresh, model)
    assert int(fresh.state_dict()["state"][0]["step"]) == 1


def test_restore_without_an_optimizer_file_keeps_the_optimizer_fresh(tmp_path: Path) -> None:
    model = tiny_model()
    path = save_checkpoint(model, None, str(tmp_path), 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    restore_optimizer_and_rng(path, optimizer)
    assert optimizer.state_dict()["state"] == {}


def test_resume_from_something_else_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a trainer checkpoint: it has no trainer_state.json"):
        load_resume_state(str(tmp_path))
    with pytest.raises(CheckpointError, match="not a trainer checkpoint"):
        load_resume_state(str(tmp_path / "missing"))
    (tmp_path / "trainer_state.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_resume_state(str(tmp_path))
