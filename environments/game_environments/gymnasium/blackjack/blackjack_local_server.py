"""Play one Blackjack episode against an inference server and print it: a quick local check.

No trajectory API or trainer is involved. The thinking variant (`BlackjackEnv`, the
default) prints every turn's alternatives with their scores and the one played; the
``--variant no_thinking`` one (`BlackjackEnvNoThinking`) prints the conversation and the
outcome.

    python environments/game_environments/gymnasium/blackjack/blackjack_local_server.py \\
        --base-url http://localhost:9004/v1 --model MODEL [--tokenizer TOKENIZER] [--seed 7] [--group-size 4]

The server must speak the OpenAI API (``/v1/completions`` for the thinking variant,
``/v1/chat/completions`` for the other); the API key is ``--api-key``, else
``$OPENAI_API_KEY``, else ``x``. Atropos's script was fixed on OpenAI's ``gpt-4.1-mini``,
which has no text-completion endpoint; this one takes any server.
"""

import argparse
import asyncio
import logging
import os
import random
import sys

from atroposlib.envs.base import APIServerConfig, EvalHandlingEnum
from atroposlib.utils.best_of_n_selection import select_best_index

try:
    from environments.game_environments.gymnasium.blackjack.blackjack_env_no_thinking import (
        BlackjackEnvNoThinking, BlackjackEnvNoThinkingConfig)
    from environments.game_environments.gymnasium.blackjack.blackjack_env_thinking import (
        BlackjackEnv, BlackjackEnvConfig)
except ImportError:  # run as a script: the environments sit beside this file
    from blackjack_env_no_thinking import BlackjackEnvNoThinking, BlackjackEnvNoThinkingConfig
    from blackjack_env_thinking import BlackjackEnv, BlackjackEnvConfig

DEFAULT_MODEL = "NousResearch/DeepHermes-3-Llama-3-8B-Preview"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Play one Blackjack episode against an inference server.")
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://localhost:9004/v1"))
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--tokenizer", default=None, help="tokenizer name or folder (default: the model)")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "x"))
    parser.add_argument("--server-type", default="openai")
    parser.add_argument("--variant", choices=("thinking", "no_thinking"), default="thinking")
    parser.add_argument("--seed", type=int, default=None, help="the deal (default: random)")
    parser.add_argument("--group-size", type=int, default=4, help="alternatives per turn (thinking variant)")
    parser.add_argument("--max-token-length", type=int, default=4096)
    parser.add_argument("--temperature", type=float, default=0.2)
    parser.add_argument("--debug", action="store_true")
    return parser.parse_args(argv)


async def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING)
    seed = args.seed if args.seed is not None else random.randint(0, 1_000_000)
    server = APIServerConfig(model_name=args.model, base_url=args.base_url, api_key=args.api_key,
                             server_type=args.server_type, tokenizer_name=args.tokenizer or args.model,
                             num_requests_for_eval=0)
    common = dict(tokenizer_name=args.tokenizer or args.model, use_wandb=False,
                  rollout_server_url="http://localhost:8000",
                  total_steps=1, batch_size=1, steps_per_eval=0, max_token_length=args.max_token_length,
                  data_path_to_save_groups=None, eval_handling=EvalHandlingEnum.NONE, eval_limit_ratio=0.0,
                  max_num_workers=1, eval_episodes=0)
    print(f"seed {seed}, {args.variant} variant, model {args.model} at {args.base_url}")
    if args.variant == "no_thinking":
        env = BlackjackEnvNoThinking(BlackjackEnvNoThinkingConfig(group_size=1, wandb_name="blackjack_local", **common),
                                     [server], slurm=False)
        await env.setup()
        item, _ = await env.collect_trajectory({"seed": seed})
        await env.server.close()
        if item is None:
            print("the episode could not be played (see the log)")
            return 1
        for message in item["messages"] or []:
            print(f"[{message['role']}] {message['content']}")
        print(f"outcome: {item['scores']:+.0f}")
        return 0

    env = BlackjackEnv(BlackjackEnvConfig(group_size=args.group_size, wandb_name="blackjack_local_debug",
                                          temperature=args.temperature, debug_mode=args.debug, **common),
                       [server], slurm=False)
    await env.setup()
    steps, _ = await env.collect_trajectories((seed, 0))
    await env.server.close()
    for turn, step in enumerate(steps, 1):
        observation = step["messages"][0][-2]["content"]
        print(f"--- turn {turn}: {observation}")
        best = select_best_index(step["scores"], [len(tokens) for tokens in step["tokens"]])
        for i, (score, action) in enumerate(zip(step["scores"], step["parsed_actions"])):
            name = {1: "hit", 0: "stick"}.get(action, "invalid (stick)")
            print(f"  alternative {i}: {name:<16} score {score:+.3f}{'  <- played' if i == best else ''}")
    summary = env.completed_episode_metrics_buffer[-1] if env.completed_episode_metrics_buffer else None
    if summary is None:
        print("the episode could not be played (see the log)")
        return 1
    outcome = {1: "win", -1: "loss", 0: "draw"}[summary["game_outcome"]]
    print(f"outcome: {outcome} (reward {summary['total_reward']:+.0f}) after {summary['num_steps']} turns; "
          f"valid tool calls {summary['num_correct_actions']}/{summary['num_total_actions']}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
