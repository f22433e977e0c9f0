"""CLEVR CoGenT-A counting: how many objects of a kind are in a rendered scene.

The model sees the scene and the question and must end with ``\\boxed{answer}``; the last
boxed answer scores 1 when it equals the gold count (the dataset's ``<answer> N </answer>``
solution), else -1; a reply with no ``\\boxed{}`` scores -1. The image is sent as a base64
PNG ``image_url`` part and also stored in the group's ``images`` field. See `image_qa` for
what the three multimodal_dpo environments share.

Data: ``leonardPKU/clevr_cogen_a_train`` (train split: ``image``, ``problem``, ``solution``).
``--env.train_file`` reads a local file in that layout instead; the repository ships flat
coloured-shape scenes in ``environments/fixtures/clevr_cogen_a_train/train.jsonl`` (written
by ``generate_fixtures.py``).

Offline (any OpenAI-compatible vision model server, e.g. vLLM serving Qwen2-VL on :9001):
    python environments/multimodal_dpo/clevr_cogen_a_train.py process \\
        --env.train_file environments/fixtures/clevr_cogen_a_train/train.jsonl --env.total_steps 4 \\
        --env.data_path_to_save_groups clevr_cogen_a_train.jsonl --env.use_wandb false
For real (with ``run-api`` and a trainer):
    python environments/multimodal_dpo/clevr_cogen_a_train.py serve \\
        --openai.base_url http://localhost:9001/v1 --openai.model_name Qwen/Qwen2-VL-2B-Instruct
"""

from image_qa import BOXED_PROMPT, ImageQuestionEnv, boxed


class MultimodalExampleEnv(ImageQuestionEnv):
    name = "clevr_cogen_a_train"
    hub_dataset = "leonardPKU/clevr_cogen_a_train"
    system_prompt = BOXED_PROMPT
    max_tokens = 2048
    reply_answer = staticmethod(boxed)

    def read_row(self, row):
        return row["problem"], row["solution"]


if __name__ == "__main__":
    MultimodalExampleEnv.cli()
