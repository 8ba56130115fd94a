"""IPFS API addresses as kubo writes them: a multiaddr (``/ip4/127.0.0.1/tcp/5001``) or a URL."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from ..errors import ConfigError

# kubo's API multiaddr: an IP or DNS name, a TCP port, and optionally /http or /https (default http).
_MULTIADDR = re.compile(
    r"/(?P<proto>ip4|ip6|dns|dns4|dns6)/(?P<host>[^/]+)/tcp/(?P<port>\d{1,5})(?:/(?P<scheme>https?))?/?")


def parse_api_address(address: str) -> str:
    """A Kubo RPC endpoint -> its base URL (no trailing slash); ConfigError names what is accepted.

    ``/ip4/127.0.0.1/tcp/5001`` -> ``http://127.0.0.1:5001``, ``/dns4/host/tcp/443/https`` ->
    ``https://host:443``; an ``http(s)://`` URL is kept as it is.
    """
    text = str(address).strip()
    if text.startswith("/"):
        match = _MULTIADDR.fullmatch(text)
        if match is None or not 0 < int(match["port"]) < 65536:
            raise ConfigError(f"{text!r} is not an IPFS API multiaddr like /ip4/127.0.0.1/tcp/5001"
                              " or /dns4/HOST/tcp/PORT/https")
        host = f"[{match['host']}]" if match["proto"] == "ip6" else match["host"]
        return f"{match['scheme'] or 'http'}://{host}:{int(match['port'])}"
    url = urlsplit(text)
    try:
        valid = url.scheme in ("http", "https") and bool(url.hostname) and url.port != 0
    except ValueError:  # a port outside 0-65535
        valid = False
    if not valid:
        raise ConfigError(f"{text!r} is not an IPFS API address: use http://HOST:PORT or a multiaddr"
                          " /ip4/HOST/tcp/PORT")
    return text.rstrip("/")
