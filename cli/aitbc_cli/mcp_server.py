"""``aitbc mcp serve``: the assistant's tools as an MCP server on stdio, for any MCP-capable assistant."""

from __future__ import annotations

import asyncio

import typer

from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.profile import devnet_password

from .common import HomeOption, resolve_home

app = typer.Typer(help="Model Context Protocol: expose the SDK's tools to MCP-capable assistants.",
                  no_args_is_help=True)


@app.command("serve")
def serve(home: HomeOption = None) -> None:
    """Serve every tool over stdio (stdout is the protocol; progress goes to stderr).

    Tools that spend money, change hosts or stop work run only when called with confirm=true;
    every call is written to $AITBC_HOME/assistant/audit.jsonl. Wallets are unlocked with
    $AITBC_WALLET_PASSWORD or the devnet's password file, never with a password in a call.

    Example: aitbc mcp serve --home ~/.aitbc
    """
    from aitbc_agent_sdk.assistant import serve_stdio

    root = resolve_home(home)

    def password(wallet: str) -> str:
        found = devnet_password(root)
        if found is None:
            raise ConfigError(f"wallet {wallet!r} needs a password: set AITBC_WALLET_PASSWORD for the server")
        return found

    try:
        asyncio.run(serve_stdio(root, password=password))
    except KeyboardInterrupt:
        pass
