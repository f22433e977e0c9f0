"""Returns and advantages for GRPO-style training (NumPy only)."""

from __future__ import annotations

import numbers
from typing import Any, Optional, Sequence, Union

import numpy as np


def allclose_to_first(
    values: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False, return_vector: bool = False
) -> Union[bool, np.ndarray]:
    """Whether every row of `values` is close to the first (or the per-row answer)."""
    array = np.asarray(values)
    close = np.isclose(array, array[0], rtol=rtol, atol=atol, equal_nan=equal_nan)
    per_row = close.reshape(close.shape[0], -1).all(axis=1) if close.ndim > 1 else close
    return per_row if return_vector else bool(per_row.all())


def _leaves(data: Any) -> list[float]:
    if isinstance(data, bool) or not isinstance(data, (numbers.Real, list, tuple, np.ndarray)):
        raise ValueError(f"expected numbers or nested lists of numbers, found {type(data).__name__}")
    if isinstance(data, numbers.Real):
        return [float(data)]
    return [leaf for element in data for leaf in _leaves(element)]


def compute_stats(data: Any) -> dict[str, float]:
    """Mean and population variance over a nested (possibly jagged) list of numbers."""
    numbers_found = _leaves(data)
    if not numbers_found:
        raise ValueError("no numbers to summarise")
    values = np.asarray(numbers_found, dtype=np.float64)
    mean = float(values.mean())
    return {"mean": mean, "var": float((values**2).mean() - mean**2)}


def compute_discounted_returns(rewards: Any, gamma: float) -> np.ndarray:
    """G_t = r_t + gamma * G_{t+1}."""
    values = rewards if isinstance(rewards, np.ndarray) else np.asarray(rewards, dtype=np.float32)
    returns = np.zeros_like(values)
    running = 0.0
    for t in range(len(values) - 1, -1, -1):
        running = values[t] + gamma * running
        returns[t] = running
    return returns


def compute_grpo_process_supervision_advantages(
    rewards: Sequence[Sequence[float]], gamma: Optional[float] = None, std_tol: float = 1e-8
) -> list[np.ndarray]:
    """Per-step advantages: rewards normalised over all trajectories, then summed to go
    (reversed cumulative sum, or discounted returns when `gamma` is given)."""
    flat = np.concatenate([np.asarray(r, dtype=np.float64) for r in rewards])
    std = flat.std()
    if std < std_tol:
        raise ValueError(f"reward standard deviation {std} is below {std_tol}: nothing to compare")
    mean = flat.mean()
    advantages = []
    for trajectory in rewards:
        normalised = (np.asarray(trajectory, dtype=np.float64) - mean) / std
        if gamma is None:
            advantages.append(np.cumsum(normalised[::-1])[::-1])
        else:
            advantages.append(compute_discounted_returns(normalised, gamma))
    return advantages
