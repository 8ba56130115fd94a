"""The assistant: plain-words requests turned into SDK calls, safely.

- :mod:`.tools`: the one registry (``REGISTRY``) of tools, each an SDK operation with a JSON
  schema (from a pydantic model) and an effect; ``aitbc chat``, the LLM loop and the MCP
  server all use it.
- :mod:`.understand` / :mod:`.planner`: the offline understanding layer (pure): concepts and
  entities, scored intents, a plan of tool steps.
- :mod:`.executor`: validation, the confirmation gate, dry runs, the execution trace.
- :mod:`.audit`: the hash-chained audit trail, with secrets kept out.
- :mod:`.llm`: tool calling through an OpenAI-compatible chat-completions endpoint.
- :mod:`.mcp_server`: the same tools as an MCP server (official ``mcp`` SDK) on stdio.
- :mod:`.session`: ``Assistant``, one request in and one answer out.

Names are imported on first use, so ``import aitbc_agent_sdk.assistant`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "tools": ("REGISTRY", "Registry"),
    "base": ("Tool", "ToolContext", "ToolResult"),
    "planner": ("Plan", "Step", "plan_request"),
    "executor": ("Executor", "StepOutcome"),
    "session": ("Assistant", "Reply"),
    "llm": ("LlmConfig",),
    "mcp_server": ("serve_stdio",),
    "reply": ("plan_lines",),
}, globals())

if TYPE_CHECKING:
    from .base import Tool, ToolContext, ToolResult
    from .executor import Executor, StepOutcome
    from .llm import LlmConfig
    from .planner import Plan, Step, plan_request
    from .session import Assistant, Reply
    from .tools import REGISTRY, Registry
    from .mcp_server import serve_stdio
    from .reply import plan_lines
