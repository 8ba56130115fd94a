"""Where the broker is and how to prove who we are to it: ``BusSettings`` and its credentials.

Secrets never travel on a command line. A password comes from the environment
(``AITBC_MQTT_USERNAME`` with ``AITBC_MQTT_PASSWORD`` or ``AITBC_MQTT_PASSWORD_FILE``), from a
file named by the profile, or from the devnet's account directory: one 0600 file per broker
account, named by its username (a wallet's address, exactly as it appears in topics).

Client ids name persistent sessions, and a broker hands a session (and the messages queued
for it) to whoever connects with its id. So an authenticated session's id carries a tag
derived from the account's password: a stranger can neither guess it nor compute it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import ConfigError
from ._replay import MemorySeen, SeenStore, SqliteSeen

if TYPE_CHECKING:
    from ._mqtt import MqttBus

DEFAULT_MAX_MESSAGE_BYTES = 1 << 20  # 1 MiB: envelopes carry CIDs and records, never tensors
DEFAULT_CLOCK_SKEW_S = 120.0
OBSERVER_ACCOUNT = "observer"  # the devnet's account for processes without a wallet account of their own
ENV_USERNAME, ENV_PASSWORD, ENV_PASSWORD_FILE = "AITBC_MQTT_USERNAME", "AITBC_MQTT_PASSWORD", "AITBC_MQTT_PASSWORD_FILE"
_USERNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # never '+', '#' or '/': they would widen ACL patterns


class BusSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["mqtt"] = "mqtt"
    host: str = "127.0.0.1"
    port: int = Field(default=1883, ge=1, le=65535)
    tls: bool = Field(default=False, description="connect with TLS, verifying the broker's certificate")
    ca_file: Path | None = Field(default=None, description="CA bundle that signed the broker's certificate (tls)")
    ca_pem: str | None = Field(default=None, description="the same, inline (the devnet's generated CA is public)")
    cert_file: Path | None = Field(default=None, description="client certificate, for brokers that require one")
    key_file: Path | None = Field(default=None, description="the client certificate's private key")
    username: str | None = Field(default=None, description="a fixed broker account; None picks the wallet's own")
    password_file: Path | None = Field(default=None, description="file holding that account's password (0600)")
    accounts_dir: Path | None = Field(default=None, description="one password file per account, named by username")
    max_message_bytes: int = Field(default=DEFAULT_MAX_MESSAGE_BYTES, ge=1024, le=256 << 20,
                                   description="larger payloads are refused on publish and dropped on receipt")
    clock_skew_s: float = Field(default=DEFAULT_CLOCK_SKEW_S, gt=0, le=3600,
                                description="how old (by its sender's clock) a signed message may be; nonces are"
                                            " remembered, across restarts, for as long")

    @model_validator(mode="after")
    def _consistent(self) -> BusSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs both cert_file and key_file")
        if not self.tls and (self.ca_file or self.ca_pem or self.cert_file):
            raise ValueError("ca_file, ca_pem and cert_file need tls=true")
        if self.username is not None and not _USERNAME.match(self.username):
            raise ValueError(f"invalid broker username {self.username!r}")
        return self


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = ""

    def __repr__(self) -> str:  # never print the password
        return f"Credentials(username={self.username!r})"


def _read_secret(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the broker password file {path}: {exc.strerror}") from exc


def account_file(accounts_dir: Path, username: str) -> Path:
    if not _USERNAME.match(username):
        raise ConfigError(f"invalid broker username {username!r}")
    return accounts_dir / username


def resolve_credentials(settings: BusSettings, identity: str | None = None,
                        env: Mapping[str, str] | None = None) -> Credentials | None:
    """The account to log in with: environment, then the profile's fixed account, then the
    wallet's own account (``identity``), then the devnet's observer account; None: anonymous."""
    env = os.environ if env is None else env
    if user := env.get(ENV_USERNAME):
        if password := env.get(ENV_PASSWORD):
            return Credentials(user, password)
        if path := env.get(ENV_PASSWORD_FILE):
            return Credentials(user, _read_secret(Path(path)))
        raise ConfigError(f"{ENV_USERNAME} is set but neither {ENV_PASSWORD} nor {ENV_PASSWORD_FILE}")
    if settings.username:
        return Credentials(settings.username, _read_secret(settings.password_file) if settings.password_file else "")
    if settings.accounts_dir is not None:
        for name in (identity, OBSERVER_ACCOUNT):
            if name and account_file(settings.accounts_dir, name).is_file():
                return Credentials(name, _read_secret(account_file(settings.accounts_dir, name)))
    return None


def session_id(session: str, credentials: Credentials | None) -> str:
    """The client id for ``session``: stable (so the session persists) and, when logged in,
    tagged with an HMAC of the password, so nobody without it can take the session over."""
    if credentials is None or not credentials.password:
        return session
    tag = hmac.new(credentials.password.encode(), f"aitbc-mqtt-session:{session}".encode(), hashlib.sha256)
    return f"{session}-{tag.hexdigest()[:20]}"


def seen_store_path(home: Path) -> Path:
    """Where persistent sessions keep the (sender, nonce) pairs they have accepted."""
    return home / "bus" / "seen.sqlite"


def tls_context(settings: BusSettings) -> ssl.SSLContext | None:
    """Verify the broker against the given CA (else the system's), with its host name or IP checked."""
    if not settings.tls:
        return None
    try:
        context = ssl.create_default_context(cafile=str(settings.ca_file) if settings.ca_file else None,
                                             cadata=settings.ca_pem)
        if settings.cert_file is not None and settings.key_file is not None:
            context.load_cert_chain(str(settings.cert_file), str(settings.key_file))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the broker's TLS settings: {exc}") from exc
    return context


def connect_bus(settings: BusSettings, session: str, *, identity: str | None = None, persistent: bool = True,
                home: Path | None = None, **options: Any) -> MqttBus:
    """An ``MqttBus`` (use it with ``async with``) for ``session``, logged in as ``identity``'s account.

    With ``home`` (and ``persistent``), the session's verifiers keep the nonces they accept in
    ``$AITBC_HOME/bus/seen.sqlite``, so after a restart the same session still refuses a replay.
    ``options`` go to MqttBus (timeout, queue_size, reconnect, ...).
    """
    from ._envelope import EnvelopeVerifier  # eth-account: not for the CLI's --help
    from ._mqtt import MqttBus  # aiomqtt is only needed off the embedded stack

    credentials = resolve_credentials(settings, identity)
    seen_path = seen_store_path(home) if home is not None and persistent else None

    def verifier(address: str) -> EnvelopeVerifier:
        seen: SeenStore = SqliteSeen(seen_path, f"{session}:{address}") if seen_path else MemorySeen()
        return EnvelopeVerifier(max_age_s=settings.clock_skew_s, max_future_s=min(5.0, settings.clock_skew_s),
                                seen=seen)

    return MqttBus(settings.host, settings.port, client_id=session_id(session, credentials), persistent=persistent,
                   username=credentials.username if credentials else None,
                   password=credentials.password if credentials else None, tls=tls_context(settings),
                   max_message_bytes=settings.max_message_bytes, verifier_factory=verifier, name=session, **options)
