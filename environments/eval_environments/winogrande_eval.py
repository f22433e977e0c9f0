"""WinoGrande evaluation (`WinoGrandeEvalEnv`, ``winogrande_eval``): fill the blank with one of two options.

Data: ``allenai/winogrande``, ``subset`` ``winogrande_xl``, split ``validation``
(``sentence`` with a ``_`` blank, ``option1``, ``option2``, ``answer`` "1"/"2"; unlabeled
rows skipped); or ``--env.test_file`` in that layout. One letter (A = option1, B = option2)
inside ``<answer></answer>`` (after ``</think>`` in thinking mode) or lighteval's fallbacks.
Metrics: ``winogrande/accuracy``, ``winogrande/format_compliance_rate``,
``winogrande/answer_tag_rate``, ``config/*``.

Offline, with the fixture:

    python environments/eval_environments/winogrande_eval.py evaluate \\
        --env.test_file environments/fixtures/winogrande_eval/validation.jsonl \\
        --env.data_dir_to_save_evals evals/winogrande --openai.base_url http://localhost:9001/v1 \\
        --openai.model_name my-model --env.use_wandb false

For real: ``python environments/eval_environments/winogrande_eval.py evaluate
--env.data_dir_to_save_evals evals/winogrande --openai.base_url http://localhost:9000/v1
--openai.model_name <model>``.
"""

from typing import Any

from eval_common import EvalEnvConfig, MultipleChoiceEvalEnv, eval_config_values, eval_server, gold_letter
from pydantic import Field


class WinoGrandeEvalConfig(EvalEnvConfig):
    """WinoGrande evaluation settings."""

    dataset_name: str = Field(default="allenai/winogrande", description="Hugging Face dataset.")
    subset: str = Field(default="winogrande_xl", description="winogrande_xl, _l, _m, _s or _xs.")
    eval_split: str = Field(default="validation", description="Split evaluated (the test split is unlabeled).")


class WinoGrandeEvalEnv(MultipleChoiceEvalEnv):
    name = "winogrande_eval"
    task = "winogrande"
    env_config_cls = WinoGrandeEvalConfig
    intro = "Fill the blank (_) in the sentence with the option that makes common sense."

    @classmethod
    def config_init(cls):
        config = WinoGrandeEvalConfig(**eval_config_values("winogrande_eval", max_token_length=2048, data_path_to_save_groups=None))
        return config, eval_server(base_url="http://localhost:8000/v1", api_key="x")

    def build_items(self) -> list[dict[str, Any]]:
        items = []
        for index, row in enumerate(self.rows(self.config.dataset_name, self.config.subset, self.config.eval_split)):
            if str(row.get("answer", "")).strip() == "":
                continue
            items.append({"id": str(index), "question": f"Sentence: {row['sentence']}",
                          "choices": [row["option1"], row["option2"]], "gold": gold_letter(2, int(row["answer"]) - 1)})
        return items

    def config_metrics(self) -> dict[str, Any]:
        return {**super().config_metrics(), "config/subset": self.config.subset}


if __name__ == "__main__":
    WinoGrandeEvalEnv.cli()
