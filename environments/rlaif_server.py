"""RLAIF: steer a model toward a written preference, with the model itself as a pairwise judge.

Each item is a real chat from WildChat, cut before its last assistant reply. The policy
writes two replies (one `managed_server()` chat call with ``n=2``, so both carry their exact
tokens, masks and logprobs); on about one item in twenty the preference is also put in a
system prompt for one of the two replies (sampled separately; its tokens and logprobs are
those it was sampled with, its recorded messages and the judge leave that system prompt
out). The same server then judges the pair six times: three verdicts with the replies as
A/B and three with them swapped, each answered as ``\\boxed{A}`` or ``\\boxed{B}``. A reply's
score is its share of the six votes minus the mean share of the two (so the two scores are
opposite: +x / -x); a tie gives equal scores, a group that ``ensure_scores_are_not_same``
drops (serve's default; process mode keeps it unless told). When a reply was cut
at the token limit (``finish_reason == "length"``) the judge is skipped: truncated replies
score -1 and the other +1; when both are truncated the item yields no group. Prompts longer
than 1.5 x ``max_token_length`` tokens are skipped. There is no evaluation.

Data: the Hugging Face ``allenai/WildChat`` train split (its ``conversation`` column), in
order. ``--env.train_file`` reads a local JSONL/JSON/CSV/Parquet file with the same
``conversation`` column instead (a tiny one ships in ``environments/fixtures/rlaif/``).

Needs token ids from the inference server: pass ``--openai.server_type vllm`` (or sglang).

    # offline, with the bundled conversations
    python environments/rlaif_server.py process --openai.server_type vllm \\
        --env.train_file environments/fixtures/rlaif/train.jsonl --env.total_steps 4 \\
        --env.data_path_to_save_groups rlaif.jsonl --openai.base_url http://localhost:9004/v1 \\
        --openai.model_name MODEL --env.tokenizer_name MODEL --env.use_wandb false
    # for real
    python environments/rlaif_server.py serve --openai.server_type vllm \\
        --openai.base_url http://localhost:9004/v1 --openai.model_name MODEL
"""

import asyncio
import random
import re
from typing import Dict, List, Optional, Tuple

from pydantic import Field

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, EvalHandlingEnum, ScoredDataGroup
from atroposlib.envs.local_data import load_rows

# The behaviour the judge rewards. Change it (or set this module attribute) to steer elsewhere.
rl_preference_string = (
    "Lean all the way into an eldritch, cosmic-horror voice: vast, ominous, uncanny, a little unhinged. "
    "Keep it playful rather than gross, and still reply to what was said. What matters is the mood of the "
    "reply, not how closely it follows the user's request."
)

judge_system_prompt = (
    "You are a careful evaluator who thinks before deciding. Reason privately inside <think> </think> tags "
    "for as long as you need, then give your verdict.\n\n"
    "Keep your reasoning well under 8192 tokens.\n\n"
    "Your verdict names the better response as \\boxed{A} or \\boxed{B}, and it must be the last thing you "
    "write. A verdict in any other form is not counted."
)

# Placeholders: conversation, response_a, response_b, rl_preference_string.
RLAIF_user_prompt_format_str = """Conversation so far:
{conversation}

--- Response A ---
{response_a}

--- Response B ---
{response_b}

--- End of responses ---

Two candidate replies to the conversation above are shown. They are being used to train a model toward \
this goal:
{rl_preference_string}

Neither reply may fit the goal well. Pick the one that, if it were rewarded, would move the model further \
toward the goal, even if only slightly. Think it over, then finish with \\boxed{{A}} or \\boxed{{B}}."""

# How often the preference is also given to the policy as a system prompt (for one of the two replies).
PREFERENCE_SYSTEM_PROMPT_PROBABILITY = 0.05
preference_system_prompt = "Whatever came before, answer in this manner:\n"

VOTES_PER_ORDER = 3
VERDICT = re.compile(r"\\boxed\{\s*([^{}]*?)\s*\}")


def judge_choice(text: Optional[str]) -> Optional[str]:
    """"A" or "B" when the judge's last ``\\boxed{}`` holds exactly that letter, else None."""
    found = VERDICT.findall(text or "")
    return found[-1] if found and found[-1] in ("A", "B") else None


def pairwise_scores(forward_verdicts: List[Optional[str]],
                    reversed_verdicts: List[Optional[str]]) -> Tuple[float, float]:
    """Scores of the first and second reply from verdicts with the first as A (forward)
    and with the first as B (reversed): vote shares out of all six, minus their mean."""
    votes = [0.0, 0.0]
    for choice in forward_verdicts:
        if choice in ("A", "B"):
            votes[0 if choice == "A" else 1] += 1.0
    for choice in reversed_verdicts:
        if choice in ("A", "B"):
            votes[1 if choice == "A" else 0] += 1.0
    total = 2 * VOTES_PER_ORDER
    first, second = votes[0] / total, votes[1] / total
    mean = (first + second) / 2.0
    return first - mean, second - mean


class RLAIFConfig(BaseEnvConfig):
    train_file: Optional[str] = Field(
        default=None,
        description="Local file with WildChat's 'conversation' column, used instead of the hub's train split.",
    )


