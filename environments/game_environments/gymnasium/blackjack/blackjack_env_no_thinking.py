"""Blackjack without thinking: whole Gymnasium Blackjack episodes, one tool call per turn.

Each rollout plays one episode of Gymnasium's ``Blackjack-v1`` from the item's seed (all
rollouts of a group get the same deal). Every turn the model sees its hand total, the
dealer's visible card and whether it holds a usable ace, and answers with a single
``<tool_call>`` of the ``take_action`` tool (``{"action": "hit"}`` or ``"stick"``), with no
reasoning block. The conversation stays on one inference server (``dedicated_server()``).
At most ``max_episode_turns`` turns are played.

Reward: the game's outcome under Gymnasium's rules, +1 win, 0 draw, -1 loss; a reply that
is not a valid ``take_action`` call ends the episode with -1.
Every assistant turn is trained on.

Data: none; deals come from ``gymnasium`` with random seeds (evaluation uses seeds above
1,000,000, training seeds below).

Offline (the tests' scripted server, or any OpenAI-compatible server):

    python environments/game_environments/gymnasium/blackjack/blackjack_env_no_thinking.py process \\
        --openai.base_url http://localhost:9001/v1 --openai.model_name MODEL \\
        --env.tokenizer_name MODEL --env.group_size 4 --env.total_steps 2 --env.use_wandb false

For real (run-api on :8000, an inference server on :9001):

    python environments/game_environments/gymnasium/blackjack/blackjack_env_no_thinking.py serve \\
        --openai.base_url http://localhost:9001/v1 --openai.model_name MODEL --env.tokenizer_name MODEL

Differences from Atropos's file: the prompt-length check counts tokens (Atropos compares the
prompt's characters with the token budget); an inference error drops the rollout instead of
scoring it as a draw; evaluation episodes do not count in the training metrics, and
``evaluate`` also saves its metrics with ``evaluate_log`` when ``data_dir_to_save_evals`` is set.
"""

import json
import logging
import random
from typing import Dict, List, Optional, Tuple

import gymnasium as gym
from pydantic import Field

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataItem
from atroposlib.type_definitions import Item, Message
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer
from atroposlib.utils.tool_call_parser import parse_tool_call

logger = logging.getLogger(__name__)

ACTION_HIT = 1
ACTION_STICK = 0
ACTION_MAP_TO_STR = {ACTION_HIT: "hit", ACTION_STICK: "stick"}
ACTION_STR_TO_INT = {v: k for k, v in ACTION_MAP_TO_STR.items()}


class BlackjackEnvNoThinkingConfig(BaseEnvConfig):
    """Settings of `BlackjackEnvNoThinking` (plus every `BaseEnvConfig` field)."""

    env_name: str = Field(default="Blackjack-v1", description="Gymnasium environment id.")
    max_episode_turns: int = Field(default=10, description="Turns per episode at most.")
    eval_episodes: int = Field(default=100, description="Episodes played by evaluate().")


