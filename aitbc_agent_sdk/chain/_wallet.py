"""Password-protected wallets stored as Ethereum keystore v3 files, one per name.

``<root>/<name>.json`` holds the encrypted key; files are written atomically with mode
0600 and never overwritten. Key derivation (scrypt by default) is deliberately slow, so
every method runs it in a worker thread.

For tests and throwaway dev wallets pass ``kdf="pbkdf2", iterations=1024``: unlocking
then takes milliseconds instead of a second, at the cost of weak protection at rest.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any, Literal

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress
from eth_utils import to_checksum_address
from pydantic import BaseModel, ConfigDict

from aitbc_agent_sdk.errors import ConfigError

__all__ = ["Wallet", "WalletStore"]

Kdf = Literal["scrypt", "pbkdf2"]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class Wallet(BaseModel):
    """Where a wallet lives and which address it controls; never holds key material."""

    model_config = ConfigDict(frozen=True)

    name: str
    address: ChecksumAddress
    path: Path


class WalletStore:
    """Keystore v3 files under ``root``; methods are async because the KDF is blocking."""

    def __init__(self, root: Path, *, kdf: Kdf = "scrypt", iterations: int | None = None) -> None:
        if kdf not in ("scrypt", "pbkdf2"):
            raise ConfigError(f"unsupported kdf {kdf!r}; use 'scrypt' or 'pbkdf2'")
        self.root = Path(root)
        self._kdf = kdf
        self._iterations = iterations

    async def create(self, name: str, password: str) -> Wallet:
        """Generate a new random key and store it under ``name``."""
        return await self.import_key(name, "0x" + secrets.token_hex(32), password)

    async def import_key(self, name: str, private_key: str | bytes, password: str) -> Wallet:
        """Encrypt an existing private key under ``name``; refuses to overwrite."""
        path = self._path(name)
        if path.exists():
            raise ConfigError(f"wallet {name!r} already exists at {path}")
        try:
            account = Account.from_key(private_key)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"invalid private key for wallet {name!r}") from exc
        keystore = await asyncio.to_thread(
            Account.encrypt, account.key, password, kdf=self._kdf, iterations=self._iterations
        )
        await asyncio.to_thread(self._write_new, path, keystore)
        return Wallet(name=name, address=account.address, path=path)

    async def list(self) -> builtins.list[Wallet]:
        """All wallets, sorted by name."""
        return await asyncio.to_thread(self._list_sync)

    async def get(self, name: str) -> Wallet:
        path = self._path(name)
        keystore = await asyncio.to_thread(self._read, name, path)
        return Wallet(name=name, address=_address_of(keystore, path), path=path)

    async def unlock(self, name: str, password: str) -> LocalAccount:
        """Decrypt the wallet's key; ConfigError if it is missing or the password is wrong."""
        path = self._path(name)
        keystore = await asyncio.to_thread(self._read, name, path)
        try:
            key = await asyncio.to_thread(Account.decrypt, keystore, password)
        except ValueError as exc:  # eth-keyfile says "MAC mismatch" for a wrong password
            raise ConfigError(f"wrong password for wallet {name!r}") from exc
        return Account.from_key(key)

    # --- blocking helpers (run in threads) ----------------------------------------------

    def _path(self, name: str) -> Path:
        if not _NAME.match(name):
            raise ConfigError(
                f"invalid wallet name {name!r}: use 1-64 letters, digits, '.', '_' or '-'"
            )
        return self.root / f"{name}.json"

    def _read(self, name: str, path: Path) -> dict[str, Any]:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"no wallet named {name!r} in {self.root}") from exc
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"wallet file {path} is unreadable: {exc}") from exc

    def _write_new(self, path: Path, keystore: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.root / f".{path.name}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(keystore, fh)
                fh.flush()
                os.fsync(fh.fileno())
            # link() fails if the name exists, so two concurrent creates cannot clobber each other.
            try:
                os.link(tmp, path)
            except FileExistsError as exc:
                raise ConfigError(f"wallet {path.stem!r} already exists at {path}") from exc
        finally:
            tmp.unlink(missing_ok=True)

    def _list_sync(self) -> builtins.list[Wallet]:
        if not self.root.is_dir():
            return []
        wallets = []
        for path in sorted(self.root.glob("*.json")):
            if not _NAME.match(path.stem):
                continue
            wallets.append(
                Wallet(name=path.stem, address=_address_of(self._read(path.stem, path), path), path=path)
            )
        return wallets


def _address_of(keystore: dict[str, Any], path: Path) -> ChecksumAddress:
    try:
        return to_checksum_address(keystore["address"])
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError(f"wallet file {path} has no valid address") from exc
