"""MMLU-Pro evaluation (`MMLUProEvalEnv`, ``mmlu_pro_eval``): harder MMLU with up to ten choices (A-J).

Data: ``TIGER-Lab/MMLU-Pro`` split ``test`` (``question``, ``options``, ``answer`` letter,
``answer_index``, ``category``), optionally filtered by ``categories``; few-shot examples
(``num_few_shot``) are the first ``validation`` rows of the same category. Offline:
``--env.test_file`` / ``--env.few_shot_file`` in that layout. One letter inside
``<answer></answer>`` (after ``</think>`` in thinking mode), lighteval's fallbacks, then the
latest valid letter. Metrics: ``mmlu_pro/accuracy``, ``mmlu_pro/category_<c>_accuracy``,
``mmlu_pro/format_compliance_rate``, ``mmlu_pro/answer_tag_rate``, ``config/*``.

Offline, with the fixture:

    python environments/eval_environments/mmlu_pro_eval.py evaluate \\
        --env.test_file environments/fixtures/mmlu_pro_eval/test.jsonl \\
        --env.data_dir_to_save_evals evals/mmlu_pro --openai.base_url http://localhost:9001/v1 \\
        --openai.model_name my-model --env.use_wandb false

For real: ``python environments/eval_environments/mmlu_pro_eval.py evaluate
--env.data_dir_to_save_evals evals/mmlu_pro --openai.base_url http://localhost:9000/v1
--openai.model_name <model>``.
"""

from typing import Any, Optional

from eval_common import EvalEnvConfig, MultipleChoiceEvalEnv, StrList, eval_config_values, eval_server, gold_letter
from pydantic import Field

MMLU_PRO_CATEGORIES = [
    "biology", "business", "chemistry", "computer science", "economics", "engineering", "health", "history", "law",
    "math", "philosophy", "physics", "psychology", "other",
]


class MMLUProEvalConfig(EvalEnvConfig):
    """MMLU-Pro evaluation settings (generative)."""

    dataset_name: str = Field(default="TIGER-Lab/MMLU-Pro", description="Hugging Face dataset.")
    eval_split: str = Field(default="test", description="Split evaluated.")
    few_shot_split: str = Field(default="validation", description="Split the few-shot examples come from.")
    num_few_shot: int = Field(default=0, ge=0, le=5, description="Solved examples shown before each question (0-5).")
    few_shot_file: Optional[str] = Field(default=None, description="Local file of few-shot examples (hub layout).")
    categories: Optional[StrList] = Field(default=None, description="Categories evaluated (comma-separated); all when unset.")


class MMLUProEvalEnv(MultipleChoiceEvalEnv):
    name = "mmlu_pro_eval"
    task = "mmlu_pro"
    env_config_cls = MMLUProEvalConfig
    breakdowns = (("category", "category"),)
    last_letter_fallback = True

    @classmethod
    def config_init(cls):
        config = MMLUProEvalConfig(**eval_config_values("mmlu_pro_eval", max_num_workers_per_node=8,
                                                        dataset_name="TIGER-Lab/MMLU-Pro", num_few_shot=0))
        return config, eval_server(num_requests_for_eval=256, num_max_requests_at_once=32)

    @staticmethod
    def _item(row: dict[str, Any], index: int) -> dict[str, Any]:
        options = list(row["options"])
        index_field = row.get("answer_index")
        gold = gold_letter(len(options), index_field) if index_field is not None else str(row["answer"]).strip().upper()
        return {"id": str(row.get("question_id", index)), "question": row["question"], "choices": options, "gold": gold,
                "category": row.get("category") or "unknown"}

    def build_items(self) -> list[dict[str, Any]]:
        items = [self._item(row, i) for i, row in enumerate(self.rows(self.config.dataset_name, None, self.config.eval_split))]
        if self.config.categories:
            wanted = {category.lower() for category in self.config.categories}
            items = [item for item in items if item["category"].lower() in wanted]
        self.few_shot_data: dict[str, list[dict[str, Any]]] = {}
        if self.config.num_few_shot > 0:
            shots = self.rows(self.config.dataset_name, None, self.config.few_shot_split, self.config.few_shot_file or "")
            for index, row in enumerate(shots):
                shot = self._item(row, index)
                self.few_shot_data.setdefault(shot["category"], []).append(shot)
        return items

    def few_shot_examples(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        return self.few_shot_data.get(item["category"], [])[: self.config.num_few_shot]

    def config_metrics(self) -> dict[str, Any]:
        return {**super().config_metrics(), "config/num_few_shot": self.config.num_few_shot}

    def generation_parameters(self) -> dict[str, Any]:
        return {**super().generation_parameters(), "num_few_shot": self.config.num_few_shot}


if __name__ == "__main__":
    MMLUProEvalEnv.cli()
