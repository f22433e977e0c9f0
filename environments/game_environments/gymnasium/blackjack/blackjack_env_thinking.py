#!/usr/bin/env python3
"""Blackjack with thinking: per-step groups of G alternatives, scored by exact state values.

An item is a seed for Gymnasium's ``Blackjack-v1``. At each turn of the episode the model
is asked for ``group_size`` (G) continuations of the same conversation (system prompt,
observations, earlier chosen moves); each continuation reasons inside ``<think> </think>``
and then calls the ``take_action`` tool with ``hit`` or ``stick``. Every alternative is
played on a copy of the game and scored

    score_i = combined_reward_i + V(s'_i) - V(s_t)

where V is the exact best achievable outcome from a state of this seeded game (an
exhaustive search over hit/stick, cheap for Blackjack; 0 for a finished game) and
combined_reward_i is the immediate game reward, +0.2 for a valid tool call (-0.2 otherwise:
the move defaults to stick), +0.2 for a non-empty reasoning block (-0.2 when it is empty or
missing) and a tie-break bonus ``tiebreak_token_factor * (1 - tokens / max_token_length)``
favouring shorter replies. The alternative with the best score (ties: fewer tokens, then
the earlier one; `select_best_index`) is played for real and its reply, with its reasoning
shortened by ``truncate_thinking``, joins the history. Each turn yields one group of the G
alternatives (with ``seed`` and ``parsed_actions`` keys); an episode (at most ``max_turns``
turns) yields a list of groups, kept within ``max_trajectory_tokens`` by
``ensure_trajectory_token_limit``. Only the alternative's reply is trained on.

Messages use the roles ``environment`` and ``agent`` as in Atropos; with a chat template
that would drop those roles (some only render system/user/assistant/tool), ``user`` and
``assistant`` are used instead.

Data: none; deals come from ``gymnasium`` with random seeds.

Offline (the tests' scripted server, or any OpenAI-compatible server with ``/v1/completions``):

    python environments/game_environments/gymnasium/blackjack/blackjack_env_thinking.py process \\
        --openai.base_url http://localhost:9004/v1 --openai.model_name MODEL \\
        --env.tokenizer_name MODEL --env.group_size 4 --env.total_steps 4 --env.use_wandb false

For real (run-api on :8000, an inference server on :9004):

    python environments/game_environments/gymnasium/blackjack/blackjack_env_thinking.py serve \\
        --openai.base_url http://localhost:9004/v1 --openai.model_name MODEL --env.tokenizer_name MODEL

One episode, printed, against any server: ``blackjack_local_server.py`` beside this file.

Differences from Atropos's file: the reasoning block is found across lines (Atropos's check
never matches a multi-line ``<think>`` block, so every reasoned reply lost 0.2); each
alternative's tokens end with its reply and only the reply is trained on (Atropos tokenised
the following observation as the trained part); the prompt leaves the agent's turn open
(the model continues after ``<think>``) instead of closing it, and ``max_tokens`` leaves room for the
prompt; the class has a ``name`` (``blackjack``) and ``config_init`` names the W&B run
``blackjack`` (Atropos: ``fundamental_metric_prediction``); evaluation runs without W&B too
and its metrics are logged.
"""

import copy
import json
import logging
import random
from typing import Dict, List, Optional, Tuple

import gymnasium
from pydantic import Field
from tqdm.asyncio import tqdm_asyncio

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, EvalHandlingEnum, ScoredDataGroup
from atroposlib.utils.best_of_n_selection import select_best_index
from atroposlib.utils.length_penalty import length_overrun
from atroposlib.utils.message_history_utils import ensure_trajectory_token_limit, truncate_thinking
from atroposlib.utils.reasoning_text import thinking_content
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer
from atroposlib.utils.tool_call_parser import parse_tool_call

logger = logging.getLogger(__name__)

ACTION_STICK, ACTION_HIT, INVALID_ACTION = 0, 1, -1
REPLY_MARK = "\u2063[reply starts here]\u2063"  # located in the template's text, then cut off


