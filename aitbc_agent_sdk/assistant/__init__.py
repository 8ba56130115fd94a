"""The assistant: plain-words requests turned into SDK calls, safely.

- :mod:`._tools`: the one registry (``REGISTRY``) of tools, each an SDK operation with a JSON
  schema (from a pydantic model) and an effect; ``aitbc chat``, the LLM loop and the MCP
  server all use it.
- :mod:`._understand` / :mod:`._planner`: the offline understanding layer (pure): concepts and
  entities, scored intents, a plan of tool steps.
- :mod:`._executor`: validation, the confirmation gate, dry runs, the execution trace.
- :mod:`._audit`: the hash-chained audit trail, with secrets kept out.
- :mod:`._llm`: tool calling through an OpenAI-compatible chat-completions endpoint.
- :mod:`._mcp_server`: the same tools as an MCP server (official ``mcp`` SDK) on stdio.
- :mod:`._session`: ``Assistant``, one request in and one answer out.

Names are imported on first use, so ``import aitbc_agent_sdk.assistant`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "_tools": ("REGISTRY", "Registry"),
    "_base": ("Tool", "ToolContext", "ToolResult"),
    "_planner": ("Plan", "Step", "plan_request"),
    "_executor": ("Executor", "StepOutcome"),
    "_session": ("Assistant", "Reply"),
    "_llm": ("LlmConfig",),
    "_mcp_server": ("serve_stdio",),
    "_reply": ("plan_lines",),
}, globals())

if TYPE_CHECKING:
    from ._base import Tool, ToolContext, ToolResult
    from ._executor import Executor, StepOutcome
    from ._llm import LlmConfig
    from ._planner import Plan, Step, plan_request
    from ._session import Assistant, Reply
    from ._tools import REGISTRY, Registry
    from ._mcp_server import serve_stdio
    from ._reply import plan_lines
