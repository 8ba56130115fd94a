"""pytest fixtures for a real MQTT broker (mosquitto) on 127.0.0.1.

Mosquitto is required, not optional: CI installs the Debian package, and a missing
binary fails these fixtures loudly instead of skipping the MQTT tests.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aitbc_agent_sdk.devnet._mosquitto import start_mosquitto
from aitbc_agent_sdk.devnet._service import ServiceError, ServiceProcess, stop, tail, wait_for_port


def run_broker(data_dir: Path, port: int | None = None) -> ServiceProcess:
    """Start mosquitto (sync, for fixtures and restart tests) and wait until it listens."""
    service = start_mosquitto(data_dir, port=port)
    try:
        asyncio.run(wait_for_port(service, 15.0))
    except BaseException:
        stop(service)
        raise
    return service


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """One broker for the whole session; tests keep apart by topic prefix and client id."""
    service = run_broker(tmp_path_factory.mktemp("mosquitto"))
    yield service
    stop(service)


class RestartableBroker:
    """A broker of one test's own that it may stop and start again on the same port and data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.service: ServiceProcess | None = run_broker(data_dir)
        self.port = self.service.port

    def stop(self) -> None:
        if self.service is not None:
            stop(self.service)
            self.service = None

    async def start(self) -> ServiceProcess:
        assert self.service is None, "already running"
        self.service = start_mosquitto(self.data_dir, port=self.port)
        await wait_for_port(self.service, 15.0)
        return self.service


@pytest.fixture
def fresh_mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestartableBroker]:
    broker = RestartableBroker(tmp_path_factory.mktemp("mosquitto-fresh"))
    yield broker
    broker.stop()


def _wait_listening(service: ServiceProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service.alive():
            raise ServiceError(f"mosquitto exited during start-up:\n{tail(service.log)}")
        try:
            socket.create_connection((service.host, service.port), timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.05)
    raise ServiceError(f"mosquitto did not listen within {timeout:.0f}s:\n{tail(service.log)}")


class SecuredBroker:
    """Mosquitto configured as ``devnet up`` configures it: password file, ACL, size limit, maybe TLS.

    ``usernames`` get broker accounts (as the devnet's wallets do) before it starts;
    ``settings(...)`` is the BusSettings a devnet profile would carry.
    """

    def __init__(self, root: Path, usernames: tuple[str, ...] = (), *, tls: bool = False,
                 max_message_bytes: int = 64 * 1024) -> None:
        from aitbc_agent_sdk.devnet._broker_auth import BrokerAccounts
        from aitbc_agent_sdk.devnet._mosquitto import BrokerSecurity
        from aitbc_agent_sdk.devnet._tls import make_broker_tls

        self.auth = BrokerAccounts(root / "broker-auth")
        self.auth.ensure(usernames)
        self.tls = make_broker_tls(root / "broker-auth" / "tls", "127.0.0.1") if tls else None
        self.max_message_bytes = max_message_bytes
        self.security = BrokerSecurity(password_file=self.auth.password_file, acl_file=self.auth.acl_file,
                                       max_message_bytes=max_message_bytes, tls=self.tls)
        self.service = start_mosquitto(root / "broker", security=self.security)
        try:
            _wait_listening(self.service, 15.0)  # sync: tests call this from inside their event loop
        except BaseException:
            stop(self.service)
            raise
        self.port = self.service.port

    def settings(self, **changes: object):
        from aitbc_agent_sdk.profile import BusSettings

        base = {"port": self.port, "accounts_dir": self.auth.accounts_dir, "max_message_bytes": self.max_message_bytes}
        if self.tls is not None:
            base.update(tls=True, ca_pem=self.tls.ca_pem())
        return BusSettings(**{**base, **changes})


@pytest.fixture
def secured_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., SecuredBroker]]:
    """``secured_broker(usernames, tls=...)`` starts one; all are stopped after the test."""
    started: list[SecuredBroker] = []

    def start(usernames: tuple[str, ...] = (), **options: Any) -> SecuredBroker:
        started.append(SecuredBroker(tmp_path_factory.mktemp("mosquitto-secured"), tuple(usernames), **options))
        return started[-1]

    yield start
    for broker in started:
        stop(broker.service)
