"""BoolQ evaluation (`BoolQEvalEnv`, ``boolq_eval``): yes/no questions about a passage.

Data: ``lighteval/boolq_helm`` split ``validation`` (``passage``, ``question``, ``answer``
"Yes"/"No"; a boolean answer as in ``google/boolq`` works too); or ``--env.test_file`` in
that layout. The choices are A. Yes and B. No; the answer inside ``<answer></answer>``
(after ``</think>`` in thinking mode) may be the letter or the word. Metrics:
``boolq/accuracy``, ``boolq/yes_accuracy``, ``boolq/no_accuracy``,
``boolq/format_compliance_rate``, ``boolq/answer_tag_rate``, ``config/*``.

Offline, with the fixture:

    python environments/eval_environments/boolq_eval.py evaluate \\
        --env.test_file environments/fixtures/boolq_eval/validation.jsonl \\
        --env.data_dir_to_save_evals evals/boolq --openai.base_url http://localhost:9001/v1 \\
        --openai.model_name my-model --env.use_wandb false

For real: ``python environments/eval_environments/boolq_eval.py evaluate
--env.data_dir_to_save_evals evals/boolq --openai.base_url http://localhost:9000/v1
--openai.model_name <model>``.
"""

import re
from typing import Any, Optional

from eval_common import EvalEnvConfig, MultipleChoiceEvalEnv, eval_config_values, eval_server
from eval_helpers import ANSWER_TAG_PATTERN, extract_letter_from_answer_tag
from pydantic import Field

YES_NO = ["Yes", "No"]


class BoolQEvalConfig(EvalEnvConfig):
    """BoolQ evaluation settings."""

    dataset_name: str = Field(default="lighteval/boolq_helm", description="Hugging Face dataset.")
    eval_split: str = Field(default="validation", description="Split evaluated.")


def yes_no(answer: Any) -> str:
    if isinstance(answer, bool):
        return "Yes" if answer else "No"
    text = str(answer).strip().lower()
    if text in ("yes", "true", "1"):
        return "Yes"
    if text in ("no", "false", "0"):
        return "No"
    raise ValueError(f"BoolQ answer {answer!r} is neither yes nor no")


class BoolQEvalEnv(MultipleChoiceEvalEnv):
    name = "boolq_eval"
    task = "boolq"
    env_config_cls = BoolQEvalConfig
    intro = "Read the passage, then answer the question with Yes or No."

    @classmethod
    def config_init(cls):
        config = BoolQEvalConfig(**eval_config_values("boolq_eval", max_token_length=2048, data_path_to_save_groups=None))
        return config, eval_server(base_url="http://localhost:8000/v1", api_key="x")

    def build_items(self) -> list[dict[str, Any]]:
        items = []
        for index, row in enumerate(self.rows(self.config.dataset_name, None, self.config.eval_split)):
            question = str(row["question"]).strip()
            question = question[:-1] if question.endswith("??") else question
            truth = yes_no(row["answer"])
            items.append({"id": str(index), "question": f"Passage: {row['passage']}\n\nQuestion: {question}",
                          "choices": list(YES_NO), "gold": "A" if truth == "Yes" else "B", "truth": truth})
        return items

    def extract_letter(self, content: str, item: dict[str, Any]) -> tuple[Optional[str], str]:
        """The tag's yes/no word, else its letter or choice text, else a lone yes/no word in the
        response, else lighteval's letter fallbacks."""
        tag = ANSWER_TAG_PATTERN.search(content)
        if tag:
            words = set(re.findall(r"[a-z]+", tag.group(1).lower()))
            if ("yes" in words) != ("no" in words):
                return ("A", "answer_tag_yes") if "yes" in words else ("B", "answer_tag_no")
            letter, method = extract_letter_from_answer_tag(content, {"A", "B"}, self.config.full_debug, YES_NO)
            if letter:
                return letter, method
        words = set(re.findall(r"[a-z]+", content.lower()))
        if ("yes" in words) != ("no" in words):
            return ("A", "fallback_yes_keyword") if "yes" in words else ("B", "fallback_no_keyword")
        return super().extract_letter(content, item)

    async def score_response(self, item: dict[str, Any], content: str, response: str) -> dict[str, Any]:
        sample = await super().score_response(item, content, response)
        sample["gold_word"] = item["truth"]
        sample["extracted_word"] = {"A": "Yes", "B": "No"}.get(sample["extracted_answer"])
        return sample

    def extra_metrics(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        metrics = super().extra_metrics(samples)
        for word in YES_NO:
            of_word = [s for s in samples if s["gold_word"] == word]
            metrics[f"boolq/{word.lower()}_accuracy"] = sum(s["is_correct"] for s in of_word) / len(of_word) if of_word else 0.0
        return metrics


if __name__ == "__main__":
    BoolQEvalEnv.cli()
