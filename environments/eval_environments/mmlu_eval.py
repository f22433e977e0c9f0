"""MMLU evaluation (`MMLUEvalEnv`, ``mmlu_eval``): 57 subjects of multiple-choice questions, generative.

Data: ``lighteval/mmlu``, one configuration per subject (``subjects``, default all 57),
split ``test``; few-shot examples (``num_few_shot``, 0-5) are the first rows of the
subject's ``dev`` split. Offline: ``--env.test_file`` (and ``--env.few_shot_file`` for the
examples) in the same layout (``question``, ``subject``, ``choices``, ``answer`` as an index).
The model reasons, then gives one letter inside ``<answer></answer>`` (after ``</think>``
in thinking mode); lighteval's fallback patterns and, last, the latest valid letter apply
when the tag is missing. Metrics: ``mmlu/accuracy``, ``mmlu/subject_<s>_accuracy``,
``mmlu/category_<stem|humanities|social_sciences|other>_accuracy``,
``mmlu/format_compliance_rate``, ``mmlu/answer_tag_rate``, ``mmlu/extraction_<method>_count``,
``config/num_few_shot`` and the other ``config/*`` entries.

Offline, with the fixtures (two solved examples per question):

    python environments/eval_environments/mmlu_eval.py evaluate \\
        --env.test_file environments/fixtures/mmlu_eval/test.jsonl \\
        --env.few_shot_file environments/fixtures/mmlu_eval/dev.jsonl --env.num_few_shot 2 \\
        --env.data_dir_to_save_evals evals/mmlu --openai.base_url http://localhost:9001/v1 \\
        --openai.model_name my-model --env.use_wandb false

For real: ``python environments/eval_environments/mmlu_eval.py evaluate --env.subjects anatomy,virology
--env.data_dir_to_save_evals evals/mmlu --openai.base_url http://localhost:9000/v1
--openai.model_name <model>`` (without ``--env.subjects``: all 57 subjects).
"""

from typing import Any, Optional

from eval_common import (
    EvalEnvConfig,
    MultipleChoiceEvalEnv,
    StrList,
    eval_config_values,
    eval_server,
    gold_letter,
)
from pydantic import Field

# Subject -> category, with the four groups Atropos reports.
SUBJECT_GROUPS = {
    "STEM": (
        "abstract_algebra astronomy college_biology college_chemistry college_computer_science college_mathematics "
        "college_physics computer_security conceptual_physics electrical_engineering elementary_mathematics "
        "high_school_biology high_school_chemistry high_school_computer_science high_school_mathematics "
        "high_school_physics high_school_statistics machine_learning college_medicine clinical_knowledge "
        "medical_genetics professional_medicine anatomy nutrition virology human_aging"
    ),
    "Humanities": (
        "formal_logic high_school_european_history high_school_us_history high_school_world_history "
        "international_law jurisprudence logical_fallacies moral_disputes moral_scenarios philosophy prehistory "
        "professional_law world_religions"
    ),
    "Social_Sciences": (
        "econometrics high_school_geography high_school_government_and_politics high_school_macroeconomics "
        "high_school_microeconomics high_school_psychology human_sexuality professional_psychology public_relations "
        "security_studies sociology us_foreign_policy"
    ),
    "Other": "business_ethics global_facts management marketing miscellaneous professional_accounting",
}
SUBJECT_CATEGORIES = {group: names.split() for group, names in SUBJECT_GROUPS.items()}
MMLU_SUBJECTS = sorted(subject for names in SUBJECT_CATEGORIES.values() for subject in names)
CATEGORY_OF = {subject: group for group, names in SUBJECT_CATEGORIES.items() for subject in names}


