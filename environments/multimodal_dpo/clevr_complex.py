"""CLEVR CoGenT-A compositional questions: counts, comparisons and yes/no questions about a scene.

The model sees the scene and the question and must end with ``\\boxed{answer}``; the last
boxed answer scores 1 when it equals the gold answer (a number, or yes/no in any case), else
-1; a reply with no ``\\boxed{}`` scores -1. The image is sent as a base64 PNG ``image_url``
part and also stored in the group's ``images`` field. See `image_qa` for what the three
multimodal_dpo environments share.

Data: ``MMInstruction/Clevr_CoGenT_TrainA_70K_Complex`` (train split: ``image``, ``problem``,
``solution``; a solution wrapped in ``<answer>`` tags is unwrapped). ``--env.train_file``
reads a local file in that layout instead; the repository ships flat coloured-shape scenes in
``environments/fixtures/clevr_complex/train.jsonl`` (written by ``generate_fixtures.py``).

Offline (any OpenAI-compatible vision model server, e.g. vLLM serving Qwen2-VL on :9001):
    python environments/multimodal_dpo/clevr_complex.py process \\
        --env.train_file environments/fixtures/clevr_complex/train.jsonl --env.total_steps 4 \\
        --env.data_path_to_save_groups clevr_complex.jsonl --env.use_wandb false
For real (with ``run-api`` and a trainer):
    python environments/multimodal_dpo/clevr_complex.py serve \\
        --openai.base_url http://localhost:9001/v1 --openai.model_name Qwen/Qwen2-VL-2B-Instruct
"""

from image_qa import BOXED_PROMPT, ImageQuestionEnv, boxed


class MultimodalComplexEnv(ImageQuestionEnv):
    name = "clevr_complex"
    hub_dataset = "MMInstruction/Clevr_CoGenT_TrainA_70K_Complex"
    system_prompt = BOXED_PROMPT
    max_tokens = 2048
    reply_answer = staticmethod(boxed)

    def read_row(self, row):
        return row["problem"], row["solution"]


if __name__ == "__main__":
    MultimodalComplexEnv.cli()
