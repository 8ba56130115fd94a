"""Value parsers shared by every command: ETH amounts, endpoints (chain RPC, IPFS API, MQTT broker).

Each parser takes the text the user typed and returns the value the SDK wants, or raises
``ValueError`` with a message that says what would have been accepted; typer turns that into
a usage error (exit 2). They are plain functions, tested on their own.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from urllib.parse import urlsplit

from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.settings import parse_broker as parse_broker_address
from aitbc_agent_sdk.storage import parse_api_address

WEI_PER_ETH = 10**18
# Units as Foundry's `cast --to-wei` spells them; a bare number is ETH (what every amount option meant so far).
UNIT_DECIMALS = {"eth": 18, "ether": 18, "gwei": 9, "wei": 0}
_AMOUNT = re.compile(r"\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[a-z]*)\s*", re.IGNORECASE)


def parse_wei(text: str | int) -> int:
    """``0.01``, ``0.01eth``, ``10gwei`` or ``1000wei`` -> wei; negative amounts and fractions of a wei are refused.

    An int is already wei (an option's default) and passes unchanged."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"{text} wei: an amount cannot be negative")
        return text
    match = _AMOUNT.fullmatch(str(text))
    unit = (match.group("unit") or "eth").lower() if match else ""
    if match is None or unit not in UNIT_DECIMALS:
        raise ValueError(f"{text!r} is not an amount: use a number of ETH (0.01), or add a unit "
                         f"(0.01eth, 10gwei, 1000wei)")
    try:
        wei = Decimal(match.group("number")).scaleb(UNIT_DECIMALS[unit])
    except InvalidOperation as exc:  # pragma: no cover - the pattern admits only decimal digits
        raise ValueError(f"{text!r} is not a number") from exc
    if wei != wei.to_integral_value():
        limit = f"at most {UNIT_DECIMALS[unit]} decimals in {unit}" if UNIT_DECIMALS[unit] else "no decimals in wei"
        raise ValueError(f"{text!r} is a fraction of a wei: {limit}")
    return int(wei)


def format_eth(wei: int) -> str:
    """Exact ETH for a wei amount (integer division: a float misstates large or tiny amounts)."""
    sign = "-" if wei < 0 else ""
    whole, frac = divmod(abs(wei), WEI_PER_ETH)
    return sign + f"{whole}.{frac:018d}".rstrip("0").rstrip(".")


def parse_ipfs_api(text: str) -> str:
    """A Kubo RPC endpoint -> its base URL: kubo's multiaddr (``/ip4/127.0.0.1/tcp/5001``,
    ``/dns4/ipfs.example/tcp/443/https``) or an ``http(s)://`` URL. The SDK's parser, so a
    config file, a variable and a flag accept the same spellings."""
    try:
        return parse_api_address(str(text).strip())
    except ConfigError as exc:
        raise ValueError(str(exc)) from exc


def parse_rpc_url(text: str) -> str:
    """A JSON-RPC endpoint: an ``http(s)://`` URL, or ``HOST:PORT`` meaning plain http."""
    return _http_url(str(text).strip(), what="a JSON-RPC")


def parse_broker(text: str) -> str:
    """``mqtt://HOST:PORT``, ``mqtts://HOST:PORT`` or ``HOST[:PORT]`` -> ``mqtt[s]://HOST:PORT``."""
    host, port, tls = broker_parts(text)
    host = f"[{host}]" if ":" in host else host
    return f"{'mqtts' if tls else 'mqtt'}://{host}:{port}"


def broker_parts(text: str) -> tuple[str, int, bool]:
    """A broker address -> (host, port, tls), by the SDK's parser; the port defaults to 1883 (8883 with mqtts)."""
    try:
        return parse_broker_address(str(text).strip())
    except ConfigError as exc:
        raise ValueError(str(exc)) from exc


def _http_url(text: str, *, what: str) -> str:
    url = urlsplit(text if "://" in text else f"http://{text}")
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"{text!r} is not {what} endpoint: use http://HOST:PORT")
    try:
        url.port  # noqa: B018 - raises on a port outside 0-65535
    except ValueError as exc:
        raise ValueError(f"{text!r}: the port must be 1-65535") from exc
    return url.geturl().rstrip("/")
