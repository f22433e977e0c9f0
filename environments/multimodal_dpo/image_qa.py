"""What the multimodal_dpo environments share: one image and one question in, one short answer out.

`ImageQuestionEnv` is the whole environment; `ocr_vqa.py`, `clevr_cogen_a_train.py` and
`clevr_complex.py` only say which dataset it reads, how a row becomes a question and its
gold answer, how the answer is pulled out of a reply, and what the system prompt asks for.

A group is one chat call with ``n = group_size``: a system prompt asking for the answer's
format, then a user turn holding the question as a text part and the image as a base64 PNG
``image_url`` part. Each rollout is tokenized as the text-only exchange (the question, then
the reply), which any chat template can render; the image travels beside it, once per
rollout, in the group's ``images`` field (raw base64 PNG, as Atropos sends it). Rollouts
with fewer than 10 trainable tokens are left out of the group. A reply scores 1 when its
answer equals the gold one (ignoring case and surrounding or repeated spaces), else -1.

Data: the hub dataset's ``train`` split, read lazily (images are decoded one row at a time).
``--env.train_file`` points at a local file in the same column layout instead, whose image
column holds a PNG/JPEG path (relative to the file), a ``{"bytes": ..., "path": ...}``
record as `datasets` exports it, or a PIL image.
"""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path
from typing import Any, Callable, ClassVar, Optional

from pydantic import Field

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.local_data import load_rows
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

MIN_TRAINABLE_TOKENS = 10
MODEL = "Qwen/Qwen2-VL-2B-Instruct"
PNG_MODES = {"1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"}

ANSWER_TAG = re.compile(r"<answer\b[^>]*>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
BOXED = "\\boxed{"
BOXED_PROMPT = ("End your reply with your final answer written as \\boxed{answer}; "
                "an answer given any other way is not counted.")


class ImageQAConfig(BaseEnvConfig):
    train_file: Optional[str] = Field(
        default=None,
        description="Local dataset file (JSONL/JSON/CSV/Parquet) in the hub dataset's column layout, used instead of "
                    "the hub's train split; its image column holds image paths relative to the file.")


# -- answers ----------------------------------------------------------------------------------------
def tagged_or_raw(text: str) -> str:
    """The first ``<answer>...</answer>`` content, else the whole text; stripped."""
    match = ANSWER_TAG.search(text or "")
    return (match.group(1) if match else text or "").strip()


def boxed(text: str) -> Optional[str]:
    """The content of the last ``\\boxed{...}`` (braces inside it may nest), or None."""
    start = (text or "").rfind(BOXED)
    if start < 0:
        return None
    depth, begin = 1, start + len(BOXED)
    for position in range(begin, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:position].strip()
    return None


def normalized(answer: str) -> str:
    return " ".join(answer.split()).casefold()


def same_answer(answer: Optional[str], gold: str) -> bool:
    return answer is not None and normalized(answer) == normalized(gold) != ""


def question_text(problem: Any) -> str:
    """A dataset's question: a string, or a JSON list of content parts whose text parts are kept."""
    if isinstance(problem, str) and problem.lstrip().startswith("["):
        try:
            parts = json.loads(problem)
        except json.JSONDecodeError:
            return problem
        texts = [str(p.get("text", "")) for p in parts if isinstance(p, dict) and p.get("type") == "text"]
        return "\n".join(texts) if texts else problem
    return str(problem)


# -- images -----------------------------------------------------------------------------------------
def png_base64(value: Any, base_dir: Optional[Path] = None) -> str:
    """A dataset image (PIL image, ``{"bytes", "path"}`` record, raw bytes or a file path) as base64 PNG."""
    from PIL import Image

    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, (bytes, bytearray)):
        value = Image.open(io.BytesIO(value))
    elif isinstance(value, (str, Path)):
        path = Path(value).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.is_file():
            raise FileNotFoundError(f"no image file at {path}")
        value = Image.open(path)
    if not isinstance(value, Image.Image):
        raise ValueError(f"not an image: {type(value).__name__}")
    if value.mode not in PNG_MODES:
        value = value.convert("RGB")
    buffer = io.BytesIO()
    value.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def user_turn(question: str, image_b64: str) -> dict[str, Any]:
    return {"role": "user", "content": [
        {"type": "text", "text": question},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image_b64}"}},
    ]}


