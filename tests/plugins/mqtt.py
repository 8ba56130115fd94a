"""pytest fixtures for a real MQTT broker (mosquitto) on 127.0.0.1.

Mosquitto is required, not optional: CI installs the Debian package, and a missing
binary fails these fixtures loudly instead of skipping the MQTT tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from aitbc_agent_sdk.devnet.mosquitto import start_mosquitto
from aitbc_agent_sdk.devnet.service import ServiceProcess, stop, wait_for_port


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
