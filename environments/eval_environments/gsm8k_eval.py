"""GSM8K evaluation (`GSM8KEvalEnv`, ``gsm8k_eval``): grade-school math word problems.

Data: ``openai/gsm8k`` (config ``main``, split ``test``), the final answer after ``####``
(thousands separators removed), questions shuffled with ``shuffle_seed``; or
``--env.test_file`` in the same layout (``question``, ``answer``). Each problem is asked
once; the response must end with one ``\\boxed{}`` answer (after ``</think>`` in thinking
mode), checked with math-verify (string comparison as fallback). Metrics: ``gsm8k/accuracy``,
``gsm8k/format_compliance_rate``, ``gsm8k/has_boxed_rate``, ``gsm8k/multiple_boxed_rate``,
``config/*``; samples in ``samples.jsonl``.

Offline, with the fixture (any OpenAI-compatible server):

    python environments/eval_environments/gsm8k_eval.py evaluate \\
        --env.test_file environments/fixtures/gsm8k_eval/test.jsonl \\
        --env.data_dir_to_save_evals evals/gsm8k --openai.base_url http://localhost:9001/v1 \\
        --openai.model_name my-model --env.use_wandb false

For real: ``python environments/eval_environments/gsm8k_eval.py evaluate
--env.data_dir_to_save_evals evals/gsm8k --openai.base_url http://localhost:9000/v1
--openai.model_name <model>``.
"""

from typing import Any

from eval_common import MathEvalConfig, MathEvalEnv, eval_config_values, eval_server
from eval_helpers import format_math_answer_instruction
from pydantic import Field


class GSM8KEvalConfig(MathEvalConfig):
    """GSM8K evaluation settings."""

    dataset_name: str = Field(default="openai/gsm8k", description="Hugging Face dataset.")
    subset: str = Field(default="main", description="Dataset configuration.")
    eval_split: str = Field(default="test", description="Split evaluated.")
    include_hope_suffix: bool = Field(
        default=True, description="Ask for lighteval's 'Therefore, the final answer is ... I hope it is correct' line.")
    group_size: int = 1
    max_num_workers: int = 1024
    max_eval_workers: int = 256
    max_num_workers_per_node: int = 128
    use_wandb: bool = True
    rollout_server_url: str = "http://localhost:8000"
    total_steps: int = 1
    wandb_name: str = "gsm8k_eval"
    steps_per_eval: int = 1


def final_answer(solution: str) -> str:
    """The number after GSM8K's ``####`` marker, without thousands separators."""
    return solution.split("####")[-1].strip().replace(",", "") if "####" in solution else solution.strip()


class GSM8KEvalEnv(MathEvalEnv):
    name = "gsm8k_eval"
    task = "gsm8k"
    env_config_cls = GSM8KEvalConfig

    @classmethod
    def config_init(cls):
        return GSM8KEvalConfig(**eval_config_values("gsm8k_eval", max_num_workers=1024, max_eval_workers=256,
                                                    max_num_workers_per_node=128)), eval_server()

    def build_items(self) -> list[dict[str, Any]]:
        rows = self.rows(self.config.dataset_name, self.config.subset, self.config.eval_split)
        return self.shuffled([{"id": str(index), "problem": row["question"], "answer": final_answer(str(row["answer"])),
                               "full_answer": row["answer"]} for index, row in enumerate(rows)])

    def user_prompt(self, item: dict[str, Any]) -> str:
        return (f"Solve this math problem, showing your reasoning step by step. "
                f"{format_math_answer_instruction(self.config.include_hope_suffix)}\n\n{item['problem']}")


if __name__ == "__main__":
    GSM8KEvalEnv.cli()
