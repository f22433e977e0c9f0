"""OCR-VQA: read a book cover and answer a question about it (author, title, genre, yes/no).

The model sees the cover image and the row's first question, and is asked to put its answer
in ``<answer>...</answer>`` tags; the tagged text (or the whole reply when it has no tags)
scores 1 when it equals the row's first answer, ignoring case and spacing, else -1. The
image is sent as a base64 PNG ``image_url`` part and also stored in the group's ``images``
field. See `image_qa` for what the three multimodal_dpo environments share.

Data: ``howard-hou/OCR-VQA`` (train split). ``--env.train_file`` reads a local file in its
layout instead (``image``, ``questions``, ``answers``); the repository ships invented covers
in ``environments/fixtures/ocr_vqa/train.jsonl`` (written by ``generate_fixtures.py``).

Offline (any OpenAI-compatible vision model server, e.g. vLLM serving Qwen2-VL on :9001):
    python environments/multimodal_dpo/ocr_vqa.py process \\
        --env.train_file environments/fixtures/ocr_vqa/train.jsonl --env.total_steps 4 \\
        --env.data_path_to_save_groups ocr_vqa.jsonl --env.use_wandb false
For real (with ``run-api`` and a trainer):
    python environments/multimodal_dpo/ocr_vqa.py serve \\
        --openai.base_url http://localhost:9001/v1 --openai.model_name Qwen/Qwen2-VL-2B-Instruct
"""

from image_qa import ImageQuestionEnv, tagged_or_raw


class OcrVqaEnv(ImageQuestionEnv):
    name = "ocr_vqa"
    hub_dataset = "howard-hou/OCR-VQA"
    system_prompt = "Give your answer between <answer> and </answer> tags, for example <answer>your answer</answer>."
    max_tokens = 512
    reply_answer = staticmethod(tagged_or_raw)

    def read_row(self, row):
        return row["questions"][0], row["answers"][0]


if __name__ == "__main__":
    OcrVqaEnv.cli()
