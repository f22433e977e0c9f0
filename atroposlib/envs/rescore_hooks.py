"""`RescoreHooks`: what an environment defines so that its saved groups can be scored again.

``rescore`` mode (`atroposlib.envs.rescore`) reads the groups ``process`` or ``serve`` saved
(JSONL rows holding the item each group came from, and the per-rollout facts its scoring used)
and asks the environment for new scores without inference. `BaseEnv` inherits these hooks;
an environment overrides `rescore_group` (and `item_for_saving` for items JSON cannot hold), or
sets `cannot_rescore` to say why it cannot.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Optional

from atroposlib.envs.types import ScoredDataGroup
from atroposlib.type_definitions import Item

log = logging.getLogger("atroposlib.envs")

# The field of a saved group (a JSONL row of process or serve) that holds the item it came from.
SAVED_ITEM_FIELD = "item"
# A group's per-rollout facts its scoring used besides the reply (one dict per rollout, e.g.
# {"finish_reason": "length"}): an env may set it; it is saved in the JSONL row for rescoring
# and taken off the group before the group is checked or sent (the API never sees it).
RESCORE_FACTS_FIELD = "rescore_facts"


class CannotRescore(Exception):
    """The environment cannot score a saved group again without inference (the reason says why)."""


class RescoreHooks:
    """The rescoring hooks of `BaseEnv`, and the saving of a group with what they need."""

    # Why `rescore_group` cannot work for this env, in a few words ("its score is a judge model's
    # verdict"): ``rescore`` mode prints it. None: the default says rescore_group is not defined.
    cannot_rescore: Optional[str] = None
    tokenizer: Any

    async def rescore_group(self, group: ScoredDataGroup, item: Item) -> list[float]:
        """The scores the rollouts of `group`, a saved group of `item`, get from the scoring as
        it is now, without inference: one per rollout, in order (``rescore`` mode).

        Override it where a score depends only on the rollout and its item, calling the same
        function `collect_trajectories` scores with (`completions` gives each rollout's reply);
        otherwise set `cannot_rescore` to say why."""
        reason = self.cannot_rescore or "it does not define rescore_group(group, item)"
        raise CannotRescore(f"{type(self).__name__} cannot re-score saved groups: {reason}")

    def completions(self, group: ScoredDataGroup) -> list[str]:
        """Each rollout's reply: its last message's content, or (no messages saved) its
        trained tokens decoded."""
        messages = group.get("messages") or []
        if len(messages) == len(group["scores"]) and all(isinstance(m, list) and m for m in messages):
            return [str(conversation[-1].get("content") or "") for conversation in messages]
        return [self.tokenizer.decode([t for t, m in zip(tokens, masks) if m != -100], skip_special_tokens=True)
                for tokens, masks in zip(group["tokens"], group["masks"])]

    @staticmethod
    def saved_facts(group: ScoredDataGroup, key: str) -> list[Any]:
        """Each rollout's `key` from the group's saved `RESCORE_FACTS_FIELD` (ValueError if absent)."""
        facts = group.get(RESCORE_FACTS_FIELD)
        if not isinstance(facts, list) or len(facts) != len(group["scores"]) or \
                not all(isinstance(f, dict) and key in f for f in facts):
            raise ValueError(f"the group was saved without each rollout's {key} ({RESCORE_FACTS_FIELD})")
        return [f[key] for f in facts]

    def item_for_saving(self, item: Item) -> Any:
        """`item` as saved with its groups (JSON), and as `rescore_group` gets it back.
        Override for items JSON cannot hold (tuples of frozensets, objects)."""
        return item

    def _saved_row(self, group: ScoredDataGroup, item: Item, facts: Optional[list[Any]] = None) -> str:
        """`group` as a JSONL row, with the item it came from and its rescore facts (``rescore``
        mode needs them) when they are JSON; the group sent to the API is left as it is."""
        extra = {RESCORE_FACTS_FIELD: facts} if facts is not None else {}
        if item is not None:
            try:
                extra[SAVED_ITEM_FIELD] = self.item_for_saving(item)
                return json.dumps({**group, **extra})
            except (TypeError, ValueError) as exc:
                if not getattr(self, "_said_item_not_json", False):
                    self._said_item_not_json = True
                    log.warning("items are not JSON (%s): groups are saved without them and cannot be re-scored "
                                "(define item_for_saving)", exc)
                extra.pop(SAVED_ITEM_FIELD)
        try:
            return json.dumps({**group, **extra})
        except (TypeError, ValueError):
            return json.dumps(group)