class MMLUEvalConfig(EvalEnvConfig):
    """MMLU evaluation settings (generative)."""

    dataset_name: str = Field(default="lighteval/mmlu", description="Hugging Face dataset (one configuration per subject).")
    subjects: Optional[StrList] = Field(default=None, description="Subjects evaluated (comma-separated); all 57 when unset.")
    eval_split: str = Field(default="test", description="Split evaluated.")
    few_shot_split: str = Field(default="dev", description="Split the few-shot examples come from.")
    num_few_shot: int = Field(default=0, ge=0, le=5, description="Solved examples shown before each question (0-5).")
    few_shot_file: Optional[str] = Field(default=None, description="Local file of few-shot examples (hub layout).")
    include_subject_in_prompt: bool = Field(default=False, description="Show the subject name above the question.")
    eval_temperature: float = Field(default=0.0, description="Sampling temperature of the evaluated model.")


class MMLUEvalEnv(MultipleChoiceEvalEnv):
    name = "mmlu_eval"
    task = "mmlu"
    env_config_cls = MMLUEvalConfig
    breakdowns = (("subject", "subject"), ("category", "category"))
    last_letter_fallback = True

    @classmethod
    def config_init(cls):
        config = MMLUEvalConfig(**eval_config_values("mmlu_eval", max_num_workers_per_node=8, dataset_name="lighteval/mmlu",
                                                     num_few_shot=0, include_subject_in_prompt=False))
        return config, eval_server(num_requests_for_eval=256, num_max_requests_at_once=32)

    def _subjects(self) -> list[str]:
        chosen = list(self.config.subjects or MMLU_SUBJECTS)
        unknown = [subject for subject in chosen if subject not in CATEGORY_OF]
        if unknown:
            print(f"mmlu_eval: skipping unknown subjects {unknown}")
        subjects = [subject for subject in chosen if subject in CATEGORY_OF]
        if not subjects:
            raise ValueError("mmlu_eval: no valid MMLU subject selected")
        return subjects

    def _rows(self, split: str, local_file: Optional[str]) -> list[dict[str, Any]]:
        subjects = self._subjects()
        if local_file:
            rows = self.rows("", None, split, local_file)
            return [row for row in rows if self.config.subjects is None or row.get("subject") in subjects]
        rows = []
        for subject in subjects:
            rows += [{**row, "subject": subject} for row in self.rows(self.config.dataset_name, subject, split, "")]
        return rows

    def _item(self, index: int, row: dict[str, Any]) -> dict[str, Any]:
        subject = row.get("subject") or "unknown"
        choices = list(row["choices"])
        answer = row["answer"]
        gold = answer.strip().upper() if isinstance(answer, str) and not answer.strip().isdigit() else gold_letter(len(choices), answer)
        return {"id": f"{subject}_{index}", "question": row["question"], "choices": choices, "gold": gold,
                "subject": subject, "category": CATEGORY_OF.get(subject, "Other")}

    def build_items(self) -> list[dict[str, Any]]:
        self.few_shot_data: dict[str, list[dict[str, Any]]] = {}
        if self.config.num_few_shot > 0:
            for index, row in enumerate(self._rows(self.config.few_shot_split, self.config.few_shot_file)):
                shot = self._item(index, row)
                self.few_shot_data.setdefault(shot["subject"], []).append(shot)
        rows = self._rows(self.config.eval_split, self.config.test_file)
        return [self._item(index, row) for index, row in enumerate(rows)]

    def few_shot_examples(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        return self.few_shot_data.get(item["subject"], [])[: self.config.num_few_shot]

    def question_text(self, item: dict[str, Any]) -> str:
        question = str(item["question"]).strip()
        if self.config.include_subject_in_prompt:
            return f"[{item['subject'].replace('_', ' ')}]\n\n{question}"
        return question

    def config_metrics(self) -> dict[str, Any]:
        return {**super().config_metrics(), "config/num_few_shot": self.config.num_few_shot}

    def generation_parameters(self) -> dict[str, Any]:
        return {**super().generation_parameters(), "num_few_shot": self.config.num_few_shot}


if __name__ == "__main__":
    MMLUEvalEnv.cli()
