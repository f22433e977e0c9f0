"""The contract ``env.py check`` holds an environment's groups to, one rule per function.

Each rule reads the groups the checker collected (`Collected`: a group as serve would send
it, i.e. stamped and completed, with the prompts the inference server was sent and the
sampling record of its item) and returns a `Check`: passed or not, what it saw, and on a
failure what to change. The rules:

* group size: ``group_size`` rollouts (or the group's ``group_overrides["group_size"]``), one
  mask list and one score per rollout;
* tokens, masks and logprobs aligned: the API's own checks (`atroposlib.api.group_checks`:
  a label per token, each -100 or its token, one logprob per token);
* prompt masked, completion trained: where a rollout starts with a prompt the server was
  sent (the shortest such, the first turn's), every prompt position is -100 and the token
  after it is trained; every rollout trains at least one token;
* logprobs of trained tokens: once the masks are right, each trained position's inference
  logprob is a log-probability (at most 0; 1.0 is the prompt's placeholder, so logprobs
  shifted by one show here);
* scores finite and, when the class declares ``score_range``, inside it;
* scores vary: groups whose scores all agree carry no learning signal and serve drops them;
  they are counted, and it fails when no group varies (group size 1 excepted);
* messages: one conversation per rollout, each message with role and content, that the
  tokenizer's chat template renders;
* sampling stamp: each rollout says the sampling parameters and policy version it was
  sampled with, and a `managed_server()` rollout's tokens are those the server sampled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from pydantic import BaseModel, ValidationError

from atroposlib.api.group_checks import MASKED, quality_problems, structural_problems
from atroposlib.envs.server_handling.sampling_record import SamplingRecord
from atroposlib.utils.tokenize_for_trainer import apply_template
from atroposlib.wire import PER_SEQUENCE_AUX_KEYS, ScoredData


class Check(BaseModel):
    """One line of the report: `name`, whether it `passed`, what was seen (`detail`) and, for a
    failure, what to change (`fix`)."""

    name: str
    passed: bool
    detail: str = ""
    fix: str = ""

    def line(self) -> str:
        if self.passed:
            return f"PASS  {self.name}" + (f" ({self.detail})" if self.detail else "")
        return f"FAIL  {self.name}: {self.detail}" + (f" — {self.fix}" if self.fix else "")


@dataclass
class Collected:
    """One group as it would be sent, with what its item's collection asked of the server."""

    group: dict[str, Any]
    prompts: list[list[int]] = field(default_factory=list)
    record: SamplingRecord = field(default_factory=SamplingRecord)


def _where(index: int, rollout: Optional[int] = None) -> str:
    return f"group {index + 1}" + (f", rollout {rollout + 1}" if rollout is not None else "")


def group_size(collected: Sequence[Collected], configured: int) -> Check:
    name = "group size"
    for index, entry in enumerate(collected):
        group = entry.group
        expected = (group.get("group_overrides") or {}).get("group_size", configured)
        tokens = group.get("tokens") or []
        if len(tokens) != expected:
            return Check(name=name, passed=False, detail=f"{_where(index)} holds {len(tokens)} rollouts, group_size is "
                         f"{expected}", fix="return exactly group_size rollouts (serve drops other groups), or say "
                         "the size in group_overrides['group_size']")
        for key in ("masks", "scores"):
            if len(group.get(key) or []) != len(tokens):
                return Check(name=name, passed=False, detail=f"{_where(index)} has {len(group.get(key) or [])} "
                             f"{key} for {len(tokens)} rollouts", fix=f"append one {key[:-1]} per rollout")
    return Check(name=name, passed=True, detail=f"{configured} rollouts in each of {len(collected)} groups")


def _trained_logprob_problem(group: dict[str, Any]) -> Optional[str]:
    """Where a trained position's inference logprob is not a log-probability."""
    for rollout, (mask, logprobs) in enumerate(zip(group.get("masks") or [], group.get("inference_logprobs") or [])):
        for position, (label, value) in enumerate(zip(mask, logprobs)):
            if label != MASKED and not (math.isfinite(value) and value <= 0):
                return f"rollout {rollout + 1}, position {position}: trained token with inference logprob {value}"
    return None


def _without_empty_extras(group: dict[str, Any]) -> dict[str, Any]:
    """`group` with empty per-rollout extras as absent: BaseEnv's default collect_trajectories
    leaves ``advantages=[]`` and the like when no rollout has them, which trainers read as none."""
    return {key: None if key in PER_SEQUENCE_AUX_KEYS and value == [] else value for key, value in group.items()}


