"""The devnet broker's accounts and access list: who may log in, and who may publish where.

- **Accounts.** One per wallet the devnet knows (username = the address exactly as topics
  spell it, so the ACL's ``%u`` names the wallet's own topics), plus ``observer`` for
  processes without an account of their own. Each password is random, kept 0600 in
  ``accounts/<username>`` (what clients read) and hashed in mosquitto's password file
  (PBKDF2-SHA512, mosquitto's ``$7$`` format, written here so no password is ever on argv).
- **Access.** Every account reads ``aitbc/v1/#``: messages are signed, not secret. Only a
  provider publishes on its offer and heartbeat topics, so nobody else can forge, replace or
  clear (empty retained publish) its offer. Topics addressed to a party (jobs, proposals,
  replies, results, progress, pings) are written by the other side of the exchange, which
  may be anyone on the market: those rights are shared, and the signed envelope and its
  replay check decide what counts. Anonymous clients are refused.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import signal
from collections.abc import Iterable
from pathlib import Path

from ..errors import ConfigError
from ..messaging._settings import OBSERVER_ACCOUNT, account_file
from ..messaging._topics import PREFIX

_ITERATIONS = 1000  # the passwords are 32 random bytes: the KDF only has to be mosquitto's

# Rights of every account: topics addressed to a party, written by the other side.
_SHARED_WRITE = ("negotiate/+", "jobs/+", "cancel/+", "ping/+", "resend/+", "challenge/+", "hwcheck/+",  # to a provider
                 "receipts/+", "verify/+",
                 "negotiate-reply/+/+", "pong/+/+", "progress/+/+", "results/+", "openings/+",  # to a coordinator
                 "hwcheck-reply/+/+", "verified/+",
                 "cluster/#")  # trusted clusters: their own signed protocol, hosts listed in the spec
_OWN_WRITE = ("offers/{}", "heartbeat/{}")  # only the provider whose address is the username


def acl_text(usernames: Iterable[str]) -> str:
    """One block per account (explicit, rather than patterns: mosquitto applies those to everyone)."""
    lines = ["# written by aitbc devnet up: see aitbc_agent_sdk/devnet/_broker_auth.py"]
    for name in sorted(usernames):
        lines += ["", f"user {name}", f"topic read {PREFIX}/#"]
        if name != OBSERVER_ACCOUNT:
            lines += [f"topic write {PREFIX}/{topic.format(name)}" for topic in _OWN_WRITE]
        lines += [f"topic write {PREFIX}/{topic}" for topic in _SHARED_WRITE]
    return "\n".join(lines) + "\n"


def password_hash(password: str, *, salt: bytes | None = None, iterations: int = _ITERATIONS) -> str:
    """One mosquitto 2.x password-file hash: ``$7$<iterations>$<salt b64>$<pbkdf2-sha512 b64>``."""
    salt = salt or os.urandom(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, path)


class BrokerAccounts:
    """The account directory (clients' side) and the password file and ACL (mosquitto's side)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.accounts_dir = root / "accounts"
        self.password_file = root / "passwd"
        self.acl_file = root / "acl"

    def ensure(self, usernames: Iterable[str]) -> None:
        """Create the missing accounts (and ``observer``), then rewrite the password file and ACL."""
        self.accounts_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name in {OBSERVER_ACCOUNT, *usernames}:
            path = account_file(self.accounts_dir, name)
            if not path.is_file():
                _write_private(path, secrets.token_urlsafe(32) + "\n")
        self._write_broker_files()

    def _write_broker_files(self) -> None:
        names = sorted(p.name for p in self.accounts_dir.iterdir() if p.is_file() and not p.name.endswith(".tmp"))
        entries = [f"{name}:{password_hash(self.password(name))}" for name in names]
        _write_private(self.password_file, "\n".join(entries) + "\n")
        _write_private(self.acl_file, acl_text(names))

    def password(self, username: str) -> str:
        path = account_file(self.accounts_dir, username)
        if not path.is_file():
            raise ConfigError(f"no broker account {username!r} in {self.accounts_dir}")
        return path.read_text().strip()


def reload_broker(pid: int) -> None:
    """Mosquitto re-reads its password file and ACL on SIGHUP (connected clients stay)."""
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError as exc:
        raise ConfigError(f"the devnet broker (pid {pid}) is not running") from exc
