"""IFEval evaluation (`IFEvalEnv`, ``ifeval_eval``): does the response follow verifiable instructions?

Data: ``google/IFEval`` split ``train`` (``key``, ``prompt``, ``instruction_id_list``,
``kwargs``); or ``--env.test_file`` in that layout. The prompt is sent as is; the text after
``</think>`` (thinking mode; the whole response when the format is broken) is checked
against every instruction with the checkers of ``ifeval_instructions`` (IFEval's 25
instruction types). Strict: the response as written; loose: any of the response, without
its first and/or last line, and without ``*`` markup. Metrics:
``ifeval/prompt_level_strict_acc`` (also ``ifeval/accuracy``), ``ifeval/prompt_level_loose_acc``,
``ifeval/inst_level_strict_acc``, ``ifeval/inst_level_loose_acc``,
``ifeval/format_compliance_rate``, ``config/*``. Language instructions need ``langdetect``
(the ``examples`` extra); without it they count as followed.

Offline, with the fixture:

    python environments/eval_environments/ifeval_eval.py evaluate \\
        --env.test_file environments/fixtures/ifeval_eval/train.jsonl \\
        --env.data_dir_to_save_evals evals/ifeval --openai.base_url http://localhost:9001/v1 \\
        --openai.model_name my-model --env.use_wandb false

For real: ``python environments/eval_environments/ifeval_eval.py evaluate
--env.data_dir_to_save_evals evals/ifeval --openai.base_url http://localhost:9000/v1
--openai.model_name <model>``.
"""

from typing import Any

from eval_common import EvalEnvConfig, GenerativeEvalEnv, eval_config_values, eval_server
from ifeval_instructions import instructions_registry
from pydantic import Field


class IFEvalConfig(EvalEnvConfig):
    """IFEval evaluation settings."""

    dataset_name: str = Field(default="google/IFEval", description="Hugging Face dataset.")
    eval_split: str = Field(default="train", description="Split evaluated (IFEval has only 'train').")


def loose_variants(response: str) -> list[str]:
    """The response, without its first line, last line or both, each with and without ``*``."""
    lines = response.split("\n")
    cut = [response, "\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()]
    return cut + [text.replace("*", "") for text in cut]


def check_instructions(response: str, instruction_ids: list[str], kwargs_list: list[dict[str, Any]],
                       prompt: str) -> dict[str, Any]:
    """Strict and loose results of each instruction for `response`. An unknown instruction id
    is skipped; a checker that fails to build or run counts as not followed."""
    variants = [text for text in loose_variants(response) if text.strip()]
    strict, loose, details = [], [], []
    for index, instruction_id in enumerate(instruction_ids):
        checker_cls = instructions_registry.INSTRUCTION_DICT.get(instruction_id)
        if checker_cls is None:
            continue
        try:
            checker = checker_cls(instruction_id)
            arguments = dict(kwargs_list[index] if index < len(kwargs_list) and kwargs_list[index] else {})
            if "prompt_to_repeat" in checker.get_instruction_args_keys():
                arguments.setdefault("prompt_to_repeat", prompt)
            checker.build_description(**arguments)
            strict_ok = bool(response.strip()) and checker.check_following(response)
            loose_ok = any(checker.check_following(text) for text in variants)
            details.append({"instruction_id": instruction_id, "strict_pass": strict_ok, "loose_pass": loose_ok})
        except Exception as exc:  # noqa: BLE001 - a broken checker is a failed instruction
            strict_ok = loose_ok = False
            details.append({"instruction_id": instruction_id, "strict_pass": False, "loose_pass": False, "error": str(exc)})
        strict.append(strict_ok)
        loose.append(loose_ok)
    return {
        "prompt_level_strict": bool(strict) and all(strict), "prompt_level_loose": bool(loose) and all(loose),
        "inst_level_strict": strict, "inst_level_loose": loose, "instruction_results": details,
        "num_instructions": len(instruction_ids),
    }


class IFEvalEnv(GenerativeEvalEnv):
    name = "ifeval_eval"
    task = "ifeval"
    env_config_cls = IFEvalConfig

    @classmethod
    def config_init(cls):
        config = IFEvalConfig(**eval_config_values("ifeval_eval", max_num_workers_per_node=128, max_eval_workers=256,
                                                   max_num_workers=1024, dataset_name="google/IFEval", eval_split="train"))
        return config, eval_server(num_requests_for_eval=1024, num_max_requests_at_once=32)

    def build_items(self) -> list[dict[str, Any]]:
        rows = self.rows(self.config.dataset_name, None, self.config.eval_split)
        return [{"id": str(row.get("key", index)), "prompt": row["prompt"], "instruction_ids": list(row["instruction_id_list"]),
                 "kwargs": list(row.get("kwargs") or [])}
                for index, row in enumerate(rows) if row.get("prompt") and row.get("instruction_id_list")]

    def user_prompt(self, item: dict[str, Any]) -> str:
        return item["prompt"]

    async def score_response(self, item: dict[str, Any], content: str, response: str) -> dict[str, Any]:
        result = check_instructions(content, item["instruction_ids"], item["kwargs"], item["prompt"])
        return {"prompt": item["prompt"], "instruction_id_list": item["instruction_ids"], "response_for_eval": content,
                **result, "is_correct": result["prompt_level_strict"]}

    def extra_metrics(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        strict = [ok for s in samples for ok in s["inst_level_strict"]]
        loose = [ok for s in samples for ok in s["inst_level_loose"]]
        return {
            "ifeval/prompt_level_strict_acc": self.rate(samples, lambda s: s["prompt_level_strict"]),
            "ifeval/prompt_level_loose_acc": self.rate(samples, lambda s: s["prompt_level_loose"]),
            "ifeval/inst_level_strict_acc": sum(strict) / len(strict) if strict else 0.0,
            "ifeval/inst_level_loose_acc": sum(loose) / len(loose) if loose else 0.0,
            "ifeval/total_instructions": len(strict),
        }


if __name__ == "__main__":
    IFEvalEnv.cli()