class BlackjackEnvConfig(BaseEnvConfig):
    env_name: str = Field(default="Blackjack-v1", description="Gymnasium environment id.")
    temperature: float = Field(default=0.7, description="Sampling temperature of the alternatives.")
    top_p: float = Field(default=0.9, description="Nucleus sampling of the alternatives.")
    max_turns: Optional[int] = Field(default=5, description="Turns per episode at most (None: 5).")
    wandb_name: str = Field(default="blackjack", description="Run name prefix and the env's name at the API.")
    thinking_active: bool = Field(default=True, description="Open each reply with <think> for the model to continue.")
    eval_episodes: int = Field(default=100, description="Episodes played by evaluate().")
    max_think_chars_history: int = Field(
        default=3000, description="Budget of a chosen reply's reasoning kept in the history (truncate_thinking).")
    max_trajectory_tokens: int = Field(
        default=24576, description="Longest step sequence kept (ensure_trajectory_token_limit); the trainer's seq_len.")
    debug_mode: bool = Field(default=False, description="Log every step's scores (DEBUG).")
    group_size: int = Field(default=16, description="Alternatives sampled at each turn (one group per turn).")
    tiebreak_token_factor: float = Field(default=0.01, description="Weight of the shorter-reply bonus.")


class BlackjackScoredDataGroup(ScoredDataGroup, total=False):
    """A step's group: the G alternatives, plus the episode's seed and each one's parsed action."""

    seed: int
    parsed_actions: List[int]


class EpisodeState:
    """The real game of one episode and what has been played in it."""

    def __init__(self, seed: int, env: gymnasium.Env):
        self.seed = seed
        self.env = env
        self.message_history: List[Dict] = []
        self.actions: List[int] = []
        self.step_rewards: List[float] = []
        self.total_reward: float = 0.0
        self.num_steps: int = 0
        self.num_correct_actions: int = 0
        self.num_total_actions: int = 0


