"""GPQA evaluation (`GPQAEvalEnv`, ``gpqa_eval``): graduate-level science questions, four choices.

Data: ``Idavidrein/gpqa`` (gated: accept its terms on the hub and log in), ``subset``
``gpqa_diamond``, split ``train`` (``Question``, ``Correct Answer``, ``Incorrect Answer
1-3``, ``Subdomain``); or ``--env.test_file`` in that layout. The right answer is placed at
a position drawn from ``random.Random(shuffle_seed)`` (None: a fresh draw each run), the
wrong ones keep their order around it. One letter inside ``<answer></answer>`` (after
``</think>`` in thinking mode), lighteval's fallbacks, then the latest valid letter.
Metrics: ``gpqa/accuracy``, ``gpqa/subdomain_<d>_accuracy``, ``gpqa/format_compliance_rate``,
``gpqa/answer_tag_rate``, ``config/*``.

Offline, with the fixture:

    python environments/eval_environments/gpqa_eval.py evaluate \\
        --env.test_file environments/fixtures/gpqa_eval/train.jsonl \\
        --env.data_dir_to_save_evals evals/gpqa --openai.base_url http://localhost:9001/v1 \\
        --openai.model_name my-model --env.use_wandb false

For real (after ``huggingface-cli login``): ``python environments/eval_environments/gpqa_eval.py
evaluate --env.data_dir_to_save_evals evals/gpqa --openai.base_url http://localhost:9000/v1
--openai.model_name <model>``.
"""

import random
from string import ascii_uppercase
from typing import Any, Optional

from eval_common import EvalEnvConfig, MultipleChoiceEvalEnv, eval_config_values, eval_server
from pydantic import Field


class GPQAEvalConfig(EvalEnvConfig):
    """GPQA evaluation settings (generative)."""

    dataset_name: str = Field(default="Idavidrein/gpqa", description="Hugging Face dataset (gated).")
    subset: str = Field(default="gpqa_diamond", description="gpqa_diamond, gpqa_extended or gpqa_main.")
    eval_split: str = Field(default="train", description="Split evaluated (GPQA has only 'train').")
    shuffle_seed: Optional[int] = Field(default=42, description="Seed of the answer positions; None draws anew each run.")


class GPQAEvalEnv(MultipleChoiceEvalEnv):
    name = "gpqa_eval"
    task = "gpqa"
    env_config_cls = GPQAEvalConfig
    breakdowns = (("subdomain", "subdomain"),)
    last_letter_fallback = True

    @classmethod
    def config_init(cls):
        config = GPQAEvalConfig(**eval_config_values("gpqa_eval", max_num_workers_per_node=128, max_eval_workers=256,
                                                     max_num_workers=1024, dataset_name="Idavidrein/gpqa",
                                                     subset="gpqa_diamond"))
        return config, eval_server(num_requests_for_eval=1024, num_max_requests_at_once=32)

    def build_items(self) -> list[dict[str, Any]]:
        rng = random.Random(self.config.shuffle_seed) if self.config.shuffle_seed is not None else random.Random()
        items = []
        for index, row in enumerate(self.rows(self.config.dataset_name, self.config.subset, self.config.eval_split)):
            choices = [str(row[f"Incorrect Answer {n}"]).strip() for n in (1, 2, 3)]
            position = rng.randint(0, 3)
            choices.insert(position, str(row["Correct Answer"]).strip())
            items.append({"id": str(row.get("Record ID") or index), "question": row["Question"], "choices": choices,
                          "gold": ascii_uppercase[position], "subdomain": row.get("Subdomain") or "unknown"})
        return items


if __name__ == "__main__":
    GPQAEvalEnv.cli()