def aligned(collected: Sequence[Collected]) -> Check:
    name = "tokens, masks and logprobs aligned"
    for index, entry in enumerate(collected):
        # scores are the scores rule's to judge (a NaN one would hide every other problem here)
        shape = {**_without_empty_extras(entry.group), "scores": [0.0] * len(entry.group.get("scores") or [])}
        try:
            parsed = ScoredData.model_validate(shape, strict=False)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"])
            return Check(name=name, passed=False, detail=f"{_where(index)} is not a group the API accepts: {where}: "
                         f"{error['msg']}", fix="build the group with ScoredDataGroup's keys and types")
        problems = [f"{where}: {message}" for where, message in structural_problems(parsed)]
        problems += [problem.text() for problem in quality_problems(parsed)]
        if problems:
            return Check(name=name, passed=False, detail=f"{_where(index)}: {problems[0]}",
                         fix="copy tokens, masks and logprobs from the same source (node.tokens, node.masked_tokens, "
                         "node.logprobs) without slicing one of them")
    return Check(name=name, passed=True, detail="one label and one logprob per token, each label -100 or its token")


def logprobs_sampled(collected: Sequence[Collected]) -> Check:
    """Run once the masks are known right: a trained position's logprob of 1.0 then means the
    logprobs, not the mask, are shifted."""
    name = "logprobs of trained tokens"
    for index, entry in enumerate(collected):
        shifted = _trained_logprob_problem(entry.group)
        if shifted:
            return Check(name=name, passed=False, detail=f"{_where(index)}, {shifted}",
                         fix="logprobs are shifted against the tokens: copy node.logprobs unchanged")
    with_logprobs = sum(1 for entry in collected if entry.group.get("inference_logprobs"))
    if not with_logprobs:
        return Check(name=name, passed=True, detail="no inference_logprobs: the trainer treats the rollouts as "
                     "on-policy")
    return Check(name=name, passed=True, detail=f"log-probabilities in {with_logprobs} of {len(collected)} groups")


def _prompt_of(tokens: list[int], prompts: Sequence[list[int]]) -> Optional[int]:
    """Length of the shortest prompt `tokens` start with (and go past), or None."""
    lengths = [len(p) for p in prompts if 0 < len(p) < len(tokens) and tokens[:len(p)] == p]
    return min(lengths) if lengths else None


def prompt_masked(collected: Sequence[Collected]) -> Check:
    name = "prompt masked, completion trained"
    located = total = 0
    for index, entry in enumerate(collected):
        for rollout, (tokens, mask) in enumerate(zip(entry.group["tokens"], entry.group["masks"])):
            total += 1
            where = _where(index, rollout)
            if all(label == MASKED for label in mask):
                return Check(name=name, passed=False, detail=f"{where} trains no token (every label is -100)",
                             fix="leave the completion's labels as its token ids")
            prompt = _prompt_of(tokens, entry.prompts)
            if prompt is None:
                continue
            located += 1
            trained = [p for p in range(prompt) if mask[p] != MASKED]
            if trained:
                return Check(name=name, passed=False, detail=f"{where} trains position {trained[0]} of the "
                             f"{prompt}-token prompt the server was sent", fix="set the label of every prompt token "
                             "to -100, a prefill's too (the model did not sample it), as node.masked_tokens does")
            if mask[prompt] == MASKED:
                return Check(name=name, passed=False, detail=f"{where} masks the first completion token "
                             f"(position {prompt})", fix="mask only the prompt's positions: the mask is off by one")
    if not located:
        return Check(name=name, passed=True, detail="every rollout trains a token; no rollout starts with a prompt the "
                     "server was sent, so prompt positions could not be located")
    return Check(name=name, passed=True, detail=f"prompt located in {located} of {total} rollouts")


def scores_in_range(collected: Sequence[Collected], declared: Optional[tuple[float, float]]) -> Check:
    name = "scores finite" + (f" and within [{declared[0]}, {declared[1]}]" if declared else "")
    scores = [(index, score) for index, entry in enumerate(collected) for score in entry.group.get("scores") or []]
    for index, score in scores:
        if not isinstance(score, (int, float)) or isinstance(score, bool) or not math.isfinite(score):
            return Check(name=name, passed=False, detail=f"{_where(index)} has score {score!r}",
                         fix="scores must be finite numbers (the API refuses NaN and infinity)")
        if declared and not declared[0] <= score <= declared[1]:
            return Check(name=name, passed=False, detail=f"{_where(index)} has score {score}, outside the declared "
                         f"score_range", fix="clip the reward, or declare the range it really has")
    values = [score for _, score in scores]
    observed = f"{min(values)} to {max(values)}" if values else "none"
    return Check(name=name, passed=True, detail=f"observed {observed}" + (
        "" if declared else "; declare score_range on the class to check bounds"))


