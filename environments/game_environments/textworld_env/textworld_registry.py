"""The TextWorld challenges `TextWorldEnv` draws games from, with the settings each may take.

`TextWorldChallengeRegistry.get_challenge(name)` returns ``(name, settings)``: every setting
is drawn from its list of options (or the first option when ``randomize_settings`` is
false), plus a fresh game ``seed`` (and a ``recipe-seed`` for ``tw-cooking``), all from the
registry's own random generator, so a registry created with a seed yields the same games.
"""

import logging
import random
from typing import Any, Dict, List, Optional, Tuple

logger = logging.getLogger(__name__)


class TextWorldChallengeRegistry:
    """The built-in TextWorld challenges and the options of their settings."""

    CHALLENGES: Dict[str, Dict[str, List[Any]]] = {
        "tw-simple": {
            "rewards": ["sparse", "balanced", "dense"],
            "goal": ["detailed", "brief", "none"],
            "test": [False],
        },
        "tw-cooking": {
            "recipe": [1, 2, 3],  # ingredients in the recipe
            "take": [1, 2, 3],  # ingredients to be found
            "cook": [False, True],  # ingredients must be cooked
            "open": [False, True],  # containers and doors must be opened
            "drop": [False, True],  # the inventory is limited
            "go": [1, 6, 9, 12],  # rooms
        },
        "tw-coin_collector": {"level": [1, 2, 3, 4, 5]},
        "tw-treasure_hunter": {"level": [1, 2, 3, 4, 5]},
    }

    ALL_CHALLENGES = list(CHALLENGES.keys())

    def __init__(self, seed: Optional[int] = None):
        self._challenges = dict(self.CHALLENGES)
        self.rng = random.Random(seed)

    def list_challenges(self) -> List[str]:
        return list(self._challenges)

    def get_random_challenge(self, randomize_settings: bool = True) -> Tuple[str, Dict[str, Any]]:
        """A challenge chosen at random, with its settings."""
        return self.get_challenge(self.rng.choice(self.list_challenges()), randomize_settings)

    def get_challenge(self, name: str, randomize_settings: bool = True) -> Tuple[str, Dict[str, Any]]:
        """``(name, settings)`` for one game of challenge `name`."""
        if name not in self._challenges:
            raise ValueError(f"Unknown challenge: {name}. Available: {self.list_challenges()}")
        settings: Dict[str, Any] = {}
        for key, options in self._challenges[name].items():
            settings[key] = self.rng.choice(options) if randomize_settings and len(options) > 1 else options[0]
        settings["seed"] = self.rng.randint(0, 0xFFFFFFFF)
        if name == "tw-cooking":
            settings["recipe-seed"] = self.rng.randint(0, 0xFFFFFFFF)
        return name, settings


def create_textworld_registry(seed: Optional[int] = None) -> TextWorldChallengeRegistry:
    """A registry whose draws are reproducible when `seed` is given."""
    return TextWorldChallengeRegistry(seed)
