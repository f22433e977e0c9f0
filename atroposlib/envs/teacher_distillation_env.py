"""Environments whose groups also carry a teacher model's top-k token logprobs.

Before a group is sent, every sequence is scored by the teacher (``get_logprobs`` on its
token ids) and the group gets ``distill_token_ids`` / ``distill_logprobs`` of shape
``[sequence][position][k]``. Any failure or length mismatch leaves both ``None`` for the
whole group, so a trainer never sees partial teacher data.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC
from typing import Any, Optional

from pydantic import Field

from atroposlib.envs.base import BaseEnv, Groups
from atroposlib.envs.config import BaseEnvConfig
from atroposlib.envs.server_handling.resolve import ServerConfigs
from atroposlib.envs.server_handling.server_manager import ServerManager

log = logging.getLogger("atroposlib.envs")


class TeacherDistillationConfig(BaseEnvConfig):
    teacher_enabled: bool = Field(default=False, description="Attach a teacher model's top-k logprobs to every group.")
    teacher_top_k: int = Field(default=0, ge=-1, description="Teacher tokens per position; 0: the sampled one only; -1: off.")


class TeacherDistillationEnv(BaseEnv, ABC):
    """`BaseEnv` plus a teacher inference server (``--teacher.*`` flags, YAML ``teacher:``)."""

    env_config_cls = TeacherDistillationConfig
    teacher_namespace = "teacher"
    _teacher_server_configs: Optional[ServerConfigs] = None

    @classmethod
    def teacher_config_init(cls) -> Optional[ServerConfigs]:
        """Default teacher server configs (None: none unless given on the command line)."""
        return None

    def __init__(self, config: TeacherDistillationConfig, server_configs: ServerConfigs, *args: Any,
                 teacher_server_configs: Optional[ServerConfigs] = None, **kwargs: Any) -> None:
        super().__init__(config, server_configs, *args, **kwargs)
        self.teacher_server: Optional[ServerManager] = None
        if not config.teacher_enabled:
            return
        teacher = teacher_server_configs or type(self)._teacher_server_configs or self.teacher_config_init()
        if teacher is None:
            raise ValueError("teacher_enabled needs teacher server configs (--teacher.base_url ... or teacher_config_init)")
        self.teacher_server = ServerManager(teacher)
        self._check_same_tokenizer(self.teacher_server)

    def _check_same_tokenizer(self, teacher: ServerManager) -> None:
        server_config = teacher.servers[0].config
        name = server_config.model_name if server_config.tokenizer_name == "none" else server_config.tokenizer_name
        if name == self.config.tokenizer_name:
            return
        from transformers import AutoTokenizer

        if AutoTokenizer.from_pretrained(name).get_vocab() != self.tokenizer.get_vocab():
            raise ValueError(f"the teacher's tokenizer {name} differs from the environment's {self.config.tokenizer_name}")

    async def handle_send_to_api(self, scored_data: Groups, item: Any = None, do_send_to_api: bool = True,
                                 abort_on_any_max_length_exceeded: bool = True) -> Any:
        groups = [scored_data] if isinstance(scored_data, dict) else list(scored_data or [])
        await asyncio.gather(*(self._attach_teacher(g) for g in groups if g is not None))
        return await super().handle_send_to_api(scored_data, item, do_send_to_api, abort_on_any_max_length_exceeded)

    async def _attach_teacher(self, group: dict[str, Any]) -> None:
        overrides = group.get("group_overrides") or {}
        top_k = overrides.get("teacher_top_k", self.config.teacher_top_k)
        group["distill_token_ids"], group["distill_logprobs"] = None, None
        if self.teacher_server is None or not group.get("tokens") or overrides.get("skip_teacher_top_k") or top_k <= -1:
            return
        try:
            scored = await asyncio.gather(*(
                self.teacher_server.get_logprobs(input_ids=seq, top_k=top_k, max_tokens=1, split="train")
                for seq in group["tokens"]
            ))
        except Exception as exc:
            log.warning("teacher scoring failed; the group goes without distillation data: %s", exc)
            return
        if any(len(s["prompt_topk_token_ids"]) != len(seq) for s, seq in zip(scored, group["tokens"])):
            log.warning("teacher returned logprobs for the wrong number of positions; skipped")
            return
        group["distill_token_ids"] = [s["prompt_topk_token_ids"] for s in scored]
        group["distill_logprobs"] = [s["prompt_topk_logprobs"] for s in scored]
