"""HellaSwag evaluation (`HellaSwagEvalEnv`, ``hellaswag_eval``): pick the most plausible continuation.

Data: ``Rowan/hellaswag`` split ``validation`` (``activity_label``, ``ctx_a``, ``ctx_b``,
``endings``, ``label`` as a string index; unlabeled rows are skipped); or
``--env.test_file`` in that layout. The context is "activity: ctx_a Ctx_b" and the four
endings are the choices. One letter inside ``<answer></answer>`` (after ``</think>`` in
thinking mode) or lighteval's fallbacks. Metrics: ``hellaswag/accuracy``,
``hellaswag/format_compliance_rate``, ``hellaswag/answer_tag_rate``, ``config/*``.

Offline, with the fixture:

    python environments/eval_environments/hellaswag_eval.py evaluate \\
        --env.test_file environments/fixtures/hellaswag_eval/validation.jsonl \\
        --env.data_dir_to_save_evals evals/hellaswag --openai.base_url http://localhost:9001/v1 \\
        --openai.model_name my-model --env.use_wandb false

For real: ``python environments/eval_environments/hellaswag_eval.py evaluate
--env.data_dir_to_save_evals evals/hellaswag --openai.base_url http://localhost:9000/v1
--openai.model_name <model>``.
"""

from typing import Any

from eval_common import EvalEnvConfig, MultipleChoiceEvalEnv, eval_config_values, eval_server, gold_letter
from pydantic import Field


class HellaSwagEvalConfig(EvalEnvConfig):
    """HellaSwag evaluation settings."""

    dataset_name: str = Field(default="Rowan/hellaswag", description="Hugging Face dataset.")
    eval_split: str = Field(default="validation", description="Split evaluated (the test split is unlabeled).")


class HellaSwagEvalEnv(MultipleChoiceEvalEnv):
    name = "hellaswag_eval"
    task = "hellaswag"
    env_config_cls = HellaSwagEvalConfig
    intro = "Which ending continues this everyday scene most plausibly? It is a common-sense multiple choice question."

    @classmethod
    def config_init(cls):
        config = HellaSwagEvalConfig(**eval_config_values("hellaswag_eval", max_token_length=2048, data_path_to_save_groups=None))
        return config, eval_server(base_url="http://localhost:8000/v1", api_key="x")

    def build_items(self) -> list[dict[str, Any]]:
        items = []
        for index, row in enumerate(self.rows(self.config.dataset_name, None, self.config.eval_split)):
            if str(row.get("label", "")).strip() == "":
                continue
            context = f"{row['activity_label']}: {row['ctx_a']} {str(row['ctx_b']).capitalize()}".strip()
            endings = list(row["endings"])
            items.append({"id": str(row.get("ind", index)), "question": context, "choices": endings,
                          "gold": gold_letter(len(endings), row["label"]), "activity_label": row["activity_label"]})
        return items


if __name__ == "__main__":
    HellaSwagEvalEnv.cli()