class BlackjackEnv(BaseEnv):
    name = "blackjack"
    env_config_cls = BlackjackEnvConfig

    def __init__(self, config: BlackjackEnvConfig, server_configs: List[APIServerConfig], slurm: bool = True,
                 testing: bool = False):
        super().__init__(config, server_configs, slurm, testing)
        self.config: BlackjackEnvConfig = config
        self.episodes: Dict[int, EpisodeState] = {}
        self.debug_mode = config.debug_mode
        self.completed_episode_metrics_buffer: List[Dict[str, float]] = []
        self.eval_metrics: List[Tuple[str, float]] = []
        if self.debug_mode:
            logger.setLevel(logging.DEBUG)
        self.environment_role, self.agent_role = self._roles_the_template_renders()
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
            "You are playing Blackjack against the dealer, and you think carefully before every move: weigh "
            "the odds of each card you could draw, what the dealer's visible card suggests, and basic strategy. "
            "Each turn you are told your hand total, the dealer's visible card and whether you hold an ace that "
            "can still count as 11.\n\n"
            "First reason inside <think> </think> tags, as long as you need. Then make your move with the "
            "take_action tool: 'hit' to draw another card, 'stick' to end your turn.\n\n"
            f"You can call this tool:\n<tools>\n{json.dumps(self.tools)}\n</tools>\n\n"
            "Write the call as a JSON object with the tool's name and arguments between <tool_call> and "
            "</tool_call>. A complete reply looks like this:\n"
            "<think>\n[your reasoning about hitting or sticking]\n</think>\n\n"
            '<tool_call>\n{"name": "take_action", "arguments": {"action": "stick"}}\n</tool_call>'
        )

    def _roles_the_template_renders(self) -> Tuple[str, str]:
        """("environment", "agent") as in Atropos, unless the chat template drops or rejects
        those roles; then ("user", "assistant")."""
        probe = [{"role": "environment", "content": "observation-probe-7"},
                 {"role": "agent", "content": "reply-probe-7"}]
        try:
            text = self.tokenizer.apply_chat_template(probe, tokenize=False)
            if "observation-probe-7" in text and "reply-probe-7" in text:
                return "environment", "agent"
        except Exception:
            pass
        logger.warning("the chat template does not render 'environment'/'agent' turns; using user/assistant")
        return "user", "assistant"

    # -- the game ------------------------------------------------------------------------------
    def _get_or_create_episode(self, seed: int) -> EpisodeState:
        if seed not in self.episodes:
            env = gymnasium.make(self.config.env_name)
            obs, _ = env.reset(seed=seed)
            episode = EpisodeState(seed, env)
            episode.message_history = [
                {"role": "system", "content": self.system_prompt},
                {"role": self.environment_role, "content": self._format_observation(obs)},
            ]
            self.episodes[seed] = episode
        return self.episodes[seed]

    def _format_observation(self, obs: Tuple[int, int, int]) -> str:
        player_sum, dealer_card, usable_ace = obs
        return (f"Your hand totals {int(player_sum)}. The dealer shows {int(dealer_card)} (1 is an ace). "
                f"Usable ace in your hand: {'yes' if usable_ace else 'no'}.")

    def _replay(self, seed: int, actions: List[int]) -> Tuple[gymnasium.Env, Optional[tuple], float, bool]:
        """A fresh game from `seed` with `actions` played: (env, last observation, last reward,
        finished). The caller closes the env."""
        env = gymnasium.make(self.config.env_name)
        obs, _ = env.reset(seed=seed)
        reward, finished = 0.0, False
        for action in actions:
            obs, reward, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                finished = True
                break
        return env, obs, float(reward), finished

    async def _estimate_value(self, episode_seed_for_sim: int, env_actions_to_replay: List[int]) -> float:
        """V(s): the best outcome reachable from the state `env_actions_to_replay` leads to
        in the game seeded `episode_seed_for_sim` (0 when that state is already finished).
        The game's random generator is part of the state, so this is exact for this deal."""

        def best(env: gymnasium.Env) -> float:
            stick = copy.deepcopy(env)
            _, stick_reward, _, _, _ = stick.step(ACTION_STICK)  # sticking always ends the game
            hit = copy.deepcopy(env)
            _, hit_reward, terminated, truncated, _ = hit.step(ACTION_HIT)
            hit_value = float(hit_reward) if (terminated or truncated) else float(hit_reward) + best(hit)
            return max(float(stick_reward), hit_value)

        env = None
        try:
            env, _, _, finished = self._replay(episode_seed_for_sim, env_actions_to_replay)
            return 0.0 if finished else best(env)
        except Exception as exc:
            logger.error("value of seed %s after %s failed: %s", episode_seed_for_sim, env_actions_to_replay, exc)
            return 0.0
        finally:
            if env is not None:
                env.close()

    # -- scoring -------------------------------------------------------------------------------
    def _score_response(self, env_reward: float, response_text: str, parsed_action: int) -> float:
        """Game reward, the format terms and the length tie-break of one reply."""
        score = float(env_reward)
        score += -0.2 if parsed_action == INVALID_ACTION else 0.2
        thought = thinking_content(response_text)
        if not thought:
            score -= 0.2
        elif thought.strip():
            score += 0.2
        # (a block of whitespace only earns nothing)
        num_tokens = len(self.tokenizer.encode(response_text)) if response_text else 0
        if self.config.max_token_length > 0:
            overrun = length_overrun(num_tokens, self.config.max_token_length, 0.0)
            score += self.config.tiebreak_token_factor * (1.0 - overrun)
        return score

    def _parse_tool_call(self, response: str) -> int:
        """1 (hit), 0 (stick) or -1 (no valid take_action call)."""
        if not response:
            return INVALID_ACTION
        name, arguments, is_error = parse_tool_call(response, self.tools, ["tool_call"])
        if is_error:
            logger.debug("no valid tool call in %r", response[-300:])
            return INVALID_ACTION
        action = str(arguments.get("action", "")).strip().lower()
        return {"hit": ACTION_HIT, "stick": ACTION_STICK}.get(action, INVALID_ACTION)

    def _open_turn(self, history: List[Dict], opening: str) -> str:
        """The chat template's text of `history` followed by an agent turn that starts with
        `opening` and is left open for the model to continue."""
        chat = history + [{"role": self.agent_role, "content": opening + REPLY_MARK}]
        text = self.tokenizer.apply_chat_template(chat, tokenize=False)
        cut = text.rfind(REPLY_MARK)
        if cut == -1:  # a template that rewrites the content: fall back to a generation prompt
            return self.tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True) + opening
        return text[:cut]

    def _tokenize_alternative(self, chat: List[Dict]) -> Dict[str, List[int]]:
        """Tokens of `chat` with only its last message (the alternative's reply) trained on."""
        tokenized = tokenize_for_trainer(self.tokenizer, chat)
        tokens = tokenized["tokens"]
        try:  # the reply starts where the template's text of the open turn ends
            prefix = list(self.tokenizer(self._open_turn(chat[:-1], ""), add_special_tokens=False)["input_ids"])
            if prefix and tokens[: len(prefix)] == prefix:
                return {"tokens": tokens, "masks": [-100] * len(prefix) + tokens[len(prefix):]}
        except Exception as exc:
            logger.debug("falling back to tokenize_for_trainer's masks: %s", exc)
        return {"tokens": tokens, "masks": tokenized["masks"]}

    async def _sample_response(self, messages: List[Dict], n: int = 1) -> List[str]:
        """`n` continuations of the agent turn that ends `messages` (its content is the
        start the model continues from)."""
        prompt = self._open_turn(messages[:-1], messages[-1]["content"])
        prompt_tokens = len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        try:
            completions = await self.server.completion(
                prompt=prompt,
                n=n,
                max_tokens=max(1, self.config.max_token_length - prompt_tokens),
                temperature=self.config.temperature,
                top_p=self.config.top_p,
            )
            return [choice.text or "" for choice in completions.choices]
        except Exception as exc:
            logger.error("completion request failed: %s", exc)
            return []

    # -- one turn ------------------------------------------------------------------------------
    async def _next_step(self, ep: EpisodeState, current_turn: int,
                         max_turns: int) -> Tuple[Optional[BlackjackScoredDataGroup], bool]:
        """Sample G alternatives at the current state, score them, play the best one.
        Returns (the step's group or None on failure, whether the episode is over)."""
        G = self.config.group_size
        history = list(ep.message_history)
        value_t = await self._estimate_value(ep.seed, ep.actions)
        opening = "<think>\n" if self.config.thinking_active else ""
        responses = await self._sample_response(history + [{"role": self.agent_role, "content": opening}], n=G)
        if len(responses) != G:
            logger.error("[seed %s turn %d] expected %d replies, got %d", ep.seed, current_turn + 1, G, len(responses))
            return None, True

        full_responses = [opening + text for text in responses]
        parsed_actions = [self._parse_tool_call(text) for text in full_responses]
        env_actions = [ACTION_STICK if a == INVALID_ACTION else a for a in parsed_actions]
        scores: List[float] = []
        alternatives: List[List[Dict]] = []
        tokens: List[List[int]] = []
        masks: List[List[int]] = []
        for full_response, parsed, action in zip(full_responses, parsed_actions, env_actions):
            env, _, reward, finished = self._replay(ep.seed, ep.actions + [action])
            env.close()
            value_next = 0.0 if finished else await self._estimate_value(ep.seed, ep.actions + [action])
            scores.append(self._score_response(reward, full_response, parsed) + value_next - value_t)
            chat = history + [{"role": self.agent_role, "content": full_response}]
            tokenized = self._tokenize_alternative(chat)
            alternatives.append(chat)
            tokens.append(tokenized["tokens"])
            masks.append(tokenized["masks"])

        group = BlackjackScoredDataGroup(
            tokens=tokens, masks=masks, scores=scores, messages=alternatives, seed=ep.seed,
            parsed_actions=parsed_actions,
        )
        best = select_best_index(primary_scores=scores, secondary_scores=[len(t) for t in tokens],
                                 primary_higher_is_better=True, secondary_lower_is_better=True)
        logger.debug("[seed %s turn %d] scores %s -> alternative %d", ep.seed, current_turn + 1,
                     [round(s, 3) for s in scores], best)

        ep.num_total_actions += 1
        if parsed_actions[best] != INVALID_ACTION:
            ep.num_correct_actions += 1
        ep.message_history.append({
            "role": self.agent_role,
            "content": truncate_thinking(full_responses[best], self.tokenizer, self.config.max_think_chars_history),
        })
        try:
            obs, reward, terminated, truncated, _ = ep.env.step(env_actions[best])
        except Exception as exc:
            logger.error("[seed %s turn %d] the real game failed: %s", ep.seed, current_turn + 1, exc)
            return group, True
        ep.actions.append(env_actions[best])
        ep.step_rewards.append(float(reward))
        ep.total_reward += float(reward)
        ep.num_steps += 1
        finished = bool(terminated or truncated)
        if not finished:
            ep.message_history.append({"role": self.environment_role, "content": self._format_observation(obs)})
        return group, finished

    async def score(self, rollout_group_data: List[BlackjackScoredDataGroup]) -> List[BlackjackScoredDataGroup]:
        """Steps are scored while they are collected; nothing to add."""
        return rollout_group_data

    # -- episodes ------------------------------------------------------------------------------
    async def collect_trajectories(self, item: Tuple[int, int]) -> Tuple[List[BlackjackScoredDataGroup], List]:
        """Play one whole episode of seed ``item[0]``: a list with one group per turn."""
        seed, _ = item
        max_turns = self.config.max_turns or 5
        steps: List[BlackjackScoredDataGroup] = []
        try:
            ep = self._get_or_create_episode(seed)
        except Exception as exc:
            logger.error("cannot start the episode of seed %s: %s", seed, exc)
            return [], []
        try:
            for turn in range(max_turns):
                group, finished = await self._next_step(ep, turn, max_turns)
                if group is not None:
                    steps.append(group)
                if group is None or finished:
                    break
            final_reward = sum(ep.step_rewards)
            self.completed_episode_metrics_buffer.append({
                "seed": ep.seed,
                "total_reward": final_reward,
                "num_steps": ep.num_steps,
                "num_correct_actions": ep.num_correct_actions,
                "num_total_actions": ep.num_total_actions,
                "game_outcome": (final_reward > 0) - (final_reward < 0),
            })
        finally:
            episode = self.episodes.pop(seed, None)
            if episode is not None:
                episode.env.close()
        if not steps:
            return [], []
        return ensure_trajectory_token_limit(steps, self.tokenizer, self.config.max_trajectory_tokens), []

    async def setup(self):
        pass

    async def get_next_item(self) -> Tuple[int, int]:
        return (random.randint(0, 1000000), 0)

    async def rollout_and_score_eval(self, seed: int) -> Dict[str, float]:
        """One evaluation episode, a single reply per turn."""
        ep = self._get_or_create_episode(seed)
        metrics = {"seed": seed, "total_reward": 0.0, "num_turns": 0, "num_correct_actions": 0,
                   "num_invalid_actions": 0, "game_outcome": 0}
        opening = "<think>\n" if self.config.thinking_active else ""
        try:
            for turn in range(self.config.max_turns or 5):
                responses = await self._sample_response(
                    ep.message_history + [{"role": self.agent_role, "content": opening}], n=1)
                if not responses:
                    break
                reply = opening + responses[0]
                action = self._parse_tool_call(reply)
                if action == INVALID_ACTION:
                    metrics["num_invalid_actions"] += 1
                    action = ACTION_STICK
                else:
                    metrics["num_correct_actions"] += 1
                obs, reward, terminated, truncated, _ = ep.env.step(action)
                metrics["total_reward"] += float(reward)
                metrics["num_turns"] = turn + 1
                ep.message_history.append({"role": self.agent_role, "content": truncate_thinking(
                    reply, self.tokenizer, self.config.max_think_chars_history)})
                if terminated or truncated:
                    metrics["game_outcome"] = int(reward)
                    break
                ep.message_history.append({"role": self.environment_role, "content": self._format_observation(obs)})
        finally:
            self.episodes.pop(seed, None)
            ep.env.close()
        return metrics

    async def evaluate(self, *args, **kwargs):
        episodes = [self.rollout_and_score_eval(random.randint(1000001, 2000000))
                    for _ in range(self.config.eval_episodes)]
        results = [m for m in await tqdm_asyncio.gather(*episodes) if m]
        if not results:
            logger.warning("no evaluation episode finished")
            return
        count = len(results)
        correct = sum(m["num_correct_actions"] for m in results)
        invalid = sum(m["num_invalid_actions"] for m in results)
        self.eval_metrics = [
            ("eval/avg_total_reward", sum(m["total_reward"] for m in results) / count),
            ("eval/avg_num_turns", sum(m["num_turns"] for m in results) / count),
            ("eval/action_accuracy", correct / (correct + invalid) if correct + invalid else 0.0),
            ("eval/win_rate", sum(m["game_outcome"] == 1 for m in results) / count),
            ("eval/loss_rate", sum(m["game_outcome"] == -1 for m in results) / count),
            ("eval/draw_rate", sum(m["game_outcome"] == 0 for m in results) / count),
            ("eval/num_completed_episodes", count),
        ]
        logger.info("evaluation: %s", self.eval_metrics)
        if self.config.data_dir_to_save_evals:
            self.evaluate_log(dict(self.eval_metrics))

    async def wandb_log(self, wandb_metrics: Optional[Dict[str, float]] = None):
        wandb_metrics = dict(wandb_metrics or {})
        episodes = self.completed_episode_metrics_buffer
        if episodes:
            prefix = self.wandb_prepend or "blackjack"
            count = len(episodes)
            wandb_metrics[f"{prefix}_train/avg_episode_reward"] = sum(m["total_reward"] for m in episodes) / count
            wandb_metrics[f"{prefix}_train/avg_episode_steps"] = sum(m["num_steps"] for m in episodes) / count
            wandb_metrics[f"{prefix}_train/episode_win_rate"] = sum(m["game_outcome"] == 1 for m in episodes) / count
            wandb_metrics[f"{prefix}_train/num_episodes"] = len(episodes)
            self.completed_episode_metrics_buffer = []
        for key, value in self.eval_metrics:
            wandb_metrics[key] = value
        self.eval_metrics = []
        await super().wandb_log(wandb_metrics)

    @classmethod
    def config_init(cls) -> Tuple[BlackjackEnvConfig, List[APIServerConfig]]:
        env_config = BlackjackEnvConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
            group_size=16,
            use_wandb=True,
            max_num_workers=128,
            rollout_server_url="http://localhost:8000",
            total_steps=2000,
            batch_size=1024,
            steps_per_eval=20,
            max_token_length=1024 * 16,
            inference_weight=1.0,
            wandb_name="blackjack",
            data_path_to_save_groups=None,
            eval_handling=EvalHandlingEnum.LIMIT_TRAIN,
            eval_limit_ratio=0.1,
            env_name="Blackjack-v1",
            temperature=0.7,
            top_p=0.9,
            max_turns=5,
            thinking_active=True,
            eval_episodes=100,
            max_think_chars_history=3000,
            max_trajectory_tokens=24576,
            debug_mode=False,
            tiebreak_token_factor=0.01,
        )
        server_configs = [
            APIServerConfig(
                model_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
                base_url="http://localhost:9004/v1",
                api_key="x",
                num_requests_for_eval=256,
            )
        ]
        return env_config, server_configs


if __name__ == "__main__":
    BlackjackEnv.cli()
