"""SimpleQA evaluation (`SimpleQAEvalEnv`, ``simpleqa_eval``): short fact-seeking questions.

Data: ``lighteval/SimpleQA`` split ``test`` (``problem``, ``answer``, ``metadata`` with a
``topic``, as a dict or its text); or ``--env.test_file`` in that layout. The answer is read
from ``<answer></answer>`` (after ``</think>`` in thinking mode; the whole remaining text when
there is no tag). Scoring, by default without a judge: correct when the answer equals the
gold answer (case-insensitive) or either contains the other. With ``--env.use_llm_judge``,
a judge model (``judge_model_name`` at ``judge_base_url``, key from the environment variable
named by ``judge_api_key_env``) grades CORRECT / INCORRECT / NOT_ATTEMPTED. Metrics:
``simpleqa/accuracy``, ``simpleqa/exact_match_accuracy`` and ``simpleqa/fuzzy_match_accuracy``
(string mode) or ``simpleqa/accuracy_if_attempted`` and ``simpleqa/not_attempted_rate``
(judge mode), ``simpleqa/topic_<t>_accuracy``, ``simpleqa/answer_tag_rate``,
``simpleqa/format_compliance_rate``, ``config/use_llm_judge`` and the other ``config/*``.

Offline, with the fixture:

    python environments/eval_environments/simpleqa_eval.py evaluate \\
        --env.test_file environments/fixtures/simpleqa_eval/test.jsonl \\
        --env.data_dir_to_save_evals evals/simpleqa --openai.base_url http://localhost:9001/v1 \\
        --openai.model_name my-model --env.use_wandb false

For real, graded by a judge: ``OPENAI_API_KEY=... python environments/eval_environments/simpleqa_eval.py
evaluate --env.use_llm_judge true --env.data_dir_to_save_evals evals/simpleqa
--openai.base_url http://localhost:9000/v1 --openai.model_name <model>``.
"""

import ast
import asyncio
import os
import re
from typing import Any, Optional

import openai
from eval_common import EvalEnvConfig, GenerativeEvalEnv, eval_config_values, eval_server
from eval_helpers import extract_freeform_from_answer_tag
from pydantic import Field

JUDGE_PROMPT = """You are grading a model's answer to a short factual question against the reference answer.

Question: {question}
Reference answer: {target}
Model's answer: {predicted_answer}

Choose one grade:
A: CORRECT - the answer gives the reference answer's key information and contradicts none of it. Wording, \
capitalisation, word order and hedging do not matter; a number must match the reference to its last \
significant figure; details the question already implies may be left out; small misspellings of a name are fine.
B: INCORRECT - the answer states something that contradicts the reference answer, even if hedged.
C: NOT_ATTEMPTED - the answer neither gives the key information nor contradicts it (it declines, asks for \
more context, or stays too vague).

Reply with the letter A, B or C only."""

GRADES = {"A": ("CORRECT", 1.0), "B": ("INCORRECT", 0.0), "C": ("NOT_ATTEMPTED", 0.0)}


class SimpleQAEvalConfig(EvalEnvConfig):
    """SimpleQA evaluation settings."""

    dataset_name: str = Field(default="lighteval/SimpleQA", description="Hugging Face dataset.")
    eval_split: str = Field(default="test", description="Split evaluated.")
    use_llm_judge: bool = Field(default=False, description="Grade with a judge model instead of string matching.")
    judge_model_name: str = Field(default="gpt-4o-2024-08-06", description="Judge model.")
    judge_base_url: str = Field(default="https://api.openai.com/v1", description="Judge API base URL.")
    judge_api_key_env: str = Field(default="OPENAI_API_KEY", description="Environment variable holding the judge's API key.")
    judge_temperature: float = Field(default=0.0, description="Judge sampling temperature.")
    judge_max_tokens: int = Field(default=0, description="Judge generation limit; 0 leaves it to the server.")


def parse_grade(text: str) -> tuple[str, float]:
    """(grade, score) from a judge reply: a lone letter A/B/C, else the grade's name."""
    reply = text.strip().upper()
    letters = set(re.findall(r"\b([ABC])\b", reply))
    if len(letters) == 1:
        return GRADES[letters.pop()]
    if re.search(r"NOT[_ ]ATTEMPTED", reply):
        return GRADES["C"]
    if "INCORRECT" in reply:
        return GRADES["B"]
    if "CORRECT" in reply:
        return GRADES["A"]
    return "PARSE_ERROR", 0.0


def topic_of(metadata: Any) -> str:
    if isinstance(metadata, str) and metadata.strip().startswith("{"):
        try:
            metadata = ast.literal_eval(metadata)
        except (ValueError, SyntaxError):
            return "unknown"
    return str(metadata.get("topic") or "unknown") if isinstance(metadata, dict) else "unknown"


