"""Binary and string CIDs (v0 and v1, sha2-256 only) and the unsigned varints they are built from. Pure."""

from __future__ import annotations

import base64
import hashlib

import base58

from ..errors import StorageError

__all__ = [
    "DAG_PB", "RAW", "SHA2_256", "Buffer", "InvalidCidError", "cid_bytes", "cid_for_block", "cid_from_str",
    "cid_to_str", "decode_cid_bytes", "parse_cid", "read_uvarint", "uvarint",
]

DAG_PB = 0x70
RAW = 0x55
SHA2_256 = 0x12

_MH_PREFIX = b"\x12\x20"  # sha2-256, 32-byte digest
_SMALL_VARINTS = [bytes((i,)) for i in range(128)]

Buffer = bytes | bytearray | memoryview  # collections.abc.Buffer is 3.12+


class InvalidCidError(StorageError, ValueError):
    """A CID string or binary CID that cannot be parsed, or uses an unsupported hash."""


def uvarint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL_VARINTS[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_uvarint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Decode a varint at ``pos``; return (value, next position)."""
    if pos < len(buf) and buf[pos] < 0x80:  # the common one-byte case
        return buf[pos], pos + 1
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated or overlong varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def cid_bytes(version: int, codec: int, digest: bytes) -> bytes:
    """The binary CID (what dag-pb links hold)."""
    if version == 0:
        if codec != DAG_PB:
            raise InvalidCidError("CIDv0 can only name dag-pb blocks")
        return _MH_PREFIX + digest
    return b"\x01" + uvarint(codec) + _MH_PREFIX + digest


def decode_cid_bytes(raw: bytes | memoryview) -> tuple[int, int, bytes]:
    """Binary CID -> (version, codec, sha2-256 digest)."""
    raw = bytes(raw)
    try:
        if len(raw) == 34 and raw[:2] == _MH_PREFIX:
            return 0, DAG_PB, raw[2:]
        version, pos = read_uvarint(raw, 0)
        codec, pos = read_uvarint(raw, pos)
        mh_code, pos = read_uvarint(raw, pos)
        mh_len, pos = read_uvarint(raw, pos)
    except ValueError as exc:
        raise InvalidCidError(f"malformed binary CID {raw.hex()}") from exc
    if version != 1:
        raise InvalidCidError(f"unsupported CID version {version}")
    if mh_code != SHA2_256 or mh_len != 32 or len(raw) - pos != 32:
        raise InvalidCidError("only sha2-256 multihashes are supported")
    return 1, codec, raw[pos:]


def cid_to_str(raw: bytes) -> str:
    """Binary CID -> the string kubo prints (base58btc for v0, base32 lower for v1)."""
    if raw[:2] == _MH_PREFIX:
        return base58.b58encode(raw).decode("ascii")
    return "b" + base64.b32encode(raw).decode("ascii").lower().rstrip("=")


def cid_from_str(cid: str) -> bytes:
    """CID string -> binary CID. Accepts Qm… (v0) and multibase b/B (base32), z (base58btc), f (hex)."""
    try:
        if len(cid) == 46 and cid.startswith("Qm"):
            raw = base58.b58decode(cid)
        elif cid[:1] in ("b", "B"):
            body = cid[1:].upper()
            raw = base64.b32decode(body + "=" * (-len(body) % 8))
        elif cid[:1] == "z":
            raw = base58.b58decode(cid[1:])
        elif cid[:1] == "f":
            raw = bytes.fromhex(cid[1:])
        else:
            raise InvalidCidError(f"unsupported CID encoding: {cid!r}")
    except (ValueError, TypeError) as exc:  # binascii.Error is a ValueError
        raise InvalidCidError(f"malformed CID: {cid!r}") from exc
    decode_cid_bytes(raw)  # validates
    return raw


def parse_cid(cid: str) -> tuple[int, int, bytes]:
    """CID string -> (version, codec, sha2-256 digest)."""
    return decode_cid_bytes(cid_from_str(cid))


def cid_for_block(block: Buffer, codec: int = DAG_PB, version: int = 0) -> str:
    """The CID of one block's bytes."""
    return cid_to_str(cid_bytes(version, codec, hashlib.sha256(block).digest()))
