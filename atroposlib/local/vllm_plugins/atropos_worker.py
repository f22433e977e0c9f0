"""Weight reloads that keep a tied LM head tied, run inside each vLLM worker.

Loaded into vLLM's workers with ``--worker-extension-cls atropos_worker.ReloadWorkerExtension``
(by ``atropos-vllm serve`` and the trainer's bundled server, which put this folder on the
python path: the vLLM runtime has no atroposlib), and called with ``collective_rpc``.

vLLM's in-place ``reload_weights`` reads the checkpoint layer by layer and then redoes each
loaded layer's post-load processing. A model whose LM head shares the input embedding
(``tie_word_embeddings``, as SmolLM2 and many small models) has no head weights in its
checkpoint: the shared tensor gets the new values through the embedding, but the head's own
post-load processing is skipped ("ParallelLMHead: Failed to load weights"), and on a CPU that
processing is what builds the matrix multiply the head runs (oneDNN, on the weights it had
then). The server would sample from the new body through the old head.
`ReloadWorkerExtension.reload_weights_keeping_ties` reloads, then redoes the tied head's
post-load processing on the new weights. It also drops the reload's warnings about layers
that have no weights in a checkpoint by design: the tied head, and rotary embeddings (their
sine and cosine tables are computed, not loaded).
"""

from __future__ import annotations

import logging
import re
from typing import Any, Optional

RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
NOTHING_TO_LOAD = re.compile(r"\w*RotaryEmbedding: Failed to load weights")
TIED_HEAD_WARNING = "ParallelLMHead: Failed to load weights"


class _NoWeightsByDesign(logging.Filter):
    """Drops the reload's warnings about layers a checkpoint has no weights for by design."""

    def __init__(self, tied_head: bool) -> None:
        super().__init__()
        self.tied_head = tied_head

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (NOTHING_TO_LOAD.fullmatch(message) or (self.tied_head and message == TIED_HEAD_WARNING))


def _tied_head_and_embedding(model: Any, hf_config: Any) -> Optional[tuple[Any, Any]]:
    """The LM head and input embedding modules of a tied-embedding model, else None."""
    if not getattr(hf_config, "tie_word_embeddings", False):
        return None
    head = getattr(model, "lm_head", None)
    embedding = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embedding is None or head.weight.shape != embedding.weight.shape:
        return None
    return head, embedding


class ReloadWorkerExtension:
    """Methods added to vLLM's worker class (``self`` is the worker)."""

    def reload_weights_keeping_ties(self, weights_path: str) -> None:
        """`reload_weights` from `weights_path`, then the tied LM head made to use the new weights."""
        hf_config = self.vllm_config.model_config.hf_config  # type: ignore[attr-defined]
        tied = _tied_head_and_embedding(self.model_runner.get_model(), hf_config)  # type: ignore[attr-defined]
        logger, quiet = logging.getLogger(RELOAD_LOGGER), _NoWeightsByDesign(tied_head=tied is not None)
        logger.addFilter(quiet)
        try:
            self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        finally:
            logger.removeFilter(quiet)
        tied = _tied_head_and_embedding(self.model_runner.get_model(), hf_config)  # type: ignore[attr-defined]
        if tied is not None:
            head, embedding = tied
            if head.weight is not embedding.weight:  # the reload gave the embedding a tensor of its own
                head.weight = embedding.weight
            head.quant_method.process_weights_after_loading(head)
