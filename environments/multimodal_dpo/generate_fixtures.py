"""Writes the offline fixture datasets of the multimodal_dpo environments (images drawn with Pillow).

Nothing here comes from the real datasets: the book covers are invented and the "CLEVR"
scenes are flat coloured shapes whose answers are computed from the scene description.
Each fixture is a ``train.jsonl`` in its hub dataset's column layout, with the ``image``
column holding a PNG path relative to the file:

    environments/fixtures/ocr_vqa/              (howard-hou/OCR-VQA layout: questions / answers lists)
    environments/fixtures/clevr_cogen_a_train/  (leonardPKU/clevr_cogen_a_train: problem / solution)
    environments/fixtures/clevr_complex/        (MMInstruction/Clevr_CoGenT_TrainA_70K_Complex: problem / solution)

    python environments/multimodal_dpo/generate_fixtures.py [OUTPUT_FOLDER]   # default: environments/fixtures
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

from PIL import Image, ImageDraw, ImageFont

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# -- OCR-VQA style: invented book covers -------------------------------------------------------------
BOOKS = [
    # (title, author, genre, background, first question kind)
    ("The Quiet Harbour", "Mara Ellison", "Literature & Fiction", (32, 64, 112), "author"),
    ("Bread at Dawn", "Tomas Reyes", "Cookbooks, Food & Wine", (176, 96, 40), "title"),
    ("Counting the Stars", "Lena Okafor", "Science & Math", (20, 20, 48), "genre"),
    ("Walking the High Passes", "Jon Halvorsen", "Travel", (40, 120, 72), "is_travel"),
    ("Spreadsheets Made Simple", "Ada Whitcombe", "Computers & Technology", (90, 90, 96), "is_romance"),
    ("Letters from the Orchard", "Ines Varga", "Romance", (150, 40, 80), "author_name"),
]
QUESTIONS: dict[str, Callable[[str, str, str], tuple[str, str]]] = {
    "author": lambda title, author, genre: ("Who wrote this book?", author),
    "author_name": lambda title, author, genre: ("Who is the author of this book?", author),
    "title": lambda title, author, genre: ("What is the title of this book?", title),
    "genre": lambda title, author, genre: ("What is the genre of this book?", genre),
    "is_travel": lambda title, author, genre: ("Is this a travel book?", "Yes" if genre == "Travel" else "No"),
    "is_romance": lambda title, author, genre: ("Is this a romantic book?", "Yes" if genre == "Romance" else "No"),
}


def book_cover(title: str, author: str, genre: str, background: tuple[int, int, int]) -> Image.Image:
    image = Image.new("RGB", (180, 240), background)
    draw = ImageDraw.Draw(image)
    draw.rectangle((8, 8, 171, 231), outline=(235, 225, 200), width=2)
    y = 30
    for line in textwrap.wrap(title.upper(), 13):
        draw.text((90, y), line, fill=(250, 245, 230), font=ImageFont.load_default(size=19), anchor="mt")
        y += 26
    draw.rectangle((8, 168, 171, 190), fill=(235, 225, 200))
    draw.text((90, 179), genre, fill=background, font=ImageFont.load_default(size=11), anchor="mm")
    draw.text((90, 212), author, fill=(250, 245, 230), font=ImageFont.load_default(size=14), anchor="mm")
    return image


def ocr_vqa_rows(images: Path) -> list[dict[str, Any]]:
    rows = []
    for number, (title, author, genre, background, first) in enumerate(BOOKS):
        name = f"cover_{number:02d}.png"
        save(book_cover(title, author, genre, background), images / name)
        asked = {"author_name": "author"}.get(first, first)
        kinds = [first] + [k for k in ("author", "title", "genre") if k != asked]
        pairs = [QUESTIONS[kind](title, author, genre) for kind in kinds]
        rows.append({
            "image": f"images/{name}", "image_id": f"fixture-{number:02d}",
            "questions": [q for q, _ in pairs], "answers": [a for _, a in pairs],
            "ocr_tokens": (title + " " + author).split(), "title": title, "authorName": author, "genre": genre,
            "image_width": 180, "image_height": 240, "set_name": "train",
        })
    return rows


# -- CLEVR style: flat shapes on a grey floor ------------------------------------------------------------
COLOURS = {"red": (200, 40, 40), "blue": (40, 80, 210), "green": (40, 160, 70), "yellow": (225, 200, 40),
           "purple": (130, 60, 170), "gray": (120, 120, 120)}
Thing = tuple[str, str, int, int]  # (colour, shape, x, y): shape is circle / square / triangle

SCENES: list[list[Thing]] = [
    [("red", "circle", 40, 50), ("blue", "square", 120, 90), ("green", "triangle", 190, 60)],
    [("red", "circle", 50, 110), ("red", "square", 110, 40), ("blue", "circle", 180, 100),
     ("yellow", "circle", 200, 35)],
    [("green", "square", 30, 40), ("green", "circle", 90, 110), ("purple", "triangle", 150, 50),
     ("red", "triangle", 205, 115), ("gray", "square", 120, 120)],
    [("blue", "triangle", 60, 80), ("blue", "square", 170, 80)],
    [("yellow", "square", 35, 115), ("red", "circle", 85, 45), ("green", "circle", 140, 110),
     ("blue", "circle", 200, 50), ("purple", "square", 200, 125), ("gray", "triangle", 120, 40)],
    [("purple", "circle", 120, 80)],
    [("red", "square", 40, 40), ("red", "square", 100, 120), ("green", "triangle", 160, 40),
     ("green", "circle", 210, 110)],
    [("gray", "circle", 45, 80), ("yellow", "triangle", 115, 80), ("blue", "square", 190, 80)],
]


def scene_image(things: list[Thing]) -> Image.Image:
    image = Image.new("RGB", (240, 160), (196, 196, 190))
    draw = ImageDraw.Draw(image)
    for colour, shape, x, y in things:
        box, fill, edge = (x - 16, y - 16, x + 16, y + 16), COLOURS[colour], (60, 60, 60)
        if shape == "circle":
            draw.ellipse(box, fill=fill, outline=edge, width=2)
        elif shape == "square":
            draw.rectangle(box, fill=fill, outline=edge, width=2)
        else:
            draw.polygon([(x, y - 17), (x - 17, y + 15), (x + 17, y + 15)], fill=fill, outline=edge, width=2)
    return image


def count(things: list[Thing], colour: str = "", shape: str = "") -> int:
    return sum(1 for c, s, _, _ in things if (not colour or c == colour) and (not shape or s == shape))


def x_of(things: list[Thing], colour: str, shape: str) -> int:
    """The horizontal position of the one object of that colour and shape."""
    return next(x for c, s, x, _ in things if (c, s) == (colour, shape))


def yes_no(condition: bool) -> str:
    return "yes" if condition else "no"


# One question per scene, each question text used once so a test can tell the rows apart by it.
COUNTING: list[tuple[str, Callable[[list[Thing]], int]]] = [
    ("How many objects are there in the image?", lambda t: len(t)),
    ("How many circles are there?", lambda t: count(t, shape="circle")),
    ("How many green objects are there?", lambda t: count(t, colour="green")),
    ("How many blue objects are there?", lambda t: count(t, colour="blue")),
    ("How many shapes in the picture are not circles?", lambda t: len(t) - count(t, shape="circle")),
    ("How many triangles can you see?", lambda t: count(t, shape="triangle")),
    ("How many red squares are there?", lambda t: count(t, "red", "square")),
    ("Count the squares and triangles together: how many are there?",
     lambda t: count(t, shape="square") + count(t, shape="triangle")),
]
COMPLEX: list[tuple[str, Callable[[list[Thing]], str]]] = [
    ("Are there more circles than squares?", lambda t: yes_no(count(t, shape="circle") > count(t, shape="square"))),
    ("How many objects are red or circles?",
     lambda t: str(sum(1 for c, s, _, _ in t if c == "red" or s == "circle"))),
    ("Is there a purple triangle?", lambda t: yes_no(count(t, "purple", "triangle") > 0)),
    ("Do the two objects have the same color?", lambda t: yes_no(len({c for c, _, _, _ in t}) == 1)),
    ("How many circles are to the right of the red circle?",
     lambda t: str(sum(1 for _, s, x, _ in t if s == "circle" and x > x_of(t, "red", "circle")))),
    ("Is the only object in the scene a cube?", lambda t: yes_no(t[0][1] == "square")),
    ("Are there as many red objects as green objects?", lambda t: yes_no(count(t, "red") == count(t, "green"))),
    ("What number of objects are left of the yellow triangle?",
     lambda t: str(sum(1 for _, _, x, _ in t if x < x_of(t, "yellow", "triangle")))),
]


def clevr_rows(images: Path, questions: list[tuple[str, Callable[[list[Thing]], Any]]],
               tagged: bool) -> list[dict[str, Any]]:
    rows = []
    for number, (things, (question, answer_of)) in enumerate(zip(SCENES, questions)):
        name = f"scene_{number:02d}.png"
        save(scene_image(things), images / name)
        answer = str(answer_of(things))
        rows.append({"image": f"images/{name}", "problem": question,
                     "solution": f"<answer> {answer} </answer>" if tagged else answer})
    return rows


def save(image: Image.Image, path: Path) -> None:
    """A small PNG: the drawing reduced to 32 colours."""
    image.quantize(colors=32, dither=Image.Dither.NONE).save(path, format="PNG", optimize=True)


def write_fixture(folder: Path, make_rows: Callable[[Path], list[dict[str, Any]]]) -> Path:
    images = folder / "images"
    images.mkdir(parents=True, exist_ok=True)
    rows = make_rows(images)
    path = folder / "train.jsonl"
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def main(root: Path = FIXTURES) -> list[Path]:
    return [
        write_fixture(root / "ocr_vqa", ocr_vqa_rows),
        # leonardPKU/clevr_cogen_a_train wraps the answer in <answer> tags.
        write_fixture(root / "clevr_cogen_a_train", lambda images: clevr_rows(images, COUNTING, tagged=True)),
        write_fixture(root / "clevr_complex", lambda images: clevr_rows(images, COMPLEX, tagged=False)),
    ]


if __name__ == "__main__":
    for written in main(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURES):
        print(f"wrote {written}")
