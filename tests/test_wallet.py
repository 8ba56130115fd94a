"""Keystore-v3 wallets: create, import, list, unlock, and the errors around them."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from eth_account import Account

from aitbc_agent_sdk.chain import Wallet, WalletStore
from aitbc_agent_sdk.errors import ConfigError

KEY = "0x" + "11" * 32


@pytest.fixture
def store(tmp_path: Path) -> WalletStore:
    # pbkdf2 with few iterations keeps each unlock in the millisecond range.
    return WalletStore(tmp_path / "wallets", kdf="pbkdf2", iterations=1024)


async def test_create_list_unlock(store: WalletStore) -> None:
    alice = await store.create("alice", "pw-a")
    bob = await store.import_key("bob", KEY, "pw-b")
    assert isinstance(alice, Wallet)
    assert bob.address == Account.from_key(KEY).address
    assert [w.name for w in await store.list()] == ["alice", "bob"]
    assert await store.list() == [alice, bob]
    assert (await store.unlock("alice", "pw-a")).address == alice.address
    assert (await store.unlock("bob", "pw-b")).key.hex() == KEY[2:]
    assert await store.get("bob") == bob


async def test_wallet_file_is_private_keystore_v3(store: WalletStore) -> None:
    wallet = await store.create("alice", "pw")
    assert stat.S_IMODE(wallet.path.stat().st_mode) == 0o600
    assert wallet.path == store.root / "alice.json"
    text = wallet.path.read_text()
    assert '"version": 3' in text and '"kdf": "pbkdf2"' in text
    # No temp files are left behind by the atomic write.
    assert [p.name for p in store.root.iterdir()] == ["alice.json"]


async def test_wrong_password(store: WalletStore) -> None:
    await store.create("alice", "right")
    with pytest.raises(ConfigError, match="wrong password"):
        await store.unlock("alice", "wrong")


async def test_duplicate_and_missing_names(store: WalletStore) -> None:
    first = await store.create("alice", "pw")
    with pytest.raises(ConfigError, match="already exists"):
        await store.create("alice", "pw2")
    with pytest.raises(ConfigError, match="already exists"):
        await store.import_key("alice", KEY, "pw2")
    # The original key survives the failed overwrite.
    assert (await store.unlock("alice", "pw")).address == first.address
    with pytest.raises(ConfigError, match="no wallet named"):
        await store.unlock("carol", "pw")


async def test_bad_names_and_keys(store: WalletStore) -> None:
    for name in ("", "../escape", "a/b", ".hidden"):
        with pytest.raises(ConfigError, match="invalid wallet name"):
            await store.create(name, "pw")
    with pytest.raises(ConfigError, match="invalid private key"):
        await store.import_key("x", "0x1234", "pw")
    assert await store.list() == []


async def test_default_kdf_is_scrypt(tmp_path: Path) -> None:
    store = WalletStore(tmp_path)
    wallet = await store.create("slow", "pw")
    assert '"kdf": "scrypt"' in wallet.path.read_text()
    assert (await store.unlock("slow", "pw")).address == wallet.address