class RLAIFEnv(BaseEnv):
    env_config_cls = RLAIFConfig
    cannot_rescore = "its score is a judge model's preference between two rollouts (inference)"

    def __init__(self, config: RLAIFConfig, server_configs: List[APIServerConfig], slurm=True, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        self.percent_correct_buffer = []
        self.eval_metrics = []
        self.judgement_strings = []
        self.iter = 0

    @classmethod
    def config_init(cls) -> Tuple[RLAIFConfig, List[APIServerConfig]]:
        env_config = RLAIFConfig(
            tokenizer_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
            group_size=2,
            use_wandb=True,
            max_num_workers=512 * 3 * 4,
            rollout_server_url="http://localhost:8000",
            total_steps=1000,
            batch_size=1024,
            steps_per_eval=10000,
            max_token_length=8192,
            wandb_name="rlaif",
            eval_handling=EvalHandlingEnum.LIMIT_TRAIN,
            eval_limit_ratio=0.1,
        )
        server_configs = [
            APIServerConfig(
                model_name="NousResearch/DeepHermes-3-Llama-3-8B-Preview",
                base_url="http://localhost:9004/v1",
                api_key="x",
                num_requests_for_eval=256,
            ),
        ]
        return env_config, server_configs

    async def setup(self):
        self.train = load_rows("allenai/WildChat", split="train", local_file=self.config.train_file)
        if not self.train:
            raise ValueError("the RLAIF dataset has no rows")
        self.iter = 0

    def save_checkpoint(self, step, data=None):
        data = {} if data is None else data
        data["iter"] = self.iter
        super().save_checkpoint(step, data)

    async def get_next_item(self):
        row = self.train[self.iter % len(self.train)]
        self.iter += 1
        conversation = tuple(
            frozenset({"role": message["role"], "content": message["content"]}.items())
            for message in row["conversation"]
        )
        return (conversation,)

    async def rollout_and_score_eval(self, *args, **kwargs):
        return None

    async def evaluate(self, *args, **kwargs):
        return None

    def _prompt_too_long(self, chat: List[Dict[str, str]]) -> bool:
        text = self.tokenizer.apply_chat_template(chat, tokenize=False)
        limit = self.config.max_token_length * 2 - self.config.max_token_length // 2
        return len(self.tokenizer.encode(text, add_special_tokens=False)) >= limit

    async def _sample(self, chat: List[Dict[str, str]], n: int) -> List[dict]:
        """`n` replies to `chat`, each with its finish reason and tracked tokens."""
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=chat, n=n, max_tokens=self.config.max_token_length // 3
            )
            nodes = managed.get_state()["nodes"]
        return [
            {"content": choice.message.content or "", "finish_reason": choice.finish_reason,
             "tokens": node.tokens, "masks": node.masked_tokens, "logprobs": node.logprobs}
            for choice, node in zip(completion.choices, nodes)
        ]

    async def collect_trajectories(self, item) -> Tuple[Optional[ScoredDataGroup], List]:
        conversation = [dict(message) for message in item[0]]
        # The prompt is the conversation before its final assistant reply.
        prompt = conversation[:-1]
        if prompt and prompt[-1]["role"] == "assistant":
            prompt = prompt[:-1]
        if not prompt:
            return None, []
        add_preference = random.random() < PREFERENCE_SYSTEM_PROMPT_PROBABILITY
        if add_preference:
            chat = [{"role": "system", "content": preference_system_prompt + rl_preference_string}]
            chat += [message for message in prompt if message["role"] != "system"]
        else:
            chat = prompt
        if self._prompt_too_long(chat):
            return None, []
        if add_preference:
            with_preference, without = await asyncio.gather(self._sample(chat, 1), self._sample(chat[1:], 1))
            replies = with_preference + without
        else:
            replies = await self._sample(chat, 2)
        rollouts = [dict(reply, messages=prompt + [{"role": "assistant", "content": reply["content"]}])
                    for reply in replies]
        return await self.score(rollouts), []

    async def _judge(self, conversation: List[Dict[str, str]], response_a: str, response_b: str) -> List[Optional[str]]:
        user_prompt = RLAIF_user_prompt_format_str.format(
            conversation="\n".join(f"{message['role']}: {message['content']}" for message in conversation),
            response_a=response_a, response_b=response_b, rl_preference_string=rl_preference_string,
        )
        completion = await self.server.chat_completion(
            messages=[{"role": "system", "content": judge_system_prompt}, {"role": "user", "content": user_prompt}],
            n=VOTES_PER_ORDER, max_tokens=self.config.max_token_length,
        )
        return [choice.message.content or "" for choice in completion.choices]

    async def score(self, rollout_group_data: List[dict]) -> Optional[ScoredDataGroup]:
        truncated = [rollout["finish_reason"] == "length" for rollout in rollout_group_data]
        if all(truncated):
            return None
        if any(truncated):
            # A reply that ran out of tokens loses, whatever it says.
            scores = [-1.0 if cut else 1.0 for cut in truncated]
        else:
            first, second = rollout_group_data[0], rollout_group_data[1]
            conversation = first["messages"][:-1]
            forward, reverse = await asyncio.gather(
                self._judge(conversation, first["content"], second["content"]),
                self._judge(conversation, second["content"], first["content"]),
            )
            self.judgement_strings.append((first["content"], second["content"], forward[0] if forward else ""))
            scores = list(pairwise_scores([judge_choice(text) for text in forward],
                                          [judge_choice(text) for text in reverse]))
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], inference_logprobs=[], messages=[])
        for rollout, score in zip(rollout_group_data, scores):
            group["tokens"].append(rollout["tokens"])
            group["masks"].append(rollout["masks"])
            group["inference_logprobs"].append(rollout["logprobs"])
            group["messages"].append(rollout["messages"])
            group["scores"].append(score)
        return group

    async def wandb_log(self, wandb_metrics: Optional[Dict] = None):
        wandb_metrics = dict(wandb_metrics or {})
        if self.judgement_strings and self.wandb.active:
            wandb_metrics["train/judgement_table"] = self.wandb.table(
                ["resp_a", "resp_b", "sample_judgement"], [list(row) for row in self.judgement_strings]
            )
        self.judgement_strings.clear()
        await super().wandb_log(wandb_metrics)


if __name__ == "__main__":
    RLAIFEnv.cli()
