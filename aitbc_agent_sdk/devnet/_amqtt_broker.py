"""Runs the pure-Python amqtt broker, the devnet's fallback when mosquitto is not installed.

    python -m aitbc_agent_sdk.devnet._amqtt_broker --port 1883

amqtt binds 0.0.0.0 by default; this runner only ever binds a loopback address.
Sessions live in memory: they survive client reconnects, not a broker restart.

amqtt's own AnonymousAuthPlugin marks every session anonymous, and amqtt queues nothing
for an offline anonymous session, even with clean_session=False. ``LoopbackAuthPlugin``
lets every local client in without that mark, so persistent sessions work as on mosquitto.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import signal
from dataclasses import dataclass

from amqtt.broker import Broker
from amqtt.plugins.base import BaseAuthPlugin
from amqtt.session import Session


class LoopbackAuthPlugin(BaseAuthPlugin):
    """Accepts every client (the listener is loopback-only) without marking it anonymous."""

    @dataclass
    class Config:
        pass

    async def authenticate(self, *, session: Session) -> bool:
        return True


def broker_config(host: str, port: int) -> dict[str, object]:
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}"}},
        # Only the auth plugin: no $SYS publisher, no per-packet logging.
        "plugins": {"aitbc_agent_sdk.devnet._amqtt_broker.LoopbackAuthPlugin": {}},
    }


async def serve(host: str, port: int) -> None:
    broker = Broker(broker_config(host, port))
    await broker.start()
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    await stopped.wait()
    await broker.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description="amqtt broker bound to a loopback address")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    if not ipaddress.ip_address(args.host).is_loopback:
        parser.error(f"refusing to bind {args.host}: the devnet broker listens on loopback only")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
