"""The devnet's MQTT broker: mosquitto when installed, the pure-Python amqtt broker otherwise.

Both listen on 127.0.0.1 only, or on the one local address given as ``host``. Mosquitto keeps its state under ``data_dir`` (persistence
on), so persistent sessions and the QoS 1 messages queued for offline agents survive a
broker restart; amqtt keeps sessions in memory only, which is enough for a fallback.

The devnet passes ``BrokerSecurity``: no anonymous clients, a password file and an ACL
(devnet/_broker_auth.py), a message size limit, and TLS when it listens beyond loopback.
Without it (the test fixtures' own brokers) mosquitto is open to anonymous clients.
"""

from __future__ import annotations

import os
import pwd
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from ._service import LOCALHOST, ServiceError, ServiceProcess, check_bind_host, free_port, spawn, wait_for_port
from ._tls import TlsFiles

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


@dataclass(frozen=True)
class BrokerSecurity:
    password_file: Path
    acl_file: Path
    max_message_bytes: int
    tls: TlsFiles | None = None


def _security_lines(security: BrokerSecurity | None) -> list[str]:
    if security is None:
        return ["allow_anonymous true"]
    lines = ["allow_anonymous false", f"password_file {security.password_file}", f"acl_file {security.acl_file}",
             f"message_size_limit {security.max_message_bytes}",
             # Whole packets too (topic and header included): a bigger one disconnects its sender.
             f"max_packet_size {security.max_message_bytes + 65_536}"]
    if security.tls is not None:
        lines += [f"cafile {security.tls.ca_cert}", f"certfile {security.tls.cert}", f"keyfile {security.tls.key}",
                  "tls_version tlsv1.2"]
    return lines


def mosquitto_config(data_dir: Path, *, host: str, port: int, security: BrokerSecurity | None = None) -> str:
    return "\n".join([
        "per_listener_settings false",
        # Started as root, mosquitto switches to user "mosquitto", which cannot write data_dir.
        f"user {pwd.getpwuid(os.getuid()).pw_name}",
        f"listener {port} {host}",
        *_security_lines(security),
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


def start_mosquitto(data_dir: Path, *, host: str = LOCALHOST, port: int | None = None,
                    security: BrokerSecurity | None = None) -> ServiceProcess:
    """Spawn mosquitto with its config, persistence and log under ``data_dir``; does not wait."""
    binary = mosquitto_path()
    host = check_bind_host(host)
    port = port or free_port(host)
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "persistence").mkdir(exist_ok=True)
    config = data_dir / "mosquitto.conf"
    config.write_text(mosquitto_config(data_dir, host=host, port=port, security=security))
    log = data_dir / "mosquitto.log"
    if security is not None:  # it names session ids, which only their owners should know
        log.touch(mode=0o600)
        log.chmod(0o600)
    return spawn("mosquitto", [str(binary), "-c", str(config)], port=port, host=host, log=log, cwd=data_dir)


def restart_mosquitto(old: ServiceProcess) -> ServiceProcess:
    """Start mosquitto again with the config (accounts, ACL, TLS) ``old`` ran with; does not wait."""
    data_dir = old.log.parent
    config = data_dir / "mosquitto.conf"
    if not config.is_file():
        raise ServiceError(f"no mosquitto config in {data_dir}")
    return spawn("mosquitto", [str(mosquitto_path()), "-c", str(config)], port=old.port, host=old.host,
                 log=old.log, cwd=data_dir)


def start_amqtt(data_dir: Path, *, host: str = LOCALHOST, port: int | None = None) -> ServiceProcess:
    """Spawn the amqtt broker (``amqtt_broker`` runner) in its own process; does not wait."""
    host = check_bind_host(host)
    port = port or free_port(host)
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "aitbc_agent_sdk.devnet._amqtt_broker", "--host", host, "--port", str(port)]
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
                            timeout: float = 30.0, security: BrokerSecurity | None = None) -> ServiceProcess:
    """Mosquitto when installed, the embedded amqtt broker otherwise; waits until it listens.

    The amqtt fallback has no password file, ACL or TLS: it refuses ``security`` rather than
    silently running an open broker.
    """
    if has_mosquitto():
        service = start_mosquitto(data_dir, host=host, port=port, security=security)
    elif security is not None:
        raise ServiceError("a secured devnet broker needs mosquitto (apt-get install mosquitto)")
    else:
        service = start_amqtt(data_dir, host=host, port=port)
    await wait_for_port(service, timeout)
    return service
