"""ARC evaluation (`ARCEvalEnv`, ``arc_eval``): AI2 Reasoning Challenge, grade-school science questions.

Data: ``allenai/ai2_arc``, ``subset`` ``ARC-Challenge`` (or ``ARC-Easy``), split ``test``
(``question``, ``choices`` with ``text`` and ``label`` lists, ``answerKey``); or
``--env.test_file`` in that layout. Choices are shown lettered A, B, ... in order (ARC's
numeric labels 1-4 become letters; the key follows its choice). One letter inside
``<answer></answer>`` (after ``</think>`` in thinking mode) or lighteval's fallbacks.
Metrics: ``arc/accuracy``, ``arc/format_compliance_rate``, ``arc/answer_tag_rate``,
``arc/extraction_<method>_count``, ``config/*``.

Offline, with the fixture:

    python environments/eval_environments/arc_eval.py evaluate \\
        --env.test_file environments/fixtures/arc_eval/test.jsonl \\
        --env.data_dir_to_save_evals evals/arc --openai.base_url http://localhost:9001/v1 \\
        --openai.model_name my-model --env.use_wandb false

For real: ``python environments/eval_environments/arc_eval.py evaluate --env.subset ARC-Easy
--env.data_dir_to_save_evals evals/arc --openai.base_url http://localhost:9000/v1
--openai.model_name <model>``.
"""

from string import ascii_uppercase
from typing import Any

from eval_common import EvalEnvConfig, MultipleChoiceEvalEnv, eval_config_values, eval_server
from pydantic import Field


class ARCEvalConfig(EvalEnvConfig):
    """ARC evaluation settings."""

    dataset_name: str = Field(default="allenai/ai2_arc", description="Hugging Face dataset.")
    subset: str = Field(default="ARC-Challenge", description="'ARC-Challenge' or 'ARC-Easy'.")
    eval_split: str = Field(default="test", description="Split evaluated.")


class ARCEvalEnv(MultipleChoiceEvalEnv):
    name = "arc_eval"
    task = "arc"
    env_config_cls = ARCEvalConfig
    intro = "The following is a multiple choice science question."

    @classmethod
    def config_init(cls):
        config = ARCEvalConfig(**eval_config_values("arc_eval", max_token_length=2048, data_path_to_save_groups=None))
        return config, eval_server(base_url="http://localhost:8000/v1", api_key="x")

    def build_items(self) -> list[dict[str, Any]]:
        items = []
        for index, row in enumerate(self.rows(self.config.dataset_name, self.config.subset, self.config.eval_split)):
            labels = [str(label) for label in row["choices"]["label"]]
            key = str(row["answerKey"])
            if key not in labels:
                continue
            items.append({"id": row.get("id", str(index)), "question": row["question"], "choices": list(row["choices"]["text"]),
                          "gold": ascii_uppercase[labels.index(key)]})
        return items

    def config_metrics(self) -> dict[str, Any]:
        return {**super().config_metrics(), "config/subset": self.config.subset}


if __name__ == "__main__":
    ARCEvalEnv.cli()
