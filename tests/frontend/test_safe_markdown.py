"""Markdown of model output keeps its formatting and can carry no markup, scripts or unsafe links."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from atroposlib.frontend.safe_markdown import ALLOWED_ATTRIBUTES, ALLOWED_TAGS, SafeMarkdown, is_safe_url

HOSTILE = [
    "<script>window.__pwned=1</script>",
    '<img src=x onerror="window.__pwned=1">',
    "<iframe src=javascript:alert(1)></iframe>\n\n<style>body{display:none}</style>",
    '<div onclick="alert(1)">\n\n*hi*\n\n</div>',
    "[x](javascript:alert(1)) [y](JaVaScRiPt:alert(1)) [z]( javascript:alert(1))",
    "[x](javascript&#58;alert(1)) [y](&#106;avascript:alert(1)) [z](java\tscript:alert(1))",
    "[x](data:text/html;base64,PHNjcmlwdD4=) [y](vbscript:msgbox(1)) [w](file:///etc/passwd)",
    "![pic](javascript:alert(1)) ![pic](https://example.com/track.png)",
    "[ref][r]\n\n[r]: javascript:alert(1)",
    "<javascript:alert(1)> <https://example.com/ok>",
    '[t](https://example.com "x\\" onmouseover=\\"alert(1)")',
    "```{#group-bodies .python .item onclick=alert(1)}\nprint('<b>')\n```",
    "``` html\n<script>alert(1)</script>\n```",
    "*<b onmouseover=alert(1)>*  `<script>` &lt;script&gt; &#60;script&#62;",
    "| a | b |\n|:-|-:|\n| <svg onload=alert(1)> | ok |",
    "<!-- <script>alert(1)</script> -->\n<![CDATA[<script>]]>",
]


class Collect(HTMLParser):
    """Every start tag with its attributes, and the visible text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text += data

    def handle_comment(self, data: str) -> None:
        raise AssertionError(f"comment in output: {data!r}")


def parse(markup: str) -> Collect:
    collected = Collect()
    collected.feed(markup)
    collected.close()
    return collected


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_markdown_yields_only_allowed_markup(text: str) -> None:
    out = SafeMarkdown().render(text)
    for tag, attributes in parse(out).tags:
        assert tag in ALLOWED_TAGS or (tag == "code" and set(attributes) <= {"class"}), out
        for name, value in attributes.items():
            if tag == "code":
                assert value and value.startswith("language-") and " " not in value, out
                continue
            assert name in ALLOWED_ATTRIBUTES.get(tag, ()), out
            if name == "href":
                assert value and value.startswith(("https://", "http://", "mailto:", "#")), out


def test_raw_html_is_shown_as_text_and_formatting_survives() -> None:
    render = SafeMarkdown().render
    collected = parse(render("**bold** and `a<b && c` <script>x</script>"))
    assert collected.text == "bold and a<b && c <script>x</script>"
    assert [tag for tag, _ in collected.tags] == ["p", "strong", "code"]
    assert "<pre><code class=\"language-python\">if a &lt; b:\n" in render("```python\nif a < b:\n    pass\n```")
    assert render("line one\nline two") == "<p>line one<br />\nline two</p>"
    table = parse(render("| a | b |\n|:-|-:|\n| 1 | 2 |"))
    assert ("td", {"align": "right"}) in table.tags


def test_links_keep_safe_targets_and_images_become_links() -> None:
    render = SafeMarkdown().render
    assert render("[docs](https://example.com/a?b=1&c=2)") == '<p><a href="https://example.com/a?b=1&amp;c=2">docs</a></p>'
    assert render("[x](javascript:alert(1))") == "<p><a>x</a></p>"
    assert render("![chart](https://example.com/c.png)") == '<p><a href="https://example.com/c.png">[image: chart]</a></p>'
    assert is_safe_url("mailto:a@b.c") and is_safe_url("#top")
    assert not is_safe_url("javascript&#x3a;alert(1)") and not is_safe_url("/etc/passwd")


def test_renders_are_cached() -> None:
    renderer = SafeMarkdown(cache_size=8)
    renderer.render("same prompt")
    renderer.render("same prompt")
    assert renderer.render.cache_info().hits == 1
