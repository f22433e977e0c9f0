"""Check mode: ``python my_env.py check`` runs an environment briefly and checks its contract.

It checks what a training run would otherwise find out late: that the config round-trips
through YAML and gives the API a valid registration, that ``setup()`` runs, and that a few
groups (``--groups``, 4 by default) have the right size, aligned tokens, masks and logprobs,
a masked prompt, finite scores that vary, renderable messages and sampling stamps (the rules
are in `atroposlib.envs.check_rules`), and that ``evaluate()`` runs. Each check prints one
line, ``PASS  <check>`` or ``FAIL  <check>: <what is wrong> — <what to change>``; the exit
status is 0 only when all pass (1 otherwise, 2 for bad flags).

The inference server is the built-in `StandInServer` (no GPU, no internet) unless
``--openai.base_url`` (a flag or the YAML ``openai:`` section) names a real one. The report
goes to stdout; what the environment itself prints goes to stderr, beside the logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import yaml
from pydantic import ValidationError

from atroposlib.envs import accept, check_rules
from atroposlib.envs.rescore_hooks import RESCORE_FACTS_FIELD
from atroposlib.envs.check_rules import Check, Collected
from atroposlib.envs.cli import ConfigError, RunSettings, describe, resolve_settings
from atroposlib.envs.sampling_stamp import stamp_group
from atroposlib.envs.serve_mode import registration_payload
from atroposlib.envs.server_handling.api_server import ModelNotServed
from atroposlib.envs.server_handling.sampling_record import recording
from atroposlib.envs.server_handling.server_manager import ManagedServerUnsupported
from atroposlib.envs.server_handling.stand_in import StandInServer
from atroposlib.envs.tokenizer_loading import TokenizerUnavailable
from atroposlib.utils.tokenize_for_trainer import apply_template, token_ids
from atroposlib.wire import RegisterEnv

log = logging.getLogger("atroposlib.envs")

TRACEBACKS = "ATROPOS_LOG_LEVEL=DEBUG prints the traceback"
ITEM_TRIES = 3  # items asked for per wanted group: get_next_item may say "nothing right now" (None)
CONFIGURATION_ERRORS = (ManagedServerUnsupported, TokenizerUnavailable, ModelNotServed)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


@dataclass
class Collection:
    """The groups collected, and what went wrong on the way."""

    groups: list[Collected] = field(default_factory=list)
    items: int = 0
    no_item: int = 0
    no_group: int = 0
    errors: list[str] = field(default_factory=list)


def uses_stand_in(settings: RunSettings) -> bool:
    """Whether the run's inference server is the stand-in: yes unless a base URL was given."""
    return not settings.server_named


def config_round_trip(env_cls: Any, settings: RunSettings) -> Check:
    """The settings as the command line prints them, read back with ``--config``, are the same."""
    name = "config round-trips through YAML"
    try:
        text = describe(settings)
    except yaml.YAMLError as exc:
        return Check(name=name, passed=False, detail=f"cannot be written as YAML: {one_line(exc)}",
                     fix="give config fields plain types (str, numbers, bool, lists, dicts, enums)")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.yaml"
        path.write_text(text)
        try:
            again = resolve_settings(env_cls, ["check", "--config", str(path)])
        except (ConfigError, ValueError) as exc:
            return Check(name=name, passed=False, detail=f"its YAML is refused when read back: {one_line(exc)}",
                         fix="make every field's value valid input for the field")
    before, after = settings.env_config.model_dump(), again.env_config.model_dump()
    changed = [key for key in before if before[key] != after.get(key)]
    if changed:
        return Check(name=name, passed=False, detail=f"{changed[0]} was {before[changed[0]]!r}, read back as "
                     f"{after.get(changed[0])!r}", fix="give the field a type YAML keeps (str, numbers, bool, "
                     "lists, dicts)")
    return Check(name=name, passed=True)


def registration(env: Any) -> Check:
    name = "registration fields the API needs"
    try:
        RegisterEnv.model_validate(registration_payload(env))
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        return Check(name=name, passed=False, detail=f"{where}: {error['msg']}",
                     fix="set name on the class (or --env.wandb_name), a positive group_size and numeric limits")
    return Check(name=name, passed=True, detail=f"as {env.config.wandb_name!r}, groups of {env.config.group_size}")


