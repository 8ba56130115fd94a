"""ECIES over secp256k1: wrap a 32-byte training key for one provider's Ethereum key.

The coordinator learns a provider's public key from the signature on its offer (EIP-191, as
every envelope is signed), checks that it belongs to the claimed address, and wraps the
training key for it::

    wrapped = version 1 | ephemeral public key (33, compressed) | AES-256-GCM(kek, key) (32 + 16)
    kek     = HKDF-SHA256(x of ephemeral secret * recipient point,
                          info = label | ephemeral pub (65) | recipient pub (65) | caller's info)

The caller's ``info`` names what the key is for (chain id, training id, provider address), so
a wrapped key cannot be moved to another training or provider. Each wrap draws a fresh
ephemeral key, so each kek seals exactly one message and a fixed GCM nonce is safe.

Hostile input (a wrapped key, a signature, a public key from the network) raises
DecryptionError or SignatureError; a caller's own malformed argument raises ValueError.
"""

from __future__ import annotations

import coincurve
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from eth_account.messages import SignableMessage
from eth_keys import keys
from eth_utils import keccak

from ..errors import DecryptionError, SignatureError

WRAP_VERSION = 1
KEY_SIZE = 32
WRAPPED_KEY_SIZE = 1 + 33 + KEY_SIZE + 16
MAX_INFO_BYTES = 1024
_LABEL = b"aitbc-keywrap-v1\x00"
_NONCE = bytes(12)  # one message per kek (fresh ephemeral key per wrap): a fixed nonce never repeats under a key


def _parse_public_key(raw: bytes) -> coincurve.PublicKey:
    """A secp256k1 point from 65-byte SEC1 uncompressed, 64-byte Ethereum style or 33-byte compressed bytes."""
    if not isinstance(raw, (bytes, bytearray)):
        raise ValueError("a public key is bytes")
    raw = bytes(raw)
    if len(raw) == 64:
        raw = b"\x04" + raw
    if len(raw) not in (33, 65):
        raise ValueError(f"a secp256k1 public key is 33, 64 or 65 bytes, not {len(raw)}")
    try:
        return coincurve.PublicKey(raw)
    except Exception as exc:  # coincurve raises ValueError or its own types for a point off the curve
        raise ValueError("not a point on secp256k1") from exc


def _private_key(raw: bytes) -> coincurve.PrivateKey:
    if not isinstance(raw, (bytes, bytearray)) or len(raw) != 32:
        raise ValueError("a private key is 32 bytes")
    try:
        return coincurve.PrivateKey(bytes(raw))
    except Exception as exc:  # zero, or not below the group order
        raise ValueError("not a valid secp256k1 private key") from exc


def _check_info(info: bytes) -> None:
    if not isinstance(info, (bytes, bytearray)) or len(info) > MAX_INFO_BYTES:
        raise ValueError(f"info must be bytes, at most {MAX_INFO_BYTES}")


def _kek(shared: coincurve.PublicKey, ephemeral: coincurve.PublicKey, recipient: coincurve.PublicKey,
         info: bytes) -> bytes:
    shared_x = shared.format(compressed=True)[1:]
    context = _LABEL + ephemeral.format(compressed=False) + recipient.format(compressed=False) + bytes(info)
    return HKDF(SHA256(), KEY_SIZE, salt=None, info=context).derive(shared_x)


def wrap_key(key: bytes, recipient_public_key: bytes, *, info: bytes) -> bytes:
    """Encrypt ``key`` (32 bytes) so that only the holder of ``recipient_public_key``'s private key opens it."""
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_SIZE:
        raise ValueError(f"the key to wrap is {KEY_SIZE} bytes")
    _check_info(info)
    recipient = _parse_public_key(recipient_public_key)
    ephemeral = coincurve.PrivateKey()  # from os.urandom
    shared = recipient.multiply(ephemeral.secret)
    kek = _kek(shared, ephemeral.public_key, recipient, info)
    head = bytes([WRAP_VERSION]) + ephemeral.public_key.format(compressed=True)
    return head + AESGCM(kek).encrypt(_NONCE, bytes(key), head)


