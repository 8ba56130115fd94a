"""Tool calling through an OpenAI-compatible chat-completions endpoint (vLLM, Ollama, llama.cpp, ...).

The model sees the registry's tools as function schemas, asks for calls, and gets each
call's outcome back as a ``tool`` message until it answers in words. Every call goes
through :meth:`Executor.call`, so the confirmation gate and the audit trail are the same
as for the offline planner; a dry run answers every call with "not run".
"""

from __future__ import annotations

import inspect
import json
import os
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..errors import AitbcError, ConfigError
from ._audit import Secrets, scrub_text
from ._executor import Confirm, Executor, Show, StepOutcome
from ._planner import Plan, Step

ENV_BASE_URL, ENV_MODEL, ENV_API_KEY = "AITBC_LLM_BASE_URL", "AITBC_LLM_MODEL", "AITBC_LLM_API_KEY"
MAX_TOOL_TEXT = 6000
SYSTEM_PROMPT = (
    "You are the aitbc assistant. You run federated training on rented GPUs (a marketplace with an on-chain "
    "escrow) and torch.distributed training on a trusted cluster, only through the tools given. Pick tools and "
    "arguments from the user's words; leave an argument out rather than invent it (a missing training_id means "
    "the newest training). A language model (GPT, LM, next-token) on a text corpus is training_init with task "
    "gpt, then upload_data with text_corpus true and the corpus directory. Tools that spend money, change hosts "
    "or stop work are confirmed by the user; if a call comes back declined, do not retry it. Answer briefly, in "
    "plain words, from the tool results."
)


class LlmError(AitbcError):
    """The chat-completions endpoint failed or answered something that is not a chat completion."""


@dataclass(frozen=True)
class LlmConfig:
    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 120.0
    max_turns: int = 8

    @classmethod
    def resolve(cls, base_url: str | None = None, model: str | None = None,
                api_key: str | None = None) -> LlmConfig | None:
        """Options first, then $AITBC_LLM_*; None when no endpoint is configured."""
        url = base_url or os.environ.get(ENV_BASE_URL)
        if not url:
            return None
        name = model or os.environ.get(ENV_MODEL)
        if not name:
            raise ConfigError(f"an LLM endpoint is configured ({url}) but no model: pass --llm-model or "
                              f"set ${ENV_MODEL}")
        return cls(url.rstrip("/"), name, api_key or os.environ.get(ENV_API_KEY) or None)


@dataclass
class LlmReply:
    text: str
    outcomes: list[StepOutcome]
    plan: Plan


async def complete(client: httpx.AsyncClient, config: LlmConfig, messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]]) -> dict[str, Any]:
    """One chat-completions round trip; returns the assistant message."""
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    body = {"model": config.model, "messages": messages, "tools": tools, "tool_choice": "auto", "temperature": 0}
    try:
        response = await client.post(f"{config.base_url}/chat/completions", json=body, headers=headers,
                                     timeout=config.timeout_s)
    except httpx.HTTPError as exc:
        raise LlmError(f"the LLM endpoint {config.base_url} is unreachable: {type(exc).__name__}") from exc
    if response.status_code != 200:
        raise LlmError(f"the LLM endpoint answered HTTP {response.status_code}: {scrub_text(response.text[:300])}")
    try:
        return dict(response.json()["choices"][0]["message"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise LlmError("the LLM endpoint's answer is not a chat completion") from exc


def tool_message(call_id: str, outcome: StepOutcome, secrets: Secrets) -> dict[str, Any]:
    payload = secrets.value(outcome.as_json())
    if outcome.status == "needs-confirmation":
        payload["note"] = "The user declined this action; nothing was done. Do not retry it."
    elif outcome.status == "dry-run":
        payload["note"] = "Dry run: the call was planned, not run."
    text = json.dumps(payload, sort_keys=True, default=str)
    if len(text) > MAX_TOOL_TEXT:
        text = json.dumps({k: payload[k] for k in payload if k != "result"} | {
            "summary": outcome.result.summary if outcome.result else None, "truncated": True})
    return {"role": "tool", "tool_call_id": call_id, "content": text}


async def converse(request: str, config: LlmConfig, executor: Executor, *, confirm: Confirm | None = None,
                   show: Show | None = None, dry_run: bool = False,
                   client: httpx.AsyncClient | None = None) -> LlmReply:
    tools = executor.registry.openai_tools()
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT},
                                      {"role": "user", "content": request}]
    outcomes: list[StepOutcome] = []
    steps: list[Step] = []
    own = client is None
    http = client or httpx.AsyncClient()
    try:
        for _ in range(config.max_turns):
            message = await complete(http, config, messages, tools)
            calls = message.get("tool_calls") or []
            if not calls:
                return LlmReply(executor.secrets.text(message.get("content") or ""), outcomes, Plan(request, steps))
            messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": calls})
            for call in calls:
                outcome = await _run_call(call, request, executor, confirm, show, dry_run)
                outcomes.append(outcome)
                if outcome.tool in executor.registry:
                    steps.append(Step(outcome.tool, _arguments(call) or {}))
                messages.append(tool_message(str(call.get("id", "")), outcome, executor.secrets))
        raise LlmError(f"the model was still calling tools after {config.max_turns} turns")
    finally:
        if own:
            await http.aclose()


def _arguments(call: dict[str, Any]) -> dict[str, Any] | None:
    """The call's arguments as the model wrote them, or None when they are not a JSON object."""
    raw = (call.get("function") or {}).get("arguments") or "{}"
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


async def _run_call(call: dict[str, Any], request: str, executor: Executor, confirm: Confirm | None,
                    show: Show | None, dry_run: bool) -> StepOutcome:
    name = str((call.get("function") or {}).get("name", ""))
    arguments = _arguments(call)
    if arguments is None:
        return StepOutcome(name, {}, "invalid", error="the call's arguments are not a JSON object")
    checked = executor.check(name, arguments)
    if show is not None:
        show([checked])
    granted = False
    if checked.status != "invalid" and checked.gated and not dry_run and confirm is not None:
        answer = confirm([checked])
        granted = bool(await answer) if inspect.isawaitable(answer) else bool(answer)
    return await executor.call(name, arguments, request=request, dry_run=dry_run, confirmed=granted)
