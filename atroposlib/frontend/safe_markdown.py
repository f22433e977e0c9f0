"""Markdown to HTML for untrusted text (model output): its formatting is kept, its markup never.

The renderer is Python-Markdown with fenced code, tables and line breaks on newlines,
configured so that nothing in the text reaches the page as markup of its own:

* raw HTML is text: the block and inline HTML readers are off, so ``<script>`` or
  ``<img onerror=...>`` is serialised as ``&lt;script&gt;``; character references such as
  ``&amp;`` still show the character they name, as in any Markdown;
* every element of the rendered tree is checked against an allow-list of tags and
  attributes (anything else becomes a bare ``<span>``);
* a link keeps its ``href`` only for ``http(s)://``, ``mailto:`` or ``#`` targets, checked
  after character references are decoded (``javascript&#58;`` is ``javascript:``);
  an image becomes a link to it, so the page loads nothing from elsewhere;
* a fenced code block keeps only its language: ``{#id .class}`` attributes on the fence
  would let the text set ids and classes of the page.
"""

from __future__ import annotations

import html
import re
from functools import lru_cache
from typing import Any
from xml.etree.ElementTree import Element

import markdown
from markdown.extensions import Extension
from markdown.extensions.fenced_code import FencedBlockPreprocessor, FencedCodeExtension
from markdown.treeprocessors import Treeprocessor

ALLOWED_TAGS = frozenset(
    "p br pre code em strong ul ol li table thead tbody tr th td blockquote h1 h2 h3 h4 h5 h6 hr a span".split()
)
ALLOWED_ATTRIBUTES = {"a": {"href", "title"}, "th": {"align"}, "td": {"align"}, "ol": {"start"}}
SAFE_URL = re.compile(r"(?:https?://|mailto:|#)", re.IGNORECASE)
# Repeats come close together (a group's rollouts share their prompt, a file its system
# prompt), so a short cache catches them without holding on to long completions.
CACHE_SIZE = 256


def is_safe_url(url: str) -> bool:
    """Whether a link to `url` (as written in an attribute) stays a plain web, mail or in-page link."""
    return SAFE_URL.match(html.unescape(url).strip()) is not None


class _AllowList(Treeprocessor):
    """Rewrites the rendered tree so that it holds only allowed tags, attributes and links."""

    def run(self, root: Element) -> None:
        for element in root.iter():
            if element is root:
                continue
            if element.tag == "img":
                _image_to_link(element)
            if element.tag not in ALLOWED_TAGS:
                element.tag = "span"
            allowed = ALLOWED_ATTRIBUTES.get(element.tag, set())
            for name in list(element.attrib):
                if name not in allowed or (name == "href" and not is_safe_url(element.attrib[name])):
                    del element.attrib[name]


def _image_to_link(element: Element) -> None:
    """An image becomes a link to its source, labelled with its alt text."""
    source, label = element.get("src", ""), element.get("alt") or element.get("src", "")
    element.attrib.clear()
    element.tag = "a"
    element.text = f"[image: {label}]"
    if source:
        element.set("href", source)


class _LanguageOnlyFences(FencedBlockPreprocessor):
    """Fenced code blocks whose ``{...}`` attributes give at most the language."""

    def handle_attrs(self, attrs: Any) -> tuple[str, list[str], dict[str, Any]]:
        _, classes, _ = super().handle_attrs(attrs)
        return "", classes[:1], {}


class _SafeFencedCode(FencedCodeExtension):
    def extendMarkdown(self, md: markdown.Markdown) -> None:  # noqa: N802 (Python-Markdown's name)
        md.registerExtension(self)
        md.preprocessors.register(_LanguageOnlyFences(md, self.getConfigs()), "fenced_code_block", 25)


class _NoRawHtml(Extension):
    def extendMarkdown(self, md: markdown.Markdown) -> None:  # noqa: N802
        md.preprocessors.deregister("html_block")
        # `entity` and `automail` only stash markup the allow-list cannot see; the
        # serialiser already keeps character references as they are.
        for pattern in ("html", "entity", "automail"):
            md.inlinePatterns.deregister(pattern)
        # After `inline` (20), which builds links and images, and after `unescape` (0).
        md.treeprocessors.register(_AllowList(md), "allow_list", -10)


class SafeMarkdown:
    """A reusable renderer (building one costs more than a conversion) with a cache of results.

    The cache pays off because a group's rollouts repeat the same system prompt and question.
    """

    def __init__(self, cache_size: int = CACHE_SIZE) -> None:
        self._md = markdown.Markdown(
            extensions=[_SafeFencedCode(), "tables", "nl2br", _NoRawHtml()],
            extension_configs={"tables": {"use_align_attribute": True}},
        )
        self.render = lru_cache(maxsize=cache_size)(self._convert)

    def _convert(self, text: str) -> str:
        self._md.reset()
        return self._md.convert(text)
