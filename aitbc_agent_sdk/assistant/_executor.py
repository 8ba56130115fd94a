"""Running plans and single tool calls: validation, the confirmation gate, dry runs, the audit trail.

Order for a plan: every step is validated (and its tool's preflight run) before anything runs;
a dry run stops there; if any step is gated (spends money, changes hosts, stops work) the
person confirms the whole plan once, and "no" runs nothing, not even the ungated steps; then the steps run
in order and the first failure skips the rest. ``trace`` lists every handler actually
invoked, so tests and callers can see what ran without mocking the SDK.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from ..errors import AitbcError
from ._audit import AssistantAudit, Secrets
from ._base import Tool, ToolArgs, ToolArgumentError, ToolContext, ToolResult
from ._planner import Plan
from ._tools import REGISTRY, Registry

Status = Literal["done", "failed", "declined", "dry-run", "skipped", "invalid", "needs-confirmation"]
Confirm = Callable[[list["StepOutcome"]], "bool | Awaitable[bool]"]
Show = Callable[[list["StepOutcome"]], None]
EXPECTED_ERRORS = (AitbcError, ValidationError, OSError, TimeoutError, ValueError)


@dataclass
class StepOutcome:
    tool: str
    arguments: dict[str, Any]
    status: Status
    effect: str = "read"
    result: ToolResult | None = None
    error: str | None = None

    @property
    def gated(self) -> bool:
        return self.effect in ("spend", "change-hosts", "stop")

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tool": self.tool, "arguments": self.arguments, "status": self.status,
                               "effect": self.effect}
        if self.result is not None:
            out["result"] = self.result.as_json()
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass
class Executor:
    ctx: ToolContext
    registry: Registry = REGISTRY
    audit: AssistantAudit | None = None
    secrets: Secrets = field(default_factory=Secrets)
    trace: list[dict[str, Any]] = field(default_factory=list)

    async def run_plan(self, plan: Plan, *, dry_run: bool = False, confirm: Confirm | None = None,
                       show: Show | None = None) -> list[StepOutcome]:
        await self._record("request", request=plan.request, intents=plan.intents, dry_run=dry_run,
                           plan=[s.as_json() for s in plan.steps])
        checked = [self.check(s.tool, s.arguments) for s in plan.steps]
        if show is not None:
            show(checked)
        if any(o.status == "invalid" for o in checked) or dry_run:
            for o in checked:
                o.status = "invalid" if o.status == "invalid" else ("dry-run" if dry_run else "skipped")
            await self._record("planned", request=plan.request, dry_run=dry_run,
                               steps=[o.as_json() for o in checked])
            return checked
        gated = [o for o in checked if o.gated]
        if gated:
            answer = confirm(checked) if confirm is not None else False
            granted = bool(await answer) if inspect.isawaitable(answer) else bool(answer)
            await self._record("confirmation", request=plan.request, granted=granted,
                               gated=[{"tool": o.tool, "effect": o.effect} for o in gated])
            if not granted:
                for o in checked:
                    o.status = "declined"
                return checked
        failed = False
        for o in checked:
            if failed:
                o.status = "skipped"
                continue
            await self._invoke(self.registry.get(o.tool), o, plan.request)
            failed = o.status == "failed"
        return checked

    async def call(self, name: str, arguments: dict[str, Any] | None, *, request: str, dry_run: bool = False,
                   confirmed: bool = False) -> StepOutcome:
        """One tool call from a model (MCP, OpenAI): the gate holds unless ``confirmed``."""
        outcome = self.check(name, arguments or {})
        await self._record("tool_request", request=request, tool=name, arguments=outcome.arguments,
                           dry_run=dry_run, confirmed=confirmed)
        if outcome.status == "invalid":
            return outcome
        if dry_run:
            outcome.status = "dry-run"
        elif outcome.gated and not confirmed:
            outcome.status = "needs-confirmation"
        else:
            await self._invoke(self.registry.get(name), outcome, request)
        return outcome

    def check(self, name: str, arguments: dict[str, Any]) -> StepOutcome:
        """The step as it would run: arguments validated (defaults filled in), or ``invalid`` and why."""
        if name not in self.registry:
            return StepOutcome(name, dict(arguments), "invalid", error=f"no tool {name!r}")
        tool = self.registry.get(name)
        try:
            args = tool.validate(arguments)
            if tool.preflight is not None:
                tool.preflight(args)
        except ToolArgumentError as exc:
            return StepOutcome(name, dict(arguments), "invalid", tool.effect, error=str(exc))
        except AitbcError as exc:  # the preflight's answer: what is wrong with the arguments, in plain words
            return StepOutcome(name, args.model_dump(mode="json"), "invalid", tool.effect,
                               error=self.secrets.text(str(exc)))
        return StepOutcome(name, args.model_dump(mode="json"), "skipped", tool.effect)

    # -- internals ---------------------------------------------------------------------------
    async def _invoke(self, tool: Tool, outcome: StepOutcome, request: str) -> None:
        args: ToolArgs = tool.validate(outcome.arguments)
        await self._record("tool_call", request=request, tool=tool.name, effect=tool.effect,
                           arguments=outcome.arguments)

        async def acting_on(training_id: str) -> None:
            if self.audit is not None:
                await self.audit.on_training(training_id, "assistant_action", request=request, tool=tool.name,
                                             effect=tool.effect, arguments=outcome.arguments)

        self.ctx.acting_on = acting_on
        self.trace.append({"tool": tool.name, "arguments": outcome.arguments})
        try:
            outcome.result = await tool.handler(self.ctx, args)
            outcome.status = "done" if outcome.result.ok else "failed"
            if not outcome.result.ok:
                outcome.error = outcome.result.summary
        except EXPECTED_ERRORS as exc:
            outcome.status, outcome.error = "failed", self.secrets.text(str(exc)) or type(exc).__name__
        await self._record("tool_result", request=request, tool=tool.name, status=outcome.status,
                           summary=outcome.result.summary if outcome.result else None, error=outcome.error,
                           training_id=outcome.result.training_id if outcome.result else None)

    async def _record(self, event: str, **fields: Any) -> None:
        if self.audit is not None:
            await self.audit.record(event, **fields)
