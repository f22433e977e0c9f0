"""The Gradio app of `view-run` and `view-run-multimodal` (the only modules that import Gradio).

A page shows one group of the feed: a status line (group i of n, env, origin, score range),
the prompt ("Prefix"; for multimodal groups the image and the "Text Prompt"), then one row
per rollout with its score (``Score_i``, the best highlighted) and its completion
(``Output_i``, trained tokens marked). Completions are handed to the page as escaped HTML
built by `viewer_render`, so model output is never interpreted as markup.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Optional

import gradio as gr

from atroposlib.cli import viewer_images
from atroposlib.cli.batch_source import ToolRefused
from atroposlib.cli.viewer_feed import GroupFeed
from atroposlib.cli.viewer_render import GroupView, completion_html, format_score, status_html, view_group

CSS = """
.vr-completion { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 13px;
  line-height: 1.45; padding: 8px 10px; max-height: 420px; overflow-y: auto; }
mark.vr-trained { background: #fde68a; color: inherit; border-radius: 2px; }
.vr-status { font-size: 14px; padding: 4px 2px; }
.vr-note { color: #9a3412; }
.block.vr-best { outline: 3px solid #059669; outline-offset: -1px; }
.vr-best textarea, .vr-best input { background: #d1fae5 !important; font-weight: 700; }
"""
CACHED_VIEWS = 64  # decoded groups kept, so paging back and forth does not decode again


@dataclass(frozen=True)
class ViewerOptions:
    """How the page is laid out: `slots` rollout rows, and the multimodal image and prompt."""

    title: str
    slots: int
    multimodal: bool = False
    fetch_label: str = "Grab Next Batch"
    fetch_on_load: bool = False


class GroupPage:
    """Turns a position in the feed into the values of the page's components."""

    def __init__(self, feed: GroupFeed, tokenizer: Any, options: ViewerOptions) -> None:
        self.feed = feed
        self.options = options
        self.tokenizer = tokenizer
        self.view = lru_cache(maxsize=CACHED_VIEWS)(self._view)

    def _view(self, index: int) -> GroupView:
        return view_group(self.feed[index].group, self.tokenizer)

    def show(self, index: int, message: str = "") -> list[Any]:
        """Component values for group `index` (or the empty page), in `components` order."""
        if not len(self.feed):
            hint = f"No group yet: click “{self.options.fetch_label}”." if self.feed.can_fetch else "No group."
            return self._values(None, index, message or hint)
        index = max(0, min(index, len(self.feed) - 1))
        try:
            view = self.view(index)
        except ValueError as err:
            return self._values(None, index, f"cannot show group {index + 1}: {err}")
        hidden = len(view.completions) - self.options.slots
        if hidden > 0:
            extra = f"showing the first {self.options.slots} of {len(view.completions)} rollouts (see --group-size)"
            message = f"{message}; {extra}" if message else extra
        return self._values(view, index, message)

    def previous(self, index: int) -> list[Any]:
        return self.show(index - 1)

    def next(self, index: int) -> list[Any]:
        return self.show(index + 1)

    def fetch(self, index: int) -> list[Any]:
        first, message = self.feed.fetch_more()
        return self.show(index if first is None else first, message)

    def load(self, index: int) -> list[Any]:
        if self.options.fetch_on_load and not len(self.feed):
            return self.fetch(index)
        return self.show(index)

    def _values(self, view: Optional[GroupView], index: int, message: str) -> list[Any]:
        origin = self.feed[index].origin if view is not None else ""
        status = status_html(view, index, len(self.feed), origin, message)
        prompt = view.prompt if view is not None else ""
        head: list[Any] = [prompt]
        if self.options.multimodal:
            image = viewer_images.group_image(self.feed[index].group, prompt) if view is not None else None
            head = [image, viewer_images.text_prompt(prompt)]
        best = view.best() if view is not None else frozenset()
        completions = view.completions if view is not None else ()
        outputs, scores = [], []
        for slot in range(self.options.slots):
            shown = slot < len(completions)
            label = f"_{slot + 1}" + (" (best)" if slot in best else "")
            classes = ["vr-best"] if slot in best else []
            outputs.append(gr.update(value=completion_html(completions[slot]) if shown else "", visible=shown,
                                     label=f"Output{label}", elem_classes=["vr-output", *classes]))
            scores.append(gr.update(value=format_score(completions[slot].score) if shown else "", visible=shown,
                                    label=f"Score{label}", elem_classes=["vr-score", *classes]))
        # From a group that cannot be shown the neighbours can still be reached. The fetch button
        # waits for the page's load event too: a batch fetched before it would be hidden by the
        # load's own answer, computed on the empty feed and delivered after the fetch's.
        navigation = [gr.update(interactive=index > 0), gr.update(interactive=index + 1 < len(self.feed)),
                      gr.update(interactive=True)]
        return [*head, *outputs, *scores, status, index, *navigation]


def build_demo(page: GroupPage) -> gr.Blocks:
    """The Blocks app; the fetch button's event is the API endpoint ``get_batch``, whose first
    outputs are the prompt, the completions and the scores, as in Atropos."""
    options = page.options
    with gr.Blocks(title=options.title, analytics_enabled=False) as demo:
        gr.HTML(f"<h2>{html.escape(options.title)}</h2>", js_on_load=None)
        index = gr.State(0)
        with gr.Row():
            previous = gr.Button("Previous group", interactive=False)
            following = gr.Button("Next group", interactive=False)
            fetch = gr.Button(options.fetch_label, variant="primary", visible=page.feed.can_fetch, interactive=False)
        status = gr.HTML(elem_id="vr-status", js_on_load=None)
        head: list[Any] = []
        with gr.Row():
            if options.multimodal:
                head.append(gr.Image(label="Image", type="pil", interactive=False, height=280, scale=2,
                                     elem_id="vr-image", buttons=["download", "fullscreen"]))
            head.append(gr.Textbox(label="Text Prompt" if options.multimodal else "Prefix", lines=3, max_lines=14,
                                   interactive=False, elem_id="vr-prompt", scale=3))
        outputs, scores = [], []
        for slot in range(options.slots):
            with gr.Row(equal_height=False):
                with gr.Column(scale=1, min_width=120):
                    scores.append(gr.Textbox(label=f"Score_{slot + 1}", interactive=False, visible=False,
                                             elem_classes=["vr-score"]))
                with gr.Column(scale=7):
                    outputs.append(gr.HTML(label=f"Output_{slot + 1}", show_label=True, container=True,
                                           visible=False, js_on_load=None, elem_classes=["vr-output"]))
        components = [*head, *outputs, *scores, status, index, previous, following, fetch]
        previous.click(page.previous, inputs=index, outputs=components, api_name="previous_group")
        following.click(page.next, inputs=index, outputs=components, api_name="next_group")
        fetch.click(page.fetch, inputs=index, outputs=components, api_name="get_batch")
        demo.load(page.load, inputs=index, outputs=components, api_name=False)
    return demo


def serve(demo: gr.Blocks, *, host: str, port: int, share: bool, announce: Callable[[str], None]) -> None:
    """Serve `demo` until interrupted (KeyboardInterrupt, which SIGTERM is turned into upstream);
    the server is closed on the way out."""
    try:
        _, local_url, share_url = demo.launch(server_name=host, server_port=port, share=share, quiet=True,
                                              prevent_thread_lock=True, ssr_mode=False, css=CSS,
                                              footer_links=[])
    except OSError as err:
        demo.close()
        raise ToolRefused(f"cannot serve on {host}:{port} ({err}); pass another --port") from None
    try:
        announce(f"serving on {local_url}" + (f" and {share_url}" if share_url else "") + " (Ctrl-C to stop)")
        while True:
            time.sleep(3600)
    finally:
        demo.close()
