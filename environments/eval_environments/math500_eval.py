"""MATH-500 evaluation (`MATH500EvalEnv`, ``math500_eval``): 500 competition problems from MATH.

Data: ``HuggingFaceH4/MATH-500`` (split ``test``: ``problem``, ``solution``, ``answer``,
``subject``, ``level``, ``unique_id``; the answer is the last ``\\boxed{}`` of the solution
when ``answer`` is empty), shuffled with ``shuffle_seed``; or ``--env.test_file`` in that
layout. One ``\\boxed{}`` answer per response (after ``</think>`` in thinking mode), checked
with math-verify. Metrics: ``math500/accuracy``, per subject and level
(``math500/subject_<s>_accuracy``, ``math500/level_<n>_accuracy``),
``math500/format_compliance_rate``, ``math500/has_boxed_rate``, ``config/*``.

Offline, with the fixture:

    python environments/eval_environments/math500_eval.py evaluate \\
        --env.test_file environments/fixtures/math500_eval/test.jsonl \\
        --env.data_dir_to_save_evals evals/math500 --openai.base_url http://localhost:9001/v1 \\
        --openai.model_name my-model --env.use_wandb false

For real: ``python environments/eval_environments/math500_eval.py evaluate
--env.data_dir_to_save_evals evals/math500 --openai.base_url http://localhost:9000/v1
--openai.model_name <model>``.
"""

from typing import Any

from eval_common import MathEvalConfig, MathEvalEnv, eval_config_values, eval_server
from eval_helpers import extract_boxed_answers, format_math_answer_instruction
from pydantic import Field


class MATH500EvalConfig(MathEvalConfig):
    """MATH-500 evaluation settings."""

    dataset_name: str = Field(default="HuggingFaceH4/MATH-500", description="Hugging Face dataset.")
    subset: str = Field(default="default", description="Dataset configuration ('default': none).")
    eval_split: str = Field(default="test", description="Split evaluated.")
    include_hope_suffix: bool = Field(
        default=True, description="Ask for lighteval's 'Therefore, the final answer is ... I hope it is correct' line.")
    use_original_prompt: bool = Field(
        default=False, description="lighteval's MATH-500 layout (a last 'ANSWER: ...' line) plus a boxed answer.")
    group_size: int = 1
    max_num_workers: int = 1024
    max_eval_workers: int = 256
    max_num_workers_per_node: int = 128
    use_wandb: bool = True
    rollout_server_url: str = "http://localhost:8000"
    total_steps: int = 1
    wandb_name: str = "math500_eval"
    steps_per_eval: int = 1


class MATH500EvalEnv(MathEvalEnv):
    name = "math500_eval"
    task = "math500"
    env_config_cls = MATH500EvalConfig
    breakdowns = (("subject", "subject"), ("level", "level"))

    @classmethod
    def config_init(cls):
        return MATH500EvalConfig(**eval_config_values("math500_eval", max_num_workers=1024, max_eval_workers=256,
                                                      max_num_workers_per_node=128)), eval_server()

    def build_items(self) -> list[dict[str, Any]]:
        subset = None if self.config.subset == "default" else self.config.subset
        items = []
        for index, row in enumerate(self.rows(self.config.dataset_name, subset, self.config.eval_split)):
            answer = str(row.get("answer") or "").strip()
            if not answer:
                boxed = extract_boxed_answers(str(row.get("solution") or ""))
                answer = boxed[-1].strip() if boxed else str(row.get("solution") or "").strip()
            items.append({"id": str(row.get("unique_id") or index), "problem": row["problem"], "answer": answer,
                          "subject": row.get("subject") or "unknown", "level": str(row.get("level") or "unknown")})
        return self.shuffled(items)

    def user_prompt(self, item: dict[str, Any]) -> str:
        if self.config.use_original_prompt:
            return ("Solve the problem below, thinking step by step. Your last line must read 'ANSWER: $ANSWER' "
                    "(no quotes), where $ANSWER is the final answer; also put that answer inside \\boxed{} so it "
                    f"can be checked.\n\n{item['problem']}")
        return (f"Solve this math problem step by step. {format_math_answer_instruction(self.config.include_hope_suffix)}"
                f"\n\n{item['problem']}")


if __name__ == "__main__":
    MATH500EvalEnv.cli()