def scores_vary(collected: Sequence[Collected], answers_vary: bool) -> Check:
    name = "scores vary within groups"
    sized = [entry.group.get("scores") or [] for entry in collected if len(entry.group.get("scores") or []) > 1]
    if not sized:
        return Check(name=name, passed=True, detail="groups of one rollout: nothing to compare")
    alike = sum(1 for scores in sized if len(set(scores)) <= 1)
    detail = f"{len(sized) - alike} of {len(sized)} groups vary" + (
        f"; {alike} all alike (no learning signal: serve drops them)" if alike else "")
    if alike < len(sized):
        return Check(name=name, passed=True, detail=detail)
    seen = sorted({score for scores in sized for score in scores})
    if answers_vary:
        return Check(name=name, passed=False, detail=f"every group scored all alike ({seen}) although the stand-in's "
                     "answers varied, the item's own answer among them where found",
                     fix="make the reward depend on the answer; if it does, the stand-in never wrote a right one: "
                     "check against a model with --openai.base_url")
    return Check(name=name, passed=False, detail=f"every group scored all alike ({seen})",
                 fix="serve would drop every group: make the task neither always solved nor never solved by this "
                 "model, or the reward finer-grained")


def messages_renderable(collected: Sequence[Collected], tokenizer: Any) -> Check:
    name = "messages present and renderable"
    for index, entry in enumerate(collected):
        messages = entry.group.get("messages")
        rollouts = len(entry.group["tokens"])
        if not messages:
            return Check(name=name, passed=False, detail=f"{_where(index)} has no messages",
                         fix="add messages (one conversation per rollout) or set include_messages true")
        if len(messages) != rollouts:
            return Check(name=name, passed=False, detail=f"{_where(index)} has {len(messages)} conversations for "
                         f"{rollouts} rollouts", fix="append one conversation per rollout")
        for rollout, conversation in enumerate(messages):
            problem = _conversation_problem(conversation, tokenizer)
            if problem:
                return Check(name=name, passed=False, detail=f"{_where(index, rollout)}: {problem}",
                             fix="each message a dict with role and content, as the chat template expects")
    return Check(name=name, passed=True, detail="one conversation per rollout, rendered by the chat template")


def _conversation_problem(conversation: Any, tokenizer: Any) -> Optional[str]:
    if not isinstance(conversation, list) or not conversation:
        return f"a conversation must be a non-empty list of messages, got {type(conversation).__name__}"
    for message in conversation:
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            return f"message {message!r:.80} lacks role or content"
    if getattr(tokenizer, "chat_template", None) is None:
        return None
    try:
        apply_template(tokenizer, conversation, add_generation_prompt=False)
    except Exception as exc:
        return f"the chat template cannot render it: {exc}"
    return None


def sampling_stamped(collected: Sequence[Collected]) -> Check:
    name = "sampling parameters and policy version stamped"
    managed = 0
    for index, entry in enumerate(collected):
        group, nodes = entry.group, entry.record.nodes()
        params = group.get("generation_params") or {}
        overrides = group.get("overrides") or []
        for rollout, tokens in enumerate(group["tokens"]):
            matches = nodes.get(tuple(tokens))
            if nodes and not matches:
                return Check(name=name, passed=False, detail=f"{_where(index, rollout)}: its tokens are not any that "
                             "managed_server() sampled", fix="copy node.tokens unchanged (the trainer matches "
                             "logprobs and sampling settings to them)")
            managed += bool(matches)
            expected = (matches[0] if matches else entry.record.overall())
            stamped = {**params, **(overrides[rollout] if rollout < len(overrides) and overrides[rollout] else {})}
            for key, value in (expected.keys() if expected else {}).items():
                if stamped.get(key) != value:
                    return Check(name=name, passed=False, detail=f"{_where(index, rollout)} says {key}="
                                 f"{stamped.get(key)!r}, sampled with {value!r}", fix=f"leave {key} out of "
                                 "generation_params and overrides: it is stamped from the requests")
    if not any(entry.record.completions for entry in collected):
        return Check(name=name, passed=True, detail="no rollout was sampled, so none needs a stamp")
    how = f"{managed} managed_server() rollouts matched their nodes; " if managed else ""
    return Check(name=name, passed=True, detail=f"{how}each rollout stamped as it was sampled")
