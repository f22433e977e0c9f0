"""`registry`: reward functions by name, loaded from this package on first use.

``registry.create("accuracy")`` or ``registry.create({"type": "format", "weight": 0.5,
"params": {...}})`` builds a reward. Classes register themselves with ``@registry.register``
under their lower-cased name without a trailing ``reward`` (``AccuracyReward`` ->
``accuracy``); an unknown name is looked up in the module of that name (``accuracy``,
``accuracy_reward``, ``r1`` -> ``r1_reward.py``) and, failing a class, in its functions.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Callable, Optional, Union

from atroposlib.envs.reward_fns.reward_function import RewardFunction

log = logging.getLogger("atroposlib.rewards")
PACKAGE = "atroposlib.envs.reward_fns"


class LegacyFunctionWrapper(RewardFunction):
    """A plain ``f(completions, **kwargs)`` function used as a reward."""

    def __init__(self, func: Callable[..., Any], weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, name=getattr(func, "__name__", "function"), **kwargs)
        self.func = func

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        result = self.func(completions, **{**self.config, **kwargs})
        if isinstance(result, (int, float)):
            return [float(result)] * len(completions)
        return [float(value) for value in result]


def derived_name(cls: type) -> str:
    name = cls.__name__.lower()
    return name[: -len("reward")] if name.endswith("reward") and name != "reward" else name


class RewardRegistry:
    def __init__(self) -> None:
        self._classes: dict[str, type[RewardFunction]] = {}
        self._functions: dict[str, Callable[..., Any]] = {}

    def register(self, cls: Optional[type] = None, name: Optional[str] = None) -> Any:
        """Class decorator, usable as ``@register`` or ``@register(name="...")``."""

        def add(target: type) -> type:
            if not (isinstance(target, type) and issubclass(target, RewardFunction)):
                raise TypeError(f"{target!r} is not a RewardFunction subclass")
            self._classes[name or derived_name(target)] = target
            return target

        return add(cls) if cls is not None else add

    def register_function(self, name: str, function: Callable[..., Any]) -> None:
        self._functions[name] = function

    def list_registered(self) -> list[str]:
        return sorted({*self._classes, *self._functions})

    def get(self, name: str) -> Union[type[RewardFunction], Callable[..., Any]]:
        found = self._find(name)
        if found is None:
            self._load(name)
            found = self._find(name)
        if found is None:
            raise ImportError(f"no reward function named {name!r} (known: {', '.join(self.list_registered())})")
        return found

    def _find(self, name: str) -> Optional[Union[type[RewardFunction], Callable[..., Any]]]:
        base = name[: -len("_reward")] if name.endswith("_reward") else name
        for key in (name, base, base.replace("_", "")):
            if key in self._classes:
                return self._classes[key]
        return self._functions.get(name)

    def _load(self, name: str) -> None:
        base = name[: -len("_reward")] if name.endswith("_reward") else name
        for module_name in dict.fromkeys((base, f"{base}_reward", name)):
            try:
                module = importlib.import_module(f"{PACKAGE}.{module_name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{PACKAGE}.{module_name}":
                    raise
                continue
            if self._find(name) is not None:
                return
            for function_name in (base, f"{base}_reward", name):
                function = getattr(module, function_name, None)
                if callable(function) and not isinstance(function, type):
                    self.register_function(name, function)
                    return

    def create(self, name_or_config: Union[str, dict[str, Any]], **kwargs: Any) -> RewardFunction:
        if isinstance(name_or_config, str):
            name, params = name_or_config, dict(kwargs)
        else:
            config = dict(name_or_config)
            name = config.pop("type")
            config.update(config.pop("params", None) or {})
            params = {**kwargs, **config}
        target = self.get(name)
        if isinstance(target, type):
            return target(**params)
        return LegacyFunctionWrapper(target, **params)

    def load_required_functions(self, config: Any) -> list[str]:
        """Load every reward a dataset/run config names; returns the names."""
        def names_in(entries: Any) -> list[str]:
            return [e["type"] if isinstance(e, dict) else e for e in entries or []]

        get = (lambda key, source=config: source.get(key) if isinstance(source, dict) else getattr(source, key, None))
        wanted: list[str] = []
        for dataset in get("datasets") or []:
            wanted += names_in(get("dataset_reward_funcs", dataset)) + names_in(get("reward_funcs", dataset))
        for entry in get("types") or []:
            wanted += names_in(get("reward_funcs", entry))
        wanted += names_in(get("reward_functions")) + names_in(get("reward_funcs"))
        for name in wanted:
            self.get(name)
        return wanted


registry = RewardRegistry()