class SimpleQAEvalEnv(GenerativeEvalEnv):
    name = "simpleqa_eval"
    task = "simpleqa"
    env_config_cls = SimpleQAEvalConfig
    breakdowns = (("topic", "topic"),)

    def __init__(self, config: SimpleQAEvalConfig, server_configs: Any, slurm: bool = False, testing: bool = False) -> None:
        super().__init__(config, server_configs, slurm, testing)
        self.judge_client: Optional[openai.AsyncOpenAI] = None
        if config.use_llm_judge:
            key = os.environ.get(config.judge_api_key_env)
            if not key:
                raise ValueError(f"simpleqa_eval: the judge's API key is read from ${config.judge_api_key_env}, which is "
                                 "not set; set it or pass --env.use_llm_judge false")
            self.judge_client = openai.AsyncOpenAI(api_key=key, base_url=config.judge_base_url)

    @classmethod
    def config_init(cls):
        config = SimpleQAEvalConfig(**eval_config_values("simpleqa_eval", max_num_workers_per_node=128, max_eval_workers=256,
                                                         max_num_workers=1024, dataset_name="lighteval/SimpleQA",
                                                         use_llm_judge=False))
        return config, eval_server(num_requests_for_eval=1024, num_max_requests_at_once=32)

    def build_items(self) -> list[dict[str, Any]]:
        rows = self.rows(self.config.dataset_name, None, self.config.eval_split)
        return [{"id": str(index), "question": row["problem"], "answer": str(row["answer"]), "topic": topic_of(row.get("metadata"))}
                for index, row in enumerate(rows) if row.get("problem") and str(row.get("answer", "")).strip()]

    def user_prompt(self, item: dict[str, Any]) -> str:
        return ("Answer the question briefly and precisely. Put only your answer inside <answer></answer> tags, for "
                f"example <answer>Ada Lovelace</answer>.\n\nQuestion: {item['question']}")

    async def judge(self, question: str, gold: str, prediction: str) -> Optional[dict[str, Any]]:
        """The judge's grade of `prediction`, or None when every attempt failed."""
        assert self.judge_client is not None
        kwargs: dict[str, Any] = {
            "model": self.config.judge_model_name, "temperature": self.config.judge_temperature,
            "messages": [{"role": "user", "content": JUDGE_PROMPT.format(question=question, target=gold,
                                                                         predicted_answer=prediction)}],
        }
        if self.config.judge_max_tokens > 0:
            kwargs["max_tokens"] = self.config.judge_max_tokens
        for attempt in range(1, self.config.max_retries + 1):
            try:
                reply = await self.judge_client.chat.completions.create(**kwargs)
                text = reply.choices[0].message.content if reply.choices else None
                if text:
                    grade, score = parse_grade(text)
                    return {"judge_response": text, "grade": grade, "score": score}
            except Exception as exc:  # noqa: BLE001 - reported, then retried
                print(f"  simpleqa_eval: judge request failed (attempt {attempt}): {type(exc).__name__}: {exc}")
            if attempt < self.config.max_retries:
                await asyncio.sleep(self.config.retry_delay)
        return None

    async def score_response(self, item: dict[str, Any], content: str, response: str) -> dict[str, Any]:
        tagged, _ = extract_freeform_from_answer_tag(content)
        answer = (tagged if tagged is not None else content).strip()
        sample = {"question": item["question"], "gold_answer": item["answer"], "extracted_answer": answer,
                  "topic": item["topic"], "answer_tag_found": tagged is not None,
                  "scoring_mode": "llm_judge" if self.config.use_llm_judge else "string_match"}
        if self.config.use_llm_judge:
            graded = await self.judge(item["question"], item["answer"], answer)
            if graded is None:
                raise RuntimeError("the judge gave no grade")
            sample.update(graded, is_correct=graded["grade"] == "CORRECT")
        else:
            gold, said = item["answer"].lower().strip(), answer.lower()
            exact = bool(said) and said == gold
            fuzzy = bool(said) and (gold in said or said in gold)
            sample.update(exact_match=exact, fuzzy_match=fuzzy, is_correct=exact or fuzzy,
                          score=1.0 if exact or fuzzy else 0.0)
        return sample

    def extra_metrics(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        metrics = {"simpleqa/answer_tag_rate": self.rate(samples, lambda s: s["answer_tag_found"])}
        if self.config.use_llm_judge:
            counts = {grade: sum(1 for s in samples if s.get("grade") == grade)
                      for grade in ("CORRECT", "INCORRECT", "NOT_ATTEMPTED", "PARSE_ERROR")}
            attempted = counts["CORRECT"] + counts["INCORRECT"]
            metrics.update({
                "simpleqa/accuracy_if_attempted": counts["CORRECT"] / attempted if attempted else 0.0,
                "simpleqa/not_attempted_rate": counts["NOT_ATTEMPTED"] / len(samples) if samples else 0.0,
                **{f"simpleqa/{grade.lower()}_count": count for grade, count in counts.items()},
            })
        else:
            metrics.update({
                "simpleqa/exact_match_accuracy": self.rate(samples, lambda s: s["exact_match"]),
                "simpleqa/fuzzy_match_accuracy": self.rate(samples, lambda s: s["fuzzy_match"]),
            })
        return metrics

    def config_metrics(self) -> dict[str, Any]:
        return {**super().config_metrics(), "config/use_llm_judge": 1.0 if self.config.use_llm_judge else 0.0}

    def generation_parameters(self) -> dict[str, Any]:
        mode = "llm_judge" if self.config.use_llm_judge else "string_match"
        return {**super().generation_parameters(), "scoring_mode": mode}


if __name__ == "__main__":
    SimpleQAEvalEnv.cli()
