"""The one tool registry. ``aitbc chat``, the OpenAI tool-calling loop and ``aitbc mcp serve`` all list
and run the SDK's operations from :data:`REGISTRY`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import ConfigError
from . import _cluster_ops as cluster_ops
from . import _cluster_recover as cluster_recover
from . import _cluster_tools as cluster_tools
from . import _ledger_tools as ledger_tools
from . import _market_tools as market_tools
from ._base import Tool


class UnknownToolError(ConfigError):
    """A tool name that is not in the registry."""


class Registry:
    def __init__(self, tools: Iterable[Tool]) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self._tools:
                raise ValueError(f"tool {tool.name!r} registered twice")
            self._tools[tool.name] = tool

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownToolError(f"no tool {name!r}; the tools are {', '.join(self._tools)}") from None

    def openai_tools(self) -> list[dict[str, Any]]:
        """The registry as OpenAI chat-completions ``tools`` (function schemas)."""
        return [{"type": "function", "function": {"name": t.name, "description": describe(t), "parameters": t.schema}}
                for t in self]

    def capabilities(self) -> list[str]:
        """One plain-words line per tool: what it does and a request that leads to it."""
        return [f"{t.name}: {t.description} (say: \"{t.example}\")" for t in self]


def describe(tool: Tool) -> str:
    gate = " Needs the user's confirmation: it " + {"spend": "spends money.", "change-hosts": "changes hosts.",
                                                    "stop": "stops or restarts running work."}[tool.effect] \
        if tool.gated else ""
    return tool.description + gate


REGISTRY = Registry((*cluster_tools.TOOLS, *cluster_ops.TOOLS, *cluster_recover.TOOLS, *market_tools.TOOLS,
                     *ledger_tools.TOOLS))
