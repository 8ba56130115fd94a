"""Package-level exports that import their module on first use (PEP 562).

A CLI command or a worker process then pays only for what it touches: torch,
web3 and eth-account each cost a second or more to import.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, tuple[str, ...]],
                 namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """Return ``(__getattr__, __dir__, __all__)`` for ``package``; ``exports`` maps submodule -> names."""
    where = {name: module for module, names in exports.items() for name in names}
    public = sorted(where)

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value  # cache: the next access is a plain global lookup
        return value

    def __dir__() -> list[str]:
        return public

    return __getattr__, __dir__, public