def _log_prompts(env: Any, prompts: list[list[int]]) -> None:
    """Keep every prompt the env's servers are sent, as token ids, in `prompts`."""

    def prompt_ids(method: str, kwargs: dict[str, Any]) -> list[int]:
        if method == "tokens_and_logprobs_completion" and kwargs.get("input_ids"):
            return list(kwargs["input_ids"])
        if method == "chat_completion":
            return apply_template(env.tokenizer, kwargs.get("messages") or [], add_generation_prompt=True)
        return token_ids(env.tokenizer.encode(str(kwargs.get("prompt", ""))))

    for server in env.server.servers:
        for method in ("chat_completion", "completion", "tokens_and_logprobs_completion"):
            original = getattr(server, method)

            async def logged(*args: Any, _original: Any = original, _method: str = method, **kwargs: Any) -> Any:
                try:
                    prompts.append(prompt_ids(_method, kwargs))
                except Exception:  # a prompt the template cannot render: the rule just cannot locate it
                    pass
                return await _original(*args, **kwargs)

            setattr(server, method, logged)


def _as_sent(group: dict[str, Any], record: Any, env: Any) -> dict[str, Any]:
    """`group` as serve would send it: stamped and completed (on a copy)."""
    sent = copy.deepcopy(group)
    sent.pop(RESCORE_FACTS_FIELD, None)  # saved in the JSONL only, never sent
    if sent.get("group_overrides") is None and "group_overrides" in sent:
        sent["group_overrides"] = {}
    stamp_group(sent, record)
    return accept.complete_group(sent, env.tokenizer, env.config.include_messages)


async def _groups_of(env: Any, item: Any, prompts: list[list[int]]) -> list[Collected]:
    """The groups `env` makes of `item`, as they would be sent."""
    with recording() as record:
        result, _ = await env.collect_trajectories(item)
        result = await env.postprocess_histories(result)
    groups = [result] if isinstance(result, dict) else [g for g in result or [] if g]
    return [Collected(_as_sent(group, record, env), list(prompts), record) for group in groups]


async def collect(env: Any, stand_in: Optional[StandInServer], wanted: int) -> Collection:
    """Up to `wanted` groups, each from its own item and sampling record; what the environment
    raises is counted (configuration errors stop the run, as in the other modes)."""
    found, prompts = Collection(), []
    _log_prompts(env, prompts)
    for _ in range(wanted * ITEM_TRIES):
        if len(found.groups) >= wanted:
            break
        prompts.clear()
        try:
            item = await env.get_next_item()
            if item is None:
                found.no_item += 1
                continue
            found.items += 1
            if stand_in is not None:
                stand_in.start_item(item)
            groups = await _groups_of(env, item, prompts)
        except CONFIGURATION_ERRORS:
            raise
        except Exception as exc:
            log.debug("an item failed", exc_info=True)
            found.errors.append(one_line(exc))
            continue
        finally:
            await env.cleanup()
        found.no_group += not groups
        found.groups += groups
    return found


def collected_check(found: Collection, wanted: int) -> Check:
    name = "groups collected"
    if found.errors:
        return Check(name=name, passed=False, detail=f"raised {len(found.errors)} times, first {found.errors[0]}",
                     fix=f"fix get_next_item or collect_trajectories ({TRACEBACKS})")
    if not found.groups:
        why = f"get_next_item returned None {found.no_item} times" if not found.items else (
            f"collect_trajectories returned no group for {found.no_group} of {found.items} items")
        return Check(name=name, passed=False, detail=why, fix="return a scored group for an item; an environment "
                     "that drops groups whose answers all scored alike, or were unusable, drops every group when no "
                     "answer of the stand-in is right: check it against a model with --openai.base_url (an "
                     "evaluation-only environment has no groups)")
    for index, entry in enumerate(found.groups):
        try:
            json.dumps(entry.group)  # NaN passes here: the scores check names it
        except (TypeError, ValueError) as exc:
            return Check(name=name, passed=False, detail=f"group {index + 1} is not JSON: {exc}",
                         fix="use lists, dicts, str, int and finite floats only (no numpy or tensors)")
    return Check(name=name, passed=True, detail=f"{len(found.groups)} groups from {found.items} items")


def group_checks(env: Any, found: Collection, answers_vary: bool) -> list[Check]:
    groups = found.groups
    structure = [check_rules.group_size(groups, env.config.group_size), check_rules.aligned(groups)]
    if not all(check.passed for check in structure):
        return structure  # later rules index tokens, masks and scores together
    masked = check_rules.prompt_masked(groups)
    # a trained prompt position carries the prompt's logprob placeholder: one problem, told once
    logprobs = [check_rules.logprobs_sampled(groups)] if masked.passed else []
    return structure + [masked, *logprobs] + [
        check_rules.scores_in_range(groups, getattr(env, "score_range", None)),
        check_rules.scores_vary(groups, answers_vary),
        check_rules.messages_renderable(groups, env.tokenizer),
        check_rules.sampling_stamped(groups),
    ]


