"""The devnet's MQTT broker: mosquitto when installed, the pure-Python amqtt broker otherwise.

Both listen on 127.0.0.1 only, or on the one local address given as ``host``. Mosquitto keeps its state under ``data_dir`` (persistence
on), so persistent sessions and the QoS 1 messages queued for offline agents survive a
broker restart; amqtt keeps sessions in memory only, which is enough for a fallback.
"""

from __future__ import annotations

import os
import pwd
import shutil
import sys
from pathlib import Path

from .service import LOCALHOST, ServiceError, ServiceProcess, check_bind_host, free_port, spawn, wait_for_port

_DEBIAN_PATH = Path("/usr/sbin/mosquitto")  # Debian installs it outside a normal user's PATH

# Offline agents' queues must not drop jobs: mosquitto's default caps each at 1000 messages.
_MAX_QUEUED_MESSAGES = 100_000


def mosquitto_path() -> Path:
    found = shutil.which("mosquitto")
    if found:
        return Path(found)
    if _DEBIAN_PATH.exists():
        return _DEBIAN_PATH
    raise ServiceError("mosquitto not found: install Debian package mosquitto (apt-get install mosquitto)")


def mosquitto_config(data_dir: Path, *, host: str, port: int) -> str:
    return "\n".join([
        "per_listener_settings false",
        # Started as root, mosquitto switches to user "mosquitto", which cannot write data_dir.
        f"user {pwd.getpwuid(os.getuid()).pw_name}",
        f"listener {port} {host}",
        "allow_anonymous true",
        "persistence true",
        f"persistence_location {data_dir / 'persistence'}/",
        "autosave_interval 10",  # a crash loses at most ~10 s of session state
        f"max_queued_messages {_MAX_QUEUED_MESSAGES}",
        "max_queued_bytes 0",
        "set_tcp_nodelay true",  # small request/reply messages: latency matters more than packet count
        "log_dest stdout",
        "log_type error",
        "log_type warning",
        "log_type notice",
        "",
    ])


def start_mosquitto(data_dir: Path, *, host: str = LOCALHOST, port: int | None = None) -> ServiceProcess:
    """Spawn mosquitto with its config, persistence and log under ``data_dir``; does not wait."""
    binary = mosquitto_path()
    host = check_bind_host(host)
    port = port or free_port(host)
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "persistence").mkdir(exist_ok=True)
    config = data_dir / "mosquitto.conf"
    config.write_text(mosquitto_config(data_dir, host=host, port=port))
    return spawn("mosquitto", [str(binary), "-c", str(config)], port=port, host=host,
                 log=data_dir / "mosquitto.log", cwd=data_dir)


def start_amqtt(data_dir: Path, *, host: str = LOCALHOST, port: int | None = None) -> ServiceProcess:
    """Spawn the amqtt broker (``amqtt_broker`` runner) in its own process; does not wait."""
    host = check_bind_host(host)
    port = port or free_port(host)
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "aitbc_agent_sdk.devnet.amqtt_broker", "--host", host, "--port", str(port)]
    return spawn("amqtt", argv, port=port, host=host, log=data_dir / "amqtt.log", cwd=data_dir)


def has_mosquitto() -> bool:
    try:
        mosquitto_path()
    except ServiceError:
        return False
    return True


async def start_broker(data_dir: Path, *, host: str = LOCALHOST, port: int | None = None,
                       timeout: float = 30.0) -> ServiceProcess:
    """Start mosquitto and wait until it accepts connections."""
    service = start_mosquitto(data_dir, host=host, port=port)
    await wait_for_port(service, timeout)
    return service


async def start_best_broker(data_dir: Path, *, host: str = LOCALHOST, port: int | None = None,
                            timeout: float = 30.0) -> ServiceProcess:
    """Mosquitto when installed, the embedded amqtt broker otherwise; waits until it listens."""
    if has_mosquitto():
        service = start_mosquitto(data_dir, host=host, port=port)
    else:
        service = start_amqtt(data_dir, host=host, port=port)
    await wait_for_port(service, timeout)
    return service
