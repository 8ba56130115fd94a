"""The pieces every tool is made of: its effect, its result, the context it runs in.

A tool's *effect* says what running it can do to the world, and so whether a person must
confirm it first: ``read`` and ``write`` (local records only, nothing spent) run at once;
``spend`` (money), ``change-hosts`` (mounts, launches) and ``stop`` (ends or restarts
running work) are gated.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import ConfigError

Effect = Literal["read", "write", "spend", "change-hosts", "stop"]
GATED_EFFECTS: frozenset[str] = frozenset({"spend", "change-hosts", "stop"})
EFFECT_WORDS = {"read": "only reads", "write": "writes local records (nothing is spent)",
                "spend": "spends money", "change-hosts": "changes hosts", "stop": "stops or restarts running work"}


class ToolArgs(BaseModel):
    """Base of every tool's argument model: unknown arguments are refused, not ignored."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class ToolResult:
    """What a tool did: ``summary`` in plain words, ``data`` as JSON for programs and renderers."""

    summary: str
    data: dict[str, Any] = field(default_factory=dict)
    ok: bool = True
    training_id: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "summary": self.summary, "data": self.data,
                **({"training_id": self.training_id} if self.training_id else {})}

    def text(self) -> str:
        return json.dumps(self.as_json(), sort_keys=True, default=str)


PasswordSource = Callable[[str], str]


async def _nothing(training_id: str) -> None:
    return None


def no_password(wallet: str) -> str:
    raise ConfigError(f"wallet {wallet!r} needs a password: set AITBC_WALLET_PASSWORD or use the devnet's wallets")


@dataclass
class ToolContext:
    """Where tools run: the state directory, how to unlock a wallet, what earlier steps made.

    Secrets stay here, never in tool arguments: ``password`` maps a wallet name to its
    password and is asked only by tools that sign.
    """

    home: Path
    password: PasswordSource = no_password
    training_id: str | None = None  # the training an earlier step of this plan created or used
    notice: Callable[[str], None] = lambda text: None  # progress lines for long-running tools
    acting_on: Callable[[str], Awaitable[None]] = field(default=_nothing)  # a tool is about to act on this training


Handler = Callable[[ToolContext, Any], Awaitable[ToolResult]]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    args: type[ToolArgs]
    effect: Effect
    handler: Handler
    example: str  # one plain-words request that leads here, for "what can you do"
    # A quick local check of the arguments (reads local files, changes nothing), run with the validation
    # before any step of a plan, so a plan that cannot work stops before it creates or spends anything.
    preflight: Callable[[Any], None] | None = None

    @property
    def gated(self) -> bool:
        return self.effect in GATED_EFFECTS

    @property
    def schema(self) -> dict[str, Any]:
        """The arguments' JSON schema (pydantic's), without the titles models do not need."""
        schema = self.args.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        schema.setdefault("properties", {})
        return schema

    def validate(self, arguments: dict[str, Any] | None) -> ToolArgs:
        try:
            return self.args.model_validate(arguments or {})
        except ValidationError as exc:
            described = {n: f.description or "" for n, f in self.args.model_fields.items()}
            raise ToolArgumentError(self.name, exc, described) from exc


class ToolArgumentError(ConfigError):
    """Arguments a tool cannot run with, in plain words (which field, what is wrong)."""

    def __init__(self, tool: str, exc: ValidationError, fields: dict[str, str] | None = None) -> None:
        fields = fields or {}
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "arguments"
            if err["type"] == "missing":
                described = (fields.get(str(err["loc"][0])) if err["loc"] else None)
                problems.append(f"{where} is missing" + (f" ({described})" if described else ""))
            else:
                problems.append(f"{where}: {err['msg']}")
        self.tool = tool
        self.problems = problems
        super().__init__(f"{tool} cannot run: {'; '.join(problems)}")
