"""A tiny random Llama (2 layers, hidden size 32) saved with the test tokenizer, for fast CPU tests."""

from __future__ import annotations

from pathlib import Path


def build_tiny_model(folder: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Save a 2-layer LlamaForCausalLM whose vocabulary matches the tokenizer in `tokenizer_dir`."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
