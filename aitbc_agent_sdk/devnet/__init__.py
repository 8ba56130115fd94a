"""Local servers for the devnet and the tests: broker, chain node, IPFS daemon, bound to 127.0.0.1.

The devnet's own commands are imported on first use (PEP 562)."""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "_network": ("DevnetOptions", "add_broker_accounts", "devnet_down", "devnet_join", "devnet_status", "devnet_up",
                "wallet_store"),
}, globals())

if TYPE_CHECKING:
    from ._network import (
        DevnetOptions, add_broker_accounts, devnet_down, devnet_join, devnet_status, devnet_up, wallet_store,
    )