class BlackjackEnvNoThinking(BaseEnv):
    name = "blackjack_no_thinking"
    env_config_cls = BlackjackEnvNoThinkingConfig

    def __init__(self, config: BlackjackEnvNoThinkingConfig, server_configs: List[APIServerConfig],
                 slurm: bool = True, testing: bool = False):
        super().__init__(config, server_configs, slurm, testing)
        self.config: BlackjackEnvNoThinkingConfig = config
        self.episode_outcomes_buffer: List[float] = []
        self.eval_metrics_custom: List[Tuple[str, float]] = []
        self.tools = [
            {
                "type": "function",
                "function": {
                    "name": "take_action",
                    "description": "Play your Blackjack turn: 'hit' draws another card, 'stick' ends your turn.",
                    "parameters": {
                        "type": "object",
                        "properties": {"action": {"type": "string", "enum": ["hit", "stick"]}},
                        "required": ["action"],
                    },
                },
            }
        ]
        self.system_prompt = (
            "You are playing Blackjack against the dealer. Each turn you are told your hand total, the card the "
            "dealer shows and whether you hold an ace that can still count as 11. Decide whether to draw another "
            "card ('hit') or to end your turn ('stick').\n\n"
            f"You can call this tool:\n<tools>\n{json.dumps(self.tools)}\n</tools>\n\n"
            "Answer with the tool call only: a JSON object with the tool's name and arguments between "
            "<tool_call> and </tool_call>, and no reasoning or <think> block. For example:\n"
            '<tool_call>\n{"name": "take_action", "arguments": {"action": "hit"}}\n</tool_call>'
        )

    @classmethod
    def config_init(cls) -> Tuple[BlackjackEnvNoThinkingConfig, List[APIServerConfig]]:
        env_config = BlackjackEnvNoThinkingConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
            group_size=16,
            use_wandb=True,
            rollout_server_url="http://localhost:8000",
            max_token_length=2048,
            wandb_name=cls.name,
            steps_per_eval=50,
            max_episode_turns=10,
            eval_episodes=100,
        )
        server_configs = [
            APIServerConfig(
                model_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
                base_url="http://localhost:9001/v1",
                api_key="x",
                num_requests_for_eval=128,
            ),
        ]
        return env_config, server_configs

    def _format_observation(self, obs: Tuple[int, int, int]) -> str:
        player_sum, dealer_card, usable_ace = obs
        return (f"Your hand totals {int(player_sum)}. The dealer shows {int(dealer_card)} (1 is an ace). "
                f"Usable ace in your hand: {'yes' if usable_ace else 'no'}.")

    def _parse_action_from_llm(self, llm_response: str) -> Optional[int]:
        """ACTION_HIT / ACTION_STICK from a ``take_action`` tool call, or None."""
        if not llm_response:
            logger.warning("empty reply: no action")
            return None
        name, arguments, is_error = parse_tool_call(llm_response, self.tools, ["tool_call"])
        if is_error or name != "take_action":
            logger.warning("no valid take_action call in %r", llm_response[:200])
            return None
        action = str(arguments.get("action", "")).strip().lower()
        if action not in ACTION_STR_TO_INT:
            logger.warning("take_action called with an unknown action %r", action)
            return None
        return ACTION_STR_TO_INT[action]

    async def _play_episode(self, seed: int) -> Optional[Tuple[List[Message], float]]:
        """(messages, game reward) of one episode from `seed`; None when it could not be played."""
        try:
            env = gym.make(self.config.env_name)
            obs, _ = env.reset(seed=seed)
        except Exception as exc:
            logger.error("cannot start %s with seed %s: %s", self.config.env_name, seed, exc)
            return None
        messages: List[Message] = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self._format_observation(obs)},
        ]
        game_reward = 0.0
        try:
            async with self.server.dedicated_server() as server:
                for _ in range(self.config.max_episode_turns):
                    used = len(tokenize_for_trainer(self.tokenizer, messages)["tokens"])
                    if used > self.config.max_token_length - 50:
                        logger.warning("[seed %s] the conversation reached max_token_length; episode cut short", seed)
                        break
                    try:
                        completion = await server.chat_completion(messages=messages, n=1, max_tokens=512,
                                                                  temperature=0.5)
                    except Exception as exc:
                        logger.error("[seed %s] inference failed: %s", seed, exc)
                        return None
                    reply = (completion.choices[0].message.content or "").strip()
                    messages.append({"role": "assistant", "content": reply})
                    action = self._parse_action_from_llm(reply)
                    if action is None:
                        game_reward = -1.0
                        break
                    obs, reward, terminated, truncated, _ = env.step(action)
                    game_reward = float(reward)
                    if terminated or truncated:
                        break
                    messages.append({"role": "user", "content": self._format_observation(obs)})
        finally:
            env.close()
        return messages, game_reward

    async def collect_trajectory(self, item: Item) -> Tuple[Optional[ScoredDataItem], List[Item]]:
        played = await self._play_episode(item["seed"])
        if played is None:
            return None, []
        messages, game_reward = played
        self.episode_outcomes_buffer.append(game_reward)
        tokenized = tokenize_for_trainer(tokenizer=self.tokenizer, chat=messages, train_on_all_assistant_turns=True)
        return ScoredDataItem(
            messages=messages if self.config.include_messages else None,
            tokens=tokenized["tokens"],
            masks=tokenized["masks"],
            scores=game_reward,
        ), []

    async def get_next_item(self) -> Item:
        return {"seed": random.randint(0, 1_000_000)}

    async def setup(self):
        logger.info("setting up %s", self.name)

    async def evaluate(self, *args, **kwargs):
        """Play `eval_episodes` episodes on evaluation seeds; win/loss/draw rates and mean reward."""
        outcomes: List[float] = []
        for _ in range(self.config.eval_episodes):
            played = await self._play_episode(random.randint(1_000_001, 2_000_000))
            if played is not None:
                outcomes.append(played[1])
        if not outcomes:
            logger.warning("no evaluation episode finished")
            self.eval_metrics_custom = []
            return
        count = len(outcomes)
        self.eval_metrics_custom = [
            (f"{self.name}_eval/win_rate", sum(o > 0 for o in outcomes) / count),
            (f"{self.name}_eval/loss_rate", sum(o < 0 for o in outcomes) / count),
            (f"{self.name}_eval/draw_rate", sum(o == 0 for o in outcomes) / count),
            (f"{self.name}_eval/avg_reward", sum(outcomes) / count),
            (f"{self.name}_eval/num_completed_episodes", count),
        ]
        logger.info("evaluation of %s: %s", self.name, self.eval_metrics_custom)
        if self.config.data_dir_to_save_evals:
            self.evaluate_log(dict(self.eval_metrics_custom))

    async def wandb_log(self, wandb_metrics: Optional[Dict[str, float]] = None):
        wandb_metrics = dict(wandb_metrics or {})
        outcomes = self.episode_outcomes_buffer
        if outcomes:
            wandb_metrics[f"{self.name}_train/avg_episode_reward"] = sum(outcomes) / len(outcomes)
            wandb_metrics[f"{self.name}_train/win_count"] = sum(1 for r in outcomes if r > 0)
            wandb_metrics[f"{self.name}_train/loss_count"] = sum(1 for r in outcomes if r < 0)
            wandb_metrics[f"{self.name}_train/draw_count"] = sum(1 for r in outcomes if r == 0)
            wandb_metrics[f"{self.name}_train/num_episodes_in_batch"] = len(outcomes)
        self.episode_outcomes_buffer = []
        for key, value in self.eval_metrics_custom:
            wandb_metrics[key] = value
        self.eval_metrics_custom = []
        await super().wandb_log(wandb_metrics)


if __name__ == "__main__":
    BlackjackEnvNoThinking.cli()
