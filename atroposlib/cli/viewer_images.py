"""The image and the text prompt of a multimodal group, for `view-run-multimodal`.

The image comes from the group's ``images`` field (a PIL image, a base64 string, or a
``data:image/...;base64,`` URL), else from the first base64 JPEG or PNG data URL in its
messages or its decoded prompt. The text prompt is the JSON text part of the prompt
(``"type": "text", "text": "..."``), else the text after ``[Image]``, else the whole prompt
with any image data replaced by a short marker (kilobytes of base64 help nobody).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
from typing import Any, Optional

from PIL import Image

DATA_URL = re.compile(r"data:image/(?:jpeg|png);base64,([A-Za-z0-9+/=]+)")
ANY_DATA_URL = re.compile(r"data:image/[\w.+-]+;base64,[A-Za-z0-9+/=]*")
TEXT_PART = re.compile(r'"type":\s*"text",\s*"text":\s*"((?:[^"\\]|\\.)*)"')
IMAGE_MARKER = "[Image]"


def decode_image(value: Any) -> Optional[Image.Image]:
    """`value` as a PIL image: itself, or decoded from base64 or a data URL; None if it is not one."""
    if isinstance(value, Image.Image):
        return value
    if not isinstance(value, str) or not value:
        return None
    if value.startswith("data:"):
        value = value.partition(",")[2]
    try:
        image = Image.open(io.BytesIO(base64.b64decode(value, validate=False)))
        image.load()
    # OSError covers bytes PIL cannot read (UnidentifiedImageError is one).
    except (binascii.Error, ValueError, OSError, Image.DecompressionBombError):
        return None
    return image


def _first_image_value(images: Any) -> Any:
    """The first entry of an ``images`` field, which may be one image, a list, or a list per rollout."""
    while isinstance(images, (list, tuple)) and images:
        images = images[0]
    return images


def group_image(group: dict[str, Any], prompt: str) -> Optional[Image.Image]:
    """The group's image (see the module docstring for where it is looked for)."""
    image = decode_image(_first_image_value(group.get("images")))
    if image is not None:
        return image
    for text in (json.dumps(group.get("messages") or []), prompt):
        match = DATA_URL.search(text)
        if match:
            image = decode_image(match.group(1))
            if image is not None:
                return image
    return None


def text_prompt(prompt: str) -> str:
    """The words of the prompt, without chat markup or image data where they can be told apart."""
    match = TEXT_PART.search(prompt)
    if match:
        try:
            return json.loads(f'"{match.group(1)}"')
        except json.JSONDecodeError:
            return match.group(1)
    if IMAGE_MARKER in prompt:
        return prompt.split(IMAGE_MARKER, 1)[1].strip()
    return ANY_DATA_URL.sub("[image data]", prompt)
