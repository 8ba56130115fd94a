"""ECIES key wrapping (chain/_keywrap.py) and the provider public key learnt from a signed envelope."""

from __future__ import annotations

import json
import os

import pytest
from eth_account import Account
from eth_account.messages import encode_defunct

from aitbc_agent_sdk.chain._keywrap import (
    WRAPPED_KEY_SIZE,
    address_of,
    public_key_of,
    recover_public_key,
    signer_public_key,
    unwrap_key,
    wrap_key,
)
from aitbc_agent_sdk.chain._wallet import WalletStore
from aitbc_agent_sdk.errors import DecryptionError, SignatureError
from aitbc_agent_sdk.messaging import EnvelopeSigner
from aitbc_agent_sdk.messaging._envelope import Envelope
from aitbc_agent_sdk.records import Hardware, Offer

TRAINING_KEY = os.urandom(32)
INFO = b"chain=31337|training=t-1|provider=0xabc"


@pytest.fixture(scope="module")
def provider():
    return Account.create()


def test_the_hired_provider_unwraps_for_either_public_key_form(provider) -> None:
    public = public_key_of(provider.key)
    assert len(public) == 65 and address_of(public) == provider.address
    for form in (public, public[1:]):  # SEC1 uncompressed and 64-byte Ethereum style
        wrapped = wrap_key(TRAINING_KEY, form, info=INFO)
        assert len(wrapped) == WRAPPED_KEY_SIZE
        assert unwrap_key(wrapped, provider.key, info=INFO) == TRAINING_KEY
    assert wrap_key(TRAINING_KEY, public, info=INFO) != wrap_key(TRAINING_KEY, public, info=INFO)  # fresh ephemeral


def test_nobody_else_and_no_other_info_unwraps(provider) -> None:
    wrapped = wrap_key(TRAINING_KEY, public_key_of(provider.key), info=INFO)
    with pytest.raises(DecryptionError, match="does not open"):
        unwrap_key(wrapped, Account.create().key, info=INFO)
    with pytest.raises(DecryptionError, match="does not open"):
        unwrap_key(wrapped, provider.key, info=INFO.replace(b"t-1", b"t-2"))
    for position in range(len(wrapped)):
        broken = bytearray(wrapped)
        broken[position] ^= 1
        with pytest.raises(DecryptionError):
            unwrap_key(bytes(broken), provider.key, info=INFO)
    for hostile in (b"", wrapped[:-1], wrapped + b"\x00"):
        with pytest.raises(DecryptionError, match="bytes"):
            unwrap_key(hostile, provider.key, info=INFO)


def test_malformed_arguments_are_value_errors(provider) -> None:
    public = public_key_of(provider.key)
    with pytest.raises(ValueError, match="32 bytes"):
        wrap_key(b"short", public, info=INFO)
    with pytest.raises(ValueError, match="33, 64 or 65"):
        wrap_key(TRAINING_KEY, public[:40], info=INFO)
    with pytest.raises(ValueError, match="not a point"):
        wrap_key(TRAINING_KEY, b"\x04" + bytes(64), info=INFO)
    with pytest.raises(ValueError, match="private key"):
        unwrap_key(bytes(WRAPPED_KEY_SIZE), bytes(32), info=INFO)


async def test_the_key_recovered_from_a_signed_offer_is_the_wallets(tmp_path) -> None:
    store = WalletStore(tmp_path, kdf="pbkdf2", iterations=1024)
    await store.create("provider", "pw")
    account = await store.unlock("provider", "pw")
    offer = Offer(provider=account.address, price_wei=1,
                  hardware=Hardware(cpu_model="cpu", cpu_cores=1, ram_bytes=1))
    raw = EnvelopeSigner(account).seal("aitbc/v1/offers/x", offer, retain=True)
    envelope = Envelope.model_validate_json(raw)
    signable = encode_defunct(text=envelope.signing_text())
    public = signer_public_key(signable, envelope.signature, envelope.sender)
    assert public == public_key_of(account.key) == recover_public_key(signable, bytes.fromhex(envelope.signature))
    assert unwrap_key(wrap_key(TRAINING_KEY, public, info=INFO), account.key, info=INFO) == TRAINING_KEY

    with pytest.raises(SignatureError, match="claims"):  # a valid signature, another claimed address
        signer_public_key(signable, envelope.signature, Account.create().address)
    body = json.loads(raw)
    body["payload"]["price_wei"] = 2  # the coordinator would wrap for a key nobody holds
    changed = encode_defunct(text=Envelope.model_validate(body).signing_text())
    with pytest.raises(SignatureError, match="claims"):
        signer_public_key(changed, envelope.signature, envelope.sender)
    for hostile in ("zz", "00" * 64, envelope.signature[:-2] + "05", bytes(65)):
        with pytest.raises(SignatureError):
            recover_public_key(signable, hostile)
