"""One request in, one answer out: the offline planner or the LLM picks the tools, the executor
runs them behind the confirmation gate, and every action lands in the audit trail."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..records import visible
from ._audit import AssistantAudit, Secrets
from ._base import PasswordSource, ToolContext, no_password
from ._executor import Confirm, Executor, Show, StepOutcome
from ._llm import LlmConfig, converse
from ._planner import Plan, plan_request
from ._reply import answer, not_understood
from ._tools import REGISTRY, Registry


@dataclass
class Reply:
    request: str
    plan: Plan
    outcomes: list[StepOutcome]
    text: str
    via: str = "planner"  # or "llm"

    @property
    def understood(self) -> bool:
        return self.plan.understood

    @property
    def ok(self) -> bool:
        return self.understood and all(o.status in ("done", "dry-run") for o in self.outcomes)


@dataclass
class Assistant:
    home: Path
    password: PasswordSource = no_password
    llm: LlmConfig | None = None
    source: str = "chat"
    registry: Registry = REGISTRY
    notice: Callable[[str], None] | None = None
    executors: list[Executor] = field(default_factory=list)  # one per request, kept for their traces
    secrets: Secrets = field(default_factory=Secrets)

    def __post_init__(self) -> None:
        if self.llm is not None:
            self.secrets.add(self.llm.api_key)

    def _password(self, wallet: str) -> str:
        password = self.password(wallet)
        self.secrets.add(password)  # never shown or logged from now on
        return password

    def executor(self, *, dry_run: bool) -> Executor:
        ctx = ToolContext(home=self.home, password=self._password)
        if self.notice is not None:
            ctx.notice = self.notice
        # A dry run acts on nothing, so it writes nothing either, not even the audit trail.
        audit = None if dry_run else AssistantAudit(self.home, source=self.source, secrets=self.secrets)
        executor = Executor(ctx, registry=self.registry, audit=audit, secrets=self.secrets)
        self.executors.append(executor)
        return executor

    @property
    def trace(self) -> list[dict[str, object]]:
        return [entry for e in self.executors for entry in e.trace]

    async def handle(self, request: str, *, dry_run: bool = False, confirm: Confirm | None = None,
                     show: Show | None = None) -> Reply:
        request = request.strip()
        self.secrets.add_keys_in(request)
        executor = self.executor(dry_run=dry_run)
        if self.llm is not None:
            got = await converse(request, self.llm, executor, confirm=confirm, show=show, dry_run=dry_run)
            # The model may echo what the tools returned, escape sequences and all.
            text = visible(got.text, multiline=True) if got.text else answer(got.outcomes)
            return Reply(request, got.plan, got.outcomes, self.secrets.text(text), via="llm")
        plan = plan_request(request)
        if not plan.understood:
            if executor.audit is not None:
                await executor.audit.record("not_understood", request=request)
            return Reply(request, plan, [], not_understood(request, self.registry))
        outcomes = await executor.run_plan(plan, dry_run=dry_run, confirm=confirm, show=show)
        return Reply(request, plan, outcomes, self.secrets.text(answer(outcomes)))