# -- the environment --------------------------------------------------------------------------------
class ImageQuestionEnv(BaseEnv):
    """An image-question dataset scored by exact answer match; subclasses fill in the class attributes."""

    env_config_cls = ImageQAConfig
    hub_dataset: ClassVar[str]
    system_prompt: ClassVar[str]
    max_tokens: ClassVar[int]
    # The reply's answer, None when it gives none in the required format (a staticmethod).
    reply_answer: ClassVar[Callable[[str], Optional[str]]]

    def __init__(self, config, server_configs, slurm=False, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        self.train: Any = []
        self.image_dir: Optional[Path] = None  # what relative image paths of a local file are relative to
        self.iter = 0

    @classmethod
    def config_init(cls):
        env_config = cls.env_config_cls(
            wandb_name=cls.name, tokenizer_name=MODEL, group_size=8, use_wandb=True, max_num_workers=2,
            rollout_server_url="http://localhost:8000", total_steps=1000, batch_size=12, steps_per_eval=100,
            max_token_length=2048,
        )
        servers = [APIServerConfig(model_name=MODEL, base_url="http://localhost:9001/v1", api_key="x",
                                   num_requests_for_eval=256)]
        return env_config, servers

    def read_row(self, row: dict[str, Any]) -> tuple[str, str]:
        """The row's question and gold answer."""
        raise NotImplementedError

    async def setup(self):
        local = self.config.train_file
        if local:
            self.train = load_rows(self.hub_dataset, split="train", local_file=local)
            self.image_dir = Path(local).expanduser().resolve().parent
        else:
            # A `datasets.Dataset`, indexed row by row: listing it would decode every image at once.
            from datasets import load_dataset

            self.train = load_dataset(self.hub_dataset, split="train")
            self.image_dir = None
        if len(self.train) == 0:
            raise ValueError(f"{local or self.hub_dataset} has no rows")
        self.iter = 0

    def save_checkpoint(self, step, data=None):
        super().save_checkpoint(step, {"iter": self.iter} if data is None else data)

    async def get_next_item(self):
        row = self.train[self.iter % len(self.train)]
        self.iter += 1
        question, gold = self.read_row(row)
        return {"question": question_text(question), "gold": tagged_or_raw(str(gold)),
                "image": png_base64(row["image"], self.image_dir)}

    async def collect_trajectories(self, item):
        messages = [{"role": "system", "content": self.system_prompt}, user_turn(item["question"], item["image"])]
        completion = await self.server.chat_completion(messages=messages, n=self.config.group_size,
                                                       max_tokens=self.max_tokens)
        rollouts = [(choice.message.content or "", choice.finish_reason) for choice in completion.choices]
        return await self.score_rollouts(item, rollouts), []

    async def score_rollouts(self, item: dict[str, Any], rollouts: list[tuple[str, str]]) -> Optional[ScoredDataGroup]:
        """The scored group of `rollouts` (reply, finish reason), without the ones too short to train on."""
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], images=[])
        for reply, finish_reason in rollouts:
            chat = [{"role": "user", "content": item["question"]}, {"role": "assistant", "content": reply}]
            tokenized = tokenize_for_trainer(self.tokenizer, chat, finish_reason=finish_reason or "")
            if sum(1 for mask in tokenized["masks"] if mask != -100) < MIN_TRAINABLE_TOKENS:
                continue
            group["tokens"].append(tokenized["tokens"])
            group["masks"].append(tokenized["masks"])
            group["scores"].append(1.0 if same_answer(self.reply_answer(reply), item["gold"]) else -1.0)
            group["images"].append(item["image"])
        if not group["tokens"]:
            return None
        if len(group["tokens"]) < self.config.group_size:
            group["group_overrides"] = {"group_size": len(group["tokens"])}
        return group

    async def evaluate(self, *args, **kwargs):
        return None  # these environments have no evaluation split (as in Atropos)
