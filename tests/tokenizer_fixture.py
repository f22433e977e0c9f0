"""A small Hugging Face tokenizer with a chat template, trained offline in a fraction of a second."""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>", "<|eos|>", "<unk>"]
CORPUS = [
    "What is 2 + 2? The answer is 4.", "Compute 12 times 3. Answer: 36", "The answer is \\\\boxed{7}",
    "You are a helpful assistant. Think step by step.", "Hello there, how are you doing today?",
] * 20


def build_tokenizer(folder: Path) -> Path:
    """Train a byte-level BPE tokenizer, save it as a transformers folder, return the folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|eos|>", unk_token="<unk>", pad_token="<|eos|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    # transformers 5 records its own backend class; name the one both 4.x and 5.x load.
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if "chat_template" not in config and (folder / "chat_template.jinja").exists():
        config["chat_template"] = (folder / "chat_template.jinja").read_text()
    config_path.write_text(json.dumps(config, indent=2))
    return folder