def unwrap_key(wrapped: bytes, private_key: bytes, *, info: bytes) -> bytes:
    """The key ``wrap_key`` sealed for this private key and ``info``; DecryptionError otherwise."""
    _check_info(info)
    secret = _private_key(private_key)
    if not isinstance(wrapped, (bytes, bytearray)) or len(wrapped) != WRAPPED_KEY_SIZE:
        size = len(wrapped) if isinstance(wrapped, (bytes, bytearray)) else type(wrapped).__name__
        raise DecryptionError(f"a wrapped key is {WRAPPED_KEY_SIZE} bytes, not {size}")
    wrapped = bytes(wrapped)
    if wrapped[0] != WRAP_VERSION:
        raise DecryptionError(f"unsupported wrapped key version {wrapped[0]}")
    head = wrapped[:34]
    try:
        ephemeral = coincurve.PublicKey(head[1:])
    except Exception as exc:
        raise DecryptionError("wrapped key: the ephemeral key is not a point on secp256k1") from exc
    shared = ephemeral.multiply(secret.secret)
    kek = _kek(shared, ephemeral, secret.public_key, info)
    try:
        return AESGCM(kek).decrypt(_NONCE, wrapped[34:], head)
    except InvalidTag as exc:
        raise DecryptionError("wrapped key does not open: not for this key or info, or tampered") from exc


def public_key_of(private_key: bytes) -> bytes:
    """The 65-byte uncompressed public key of a 32-byte Ethereum private key."""
    return _private_key(private_key).public_key.format(compressed=False)


def address_of(public_key: bytes) -> str:
    """The checksummed Ethereum address of a public key (33, 64 or 65 bytes)."""
    point = _parse_public_key(public_key).format(compressed=False)[1:]
    return keys.PublicKey(point).to_checksum_address()


def _signed_hash(message: SignableMessage | bytes) -> bytes:
    if isinstance(message, SignableMessage):  # EIP-191: 0x19 | version | header | body, keccak'ed
        return keccak(b"\x19" + message.version + message.header + message.body)
    if isinstance(message, (bytes, bytearray)) and len(message) == 32:
        return bytes(message)
    raise ValueError("sign a SignableMessage or its 32-byte hash")


def _signature_bytes(signature: bytes | str) -> bytes:
    if isinstance(signature, str):
        try:
            signature = bytes.fromhex(signature.removeprefix("0x"))
        except ValueError as exc:
            raise SignatureError("signature is not hex") from exc
    if not isinstance(signature, (bytes, bytearray)) or len(signature) != 65:
        raise SignatureError("a signature is 65 bytes (r, s, v)")
    v = signature[64]
    recovery_id = v - 27 if v in (27, 28) else v
    if recovery_id not in (0, 1):
        raise SignatureError(f"signature has an invalid v ({v})")
    return bytes(signature[:64]) + bytes([recovery_id])


def recover_public_key(message: SignableMessage | bytes, signature: bytes | str) -> bytes:
    """The 65-byte public key that made ``signature`` (r|s|v, bytes or hex) over an EIP-191 message or hash."""
    digest = _signed_hash(message)
    try:
        point = coincurve.PublicKey.from_signature_and_message(_signature_bytes(signature), digest, hasher=None)
    except SignatureError:
        raise
    except Exception as exc:  # r or s out of range, or no point recovers
        raise SignatureError("signature does not recover a public key") from exc
    return point.format(compressed=False)


def signer_public_key(message: SignableMessage | bytes, signature: bytes | str, address: str) -> bytes:
    """``recover_public_key``, checked to belong to ``address`` (SignatureError if it does not)."""
    public_key = recover_public_key(message, signature)
    signer = address_of(public_key)
    if signer.lower() != str(address).lower():
        raise SignatureError(f"signed by {signer}, claims {address}")
    return public_key


def data_key_info(training: bytes, worker: str) -> bytes:
    """What a wrapped dataset key is bound to: it opens for this worker in this training only.

    ``training`` is the escrow's key of the training (``training_key``), which names its coordinator:
    another coordinator's training of the same id string cannot make the worker open it.
    """
    return b"aitbc-data-key/2|" + training + f"|{worker.lower()}".encode()
