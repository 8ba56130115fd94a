"""An MCP server (official ``mcp`` SDK, low-level ``Server``) exposing every registry tool.

Each tool's input schema is the registry's, plus three arguments every MCP client can use:

* ``dry_run``: plan only; the tool is validated and described, not run;
* ``confirm``: on tools that spend money, change hosts or stop work, the call runs only
  with ``confirm: true``; the assistant is expected to ask its user first (without it
  the answer says confirmation is needed and nothing happens);
* ``request``: the user's words that led to the call, written to the audit trail.

stdout is the protocol; nothing else may print there. Progress goes to stderr.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

from mcp import types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server

from ..records import visible, visible_values
from ._audit import AssistantAudit, Secrets
from ._base import PasswordSource, Tool, ToolContext, no_password
from ._executor import Executor, StepOutcome
from ._tools import REGISTRY, Registry, describe

SERVER_NAME = "aitbc"
CONTROL_ARGS = ("dry_run", "confirm", "request")


def mcp_schema(tool: Tool) -> dict[str, Any]:
    schema = copy.deepcopy(tool.schema)
    props = schema.setdefault("properties", {})
    props["dry_run"] = {"type": "boolean", "default": False, "description": "plan only: validate, do not run"}
    props["request"] = {"type": "string", "description": "the user's words that led to this call (audited)"}
    if tool.gated:
        props["confirm"] = {"type": "boolean", "default": False,
                            "description": "true only after the user agreed to this action"}
    return schema


def mcp_tool(tool: Tool) -> types.Tool:
    return types.Tool(name=tool.name, description=describe(tool), input_schema=mcp_schema(tool),
                      annotations=types.ToolAnnotations(title=tool.name.replace("_", " "),
                                                        read_only_hint=tool.effect == "read",
                                                        destructive_hint=tool.gated))


def call_result(outcome: StepOutcome) -> types.CallToolResult:
    # The answer goes to a model and on to its user: what other parties wrote is shown, never obeyed.
    if outcome.status == "done" and outcome.result is not None:
        text = visible(outcome.result.summary, multiline=True)
    elif outcome.status == "dry-run":  # JSON in ASCII: control characters arrive escaped
        text = f"Dry run: {outcome.tool} would run with {json.dumps(outcome.arguments, sort_keys=True)}; nothing ran."
    elif outcome.status == "needs-confirmation":
        text = (f"{visible(outcome.tool)} {describe_effect(outcome.effect)}: ask the user, then call it again with "
                f"confirm=true. Nothing was done.")
    else:
        text = f"{visible(outcome.tool)} {outcome.status}: {visible(outcome.error)}"  # an error is one line
    return types.CallToolResult(content=[types.TextContent(text=text)],
                                structured_content=visible_values(outcome.as_json()),
                                is_error=outcome.status in ("failed", "invalid"))


def describe_effect(effect: str) -> str:
    return {"spend": "spends money", "change-hosts": "changes hosts", "stop": "stops running work"}.get(effect, effect)


def build_server(home: Path, *, password: PasswordSource = no_password, registry: Registry = REGISTRY) -> Server:
    secrets = Secrets()
    audit = AssistantAudit(home, source="mcp", secrets=secrets)

    def unlock_password(wallet: str) -> str:
        found = password(wallet)
        secrets.add(found)
        return found

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[mcp_tool(t) for t in registry])

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = dict(params.arguments or {})
        dry_run = bool(arguments.pop("dry_run", False))
        confirmed = bool(arguments.pop("confirm", False))
        request = str(arguments.pop("request", "") or f"(MCP call to {params.name})")
        secrets.add_keys_in(request)
        tool_ctx = ToolContext(home=home, password=unlock_password,
                               notice=lambda line: print(visible(line), file=sys.stderr, flush=True))
        executor = Executor(tool_ctx, registry=registry, audit=None if dry_run else audit, secrets=secrets)
        outcome = await executor.call(params.name, arguments, request=request, dry_run=dry_run, confirmed=confirmed)
        return call_result(outcome)

    return Server(SERVER_NAME, version="0.1.0", instructions=(
        "Tools for federated training on rented GPUs and torch.distributed training on a trusted cluster. "
        "Ask the user before any call with confirm=true: those spend money, change hosts or stop work."),
        on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio(home: Path, *, password: PasswordSource = no_password) -> None:
    server = build_server(home, password=password)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
