"""``aitbc dashboard``: serve the dashboard of a home on 127.0.0.1, or with a token on any other address."""

from __future__ import annotations

import importlib.util
import ipaddress
import secrets
import socket
from typing import Annotated, Optional

import typer

from aitbc_agent_sdk.errors import ConfigError

from ..common import HomeOption, NetworkOption, network_or_default, resolve_home

LOOPBACK_NAMES = ("localhost",)
DASHBOARD_MODULES = ("starlette", "sse_starlette", "uvicorn")  # the dashboard extra


class PortInUseError(ConfigError):
    """The address and port cannot be bound (exit 2)."""


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name: it may resolve anywhere
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on HOST:PORT, bound here so a port in use is one clear error, not uvicorn's traceback."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise PortInUseError(f"--host {host}: not an address this machine can bind ({exc.strerror})") from exc
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise PortInUseError(f"cannot serve on {host}:{port}: {exc.strerror or exc}; is another dashboard running? "
                             f"pass --port N") from exc
    return sock


def dashboard_url(host: str, port: int, token: str | None) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def dashboard(
    home: HomeOption = None,
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port to serve on (0: any free one)")] = 8765,
    host: Annotated[str, typer.Option(help="address to bind; any but loopback needs a token")] = "127.0.0.1",
    token: Annotated[Optional[str], typer.Option(
        help="require this token (?token= or 'Authorization: Bearer'); made up and printed when --host is not "
             "loopback and none is given", envvar="AITBC_DASHBOARD_TOKEN")] = None,
    open_browser: Annotated[bool, typer.Option("--open/--no-open", help="open the page in a web browser")] = False,
    network: NetworkOption = None,
) -> None:
    """Serve a live web dashboard of the home's trainings, their workers, money and audit log, and the market.

    It reads the state that `list`, `monitor` and `payments` read, writes nothing, and never asks for a password.

    The JSON API under /api/ serves scripts too. Any --host but loopback needs a token. Ctrl-C stops it.

    Example: aitbc dashboard --port 8765 --open
    """
    if missing := [m for m in DASHBOARD_MODULES if importlib.util.find_spec(m) is None]:
        raise ConfigError(f"aitbc dashboard needs {', '.join(missing)} (the dashboard extra): "
                          "pip install 'aitbc-agent-sdk[dashboard]'")
    import uvicorn

    from .app import create_app

    root = resolve_home(home)
    if token is None and not is_loopback(host):
        token = secrets.token_urlsafe(24)
    sock = bind(host, port)
    bound_port = sock.getsockname()[1]
    loopback = is_loopback(host)
    # On IPv4 loopback only the loopback names are answered: a web page cannot reach it through a rebound DNS name.
    hosts = ["127.0.0.1", "localhost"] if loopback and ":" not in host else None
    app = create_app(root, token=token, allowed_hosts=hosts, network=network_or_default(network, fallback="devnet"))
    url = dashboard_url(host, bound_port, token)
    typer.echo(f"dashboard of {root} at {url}  (Ctrl-C stops it)")
    if open_browser:
        import webbrowser

        webbrowser.open(url)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
