"""AIME evaluation (`AIMEEvalEnv`, ``aime_eval``): American Invitational Mathematics Examination.

Data: per year in ``years`` (``2024``: ``HuggingFaceH4/aime_2024``; ``2025``:
``yentinglin/aime_2025``), split ``train`` (another split falls back to ``train``), shuffled
with ``shuffle_seed``; or ``--env.test_file`` (``problem``, ``answer``, optional ``year``).
Answers are integers 0-999; one ``\\boxed{}`` answer per response (after ``</think>`` in
thinking mode), checked with math-verify, an equal integer also counting. Metrics:
``aime/accuracy``, ``aime/accuracy_<year>``, ``aime/format_compliance_rate``,
``aime/has_boxed_rate``, ``config/*``.

Offline, with the fixture:

    python environments/eval_environments/aime_eval.py evaluate \\
        --env.test_file environments/fixtures/aime_eval/test.jsonl \\
        --env.data_dir_to_save_evals evals/aime --openai.base_url http://localhost:9001/v1 \\
        --openai.model_name my-model --env.use_wandb false

For real: ``python environments/eval_environments/aime_eval.py evaluate --env.years 2024,2025
--env.data_dir_to_save_evals evals/aime --openai.base_url http://localhost:9000/v1
--openai.model_name <model>``.
"""

import re
from typing import Any, Optional

from eval_common import MathEvalConfig, MathEvalEnv, StrList, eval_config_values, eval_server
from pydantic import Field

AIME_DATASETS = {"2024": "HuggingFaceH4/aime_2024", "2025": "yentinglin/aime_2025"}


class AIMEEvalConfig(MathEvalConfig):
    """AIME evaluation settings."""

    years: StrList = Field(default=["2024", "2025"], description="AIME years evaluated (2024, 2025).")
    eval_split: str = Field(default="train", description="Split evaluated (the AIME sets have only 'train').")
    group_size: int = 1
    max_num_workers: int = 1024
    max_eval_workers: int = 256
    max_num_workers_per_node: int = 128
    use_wandb: bool = True
    rollout_server_url: str = "http://localhost:8000"
    total_steps: int = 1
    wandb_name: str = "aime_eval"
    steps_per_eval: int = 1


def integer_answer(text: Optional[str]) -> Optional[int]:
    """An AIME answer (0-999) in `text`: the whole text as a number, else its last 1-3 digit integer."""
    if not text:
        return None
    try:
        value = int(float(text.strip().replace(",", "")))
        return value if 0 <= value <= 999 else None
    except ValueError:
        numbers = re.findall(r"\b(\d{1,3})\b", text)
        return int(numbers[-1]) if numbers else None


class AIMEEvalEnv(MathEvalEnv):
    name = "aime_eval"
    task = "aime"
    env_config_cls = AIMEEvalConfig

    @classmethod
    def config_init(cls):
        return AIMEEvalConfig(**eval_config_values("aime_eval", max_num_workers=1024, max_eval_workers=256,
                                                   max_num_workers_per_node=128)), eval_server()

    def _year_rows(self, year: str) -> list[dict[str, Any]]:
        from datasets import load_dataset

        splits = load_dataset(AIME_DATASETS[year])
        split = self.config.eval_split if self.config.eval_split in splits else (
            "train" if "train" in splits else next(iter(splits)))
        return list(splits[split])

    def build_items(self) -> list[dict[str, Any]]:
        items = []
        if self.config.test_file:
            rows = self.rows("", None, self.config.eval_split)
            default_year = self.config.years[0] if self.config.years else "local"
            sources = [(str(row.get("year") or default_year), index, row) for index, row in enumerate(rows)]
        else:
            unknown = [year for year in self.config.years if year not in AIME_DATASETS]
            if unknown:
                print(f"aime_eval: no AIME dataset for {unknown}; known years: {sorted(AIME_DATASETS)}")
            sources = [(year, index, row) for year in self.config.years if year in AIME_DATASETS
                       for index, row in enumerate(self._year_rows(year))]
        for year, index, row in sources:
            items.append({"id": f"aime{year}_{index}", "year": year, "problem": row["problem"],
                          "answer": str(row["answer"]).strip(), "problem_idx": index})
        return self.shuffled(items)

    def user_prompt(self, item: dict[str, Any]) -> str:
        return ("Solve this competition math problem clearly and efficiently, reasoning step by step. AIME answers are "
                "whole numbers from 0 to 999. End with a last line written exactly as 'Therefore, the final answer is: "
                f"$\\boxed{{ANSWER}}$. I hope it is correct' (no quotes), where ANSWER is the final number.\n\n{item['problem']}")

    async def score_response(self, item: dict[str, Any], content: str, response: str) -> dict[str, Any]:
        sample = await super().score_response(item, content, response)
        sample["year"] = item["year"]
        sample["extracted_int"] = integer_answer(sample["extracted_answer"])
        if not sample["is_correct"] and not sample["has_multiple_boxed"] and sample["extracted_int"] is not None \
                and str(sample["extracted_int"]) == str(integer_answer(item["answer"])):
            sample.update(is_correct=True, verification_method="integer_fallback")
        return sample

    def extra_metrics(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        metrics = super().extra_metrics(samples)
        for year in sorted({s["year"] for s in samples}):
            of_year = [s for s in samples if s["year"] == year]
            metrics[f"aime/accuracy_{year}"] = sum(s["is_correct"] for s in of_year) / len(of_year)
        return metrics


if __name__ == "__main__":
    AIMEEvalEnv.cli()