async def evaluate_check(env: Any) -> Check:
    name = "evaluate runs"
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        if not env.config.data_dir_to_save_evals:
            env.config.data_dir_to_save_evals = folder
        try:
            await env.run_evaluation()
        except CONFIGURATION_ERRORS:
            raise
        except NotImplementedError as exc:
            return Check(name=name, passed=False, detail=one_line(exc), fix="implement evaluate() (serve calls it "
                         "every steps_per_eval steps)")
        except Exception as exc:
            log.debug("evaluate failed", exc_info=True)
            return Check(name=name, passed=False, detail=one_line(exc), fix=f"fix evaluate() ({TRACEBACKS})")
    return Check(name=name, passed=True, detail=f"{time.monotonic() - started:.1f} s")


class Report:
    """Prints each check as it is known, and the summary."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.checks: list[Check] = []

    def add(self, check: Check) -> None:
        self.checks.append(check)
        print(check.line(), file=self.out, flush=True)

    def finish(self, note: str = "") -> int:
        failed = sum(not check.passed for check in self.checks)
        summary = f"all {len(self.checks)} checks passed" if not failed else (
            f"{failed} of {len(self.checks)} checks failed")
        print(summary + note, file=self.out, flush=True)
        return 1 if failed else 0


async def run_checks(env: Any, stand_in: Optional[StandInServer], wanted: int, report: Report) -> None:
    """Every check that needs the running environment, added to `report` in turn."""
    with contextlib.redirect_stdout(sys.stderr):
        try:
            await env.setup()
        except CONFIGURATION_ERRORS:
            raise
        except Exception as exc:
            log.debug("setup failed", exc_info=True)
            report.add(Check(name="setup runs", passed=False, detail=one_line(exc), fix=f"fix setup() ({TRACEBACKS})"))
            return
        report.add(Check(name="setup runs", passed=True))
        found = await collect(env, stand_in, wanted)
        report.add(collected_check(found, wanted))
        if found.groups:
            for check in group_checks(env, found, answers_vary=stand_in is not None):
                report.add(check)
        report.add(await evaluate_check(env))


def header(env_cls: Any, settings: RunSettings, wanted: int) -> str:
    if uses_stand_in(settings):
        return (f"checking {env_cls.__name__} on {wanted} groups against the built-in stand-in server\n"
                "  (answers scripted from each item, not a model's: they show the contract is kept, not how well a "
                "model does;\n  --openai.base_url checks against a real server)")
    servers = settings.server_configs if isinstance(settings.server_configs, list) else [settings.server_configs]
    where = ", ".join(str(getattr(server, "base_url", "")) for server in servers)
    return f"checking {env_cls.__name__} on {wanted} groups against {where}"


async def _closing(env: Any, stand_in: Optional[StandInServer], wanted: int, report: Report) -> None:
    try:
        await run_checks(env, stand_in, wanted, report)
    finally:
        env.close_jsonl_writer()
        await env.server.close()


def build_checked(env_cls: Any, settings: RunSettings) -> tuple[Any, Optional[StandInServer]]:
    """The environment to check, and the stand-in it runs against (None: a real server)."""
    from atroposlib.envs.runner import build_env

    if not uses_stand_in(settings):
        return build_env(env_cls, settings), None
    env = build_env(env_cls, replace(settings, manager=settings.manager.model_copy(update={"testing": True})))
    stand_in = StandInServer()
    env.server.servers = [stand_in]
    return env, stand_in


def check(env_cls: Any, settings: RunSettings, out: Any = None) -> int:
    """Build the environment of `settings`, run every check and print the report; the exit status."""
    report = Report(out or sys.stdout)
    print(header(env_cls, settings, settings.check_groups), file=report.out, flush=True)
    env, stand_in = build_checked(env_cls, settings)
    report.add(config_round_trip(env_cls, settings))
    report.add(registration(env))
    if stand_in is None:
        missing = asyncio.run(env.server.unreachable())
        if len(missing) == len(env.server.servers):
            env.close_jsonl_writer()
            report.add(Check(name="inference server answers", passed=False, detail=f"none at {', '.join(missing)}",
                             fix="start one, correct --openai.base_url, or leave it out to use the stand-in"))
            return report.finish()
    asyncio.run(_closing(env, stand_in, settings.check_groups, report))
    return report.finish()
