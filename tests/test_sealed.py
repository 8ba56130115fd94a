"""Sealed content (storage/_sealed.py): round trips, random access, and every tampering detected.

Tiny chunks (16 bytes) keep every case to a few hundred bytes, so each test flips, cuts or
moves every byte or chunk there is, in both modes.
"""

from __future__ import annotations

import os
import random

import pytest

from aitbc_agent_sdk.errors import DecryptionError, IntegrityError
from aitbc_agent_sdk.storage._sealed import (
    DEFAULT_CHUNK_SIZE,
    HEADER_SIZE,
    NONCE_SIZE,
    open_file,
    open_range,
    open_stream,
    seal_file,
    seal_stream,
    sealed_size,
    sealed_span,
)

KEY = bytes(range(32))
CONTEXT = b"training-1/shard-0"
CHUNK = 16
MODES = pytest.mark.parametrize("deterministic", [False, True], ids=["random", "deterministic"])


def seal(data: bytes, *, deterministic: bool, key: bytes = KEY, context: bytes = CONTEXT) -> bytes:
    return b"".join(seal_stream(key, [data], context=context, chunk_size=CHUNK, deterministic=deterministic))


def opened(sealed: bytes, *, key: bytes = KEY, context: bytes = CONTEXT, piece: int = 7) -> bytes:
    return b"".join(open_stream(key, [sealed[i:i + piece] for i in range(0, len(sealed), piece)], context=context))


def chunks_of(sealed: bytes, deterministic: bool) -> tuple[bytes, list[bytes]]:
    unit = CHUNK + 16 + (NONCE_SIZE if deterministic else 0)
    body = sealed[HEADER_SIZE:]
    return sealed[:HEADER_SIZE], [body[i:i + unit] for i in range(0, len(body), unit)]


@MODES
@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 5 * CHUNK + 3])
def test_round_trip_over_any_cut_of_the_ciphertext(size: int, deterministic: bool) -> None:
    data = os.urandom(size)
    pieces = [data[i:i + 5] for i in range(0, size, 5)]  # plaintext fed in pieces that straddle chunks
    sealed = b"".join(seal_stream(KEY, pieces, context=CONTEXT, chunk_size=CHUNK, deterministic=deterministic))
    assert len(sealed) == sealed_size(size, CHUNK, deterministic=deterministic)
    for piece in (1, 3, CHUNK + 16, len(sealed)):
        assert opened(sealed, piece=piece) == data
    cuts = sorted(random.Random(size).sample(range(1, len(sealed)), 4))
    uneven = [sealed[a:b] for a, b in zip([0, *cuts], [*cuts, len(sealed)])]
    assert b"".join(open_stream(KEY, uneven, context=CONTEXT)) == data


def test_default_chunks_hold_one_mebibyte_and_files_round_trip(tmp_path) -> None:
    data = os.urandom(2 * DEFAULT_CHUNK_SIZE + 123)
    src, sealed, back = tmp_path / "plain", tmp_path / "sealed", tmp_path / "back"
    src.write_bytes(data)
    assert seal_file(KEY, src, sealed, context=CONTEXT) == sealed_size(len(data)) == sealed.stat().st_size
    assert len(list(seal_stream(KEY, [data], context=CONTEXT))) == 1 + 3  # header + three chunks
    assert open_file(KEY, sealed, back, context=CONTEXT) == len(data)
    assert back.read_bytes() == data
    broken = bytearray(sealed.read_bytes())
    broken[-1] ^= 1
    sealed.write_bytes(bytes(broken))
    with pytest.raises(DecryptionError):
        open_file(KEY, sealed, tmp_path / "never", context=CONTEXT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["back", "plain", "sealed"]  # no partial output, no temp file


def test_random_mode_never_repeats_and_deterministic_mode_reproduces() -> None:
    data = os.urandom(3 * CHUNK)
    assert seal(data, deterministic=False) != seal(data, deterministic=False)
    assert seal(data, deterministic=True) == seal(data, deterministic=True)
    # Same key and context, one byte changed in chunk 0: its nonce changes, so no keystream is reused.
    other = bytes([data[0] ^ 1]) + data[1:]
    _, mine = chunks_of(seal(data, deterministic=True), True)
    _, theirs = chunks_of(seal(other, deterministic=True), True)
    assert mine[0][:NONCE_SIZE] != theirs[0][:NONCE_SIZE]
    assert mine[1:] != theirs[1:]  # chained to the previous tag, so later chunks differ too


@MODES
def test_a_flipped_bit_anywhere_is_detected(deterministic: bool) -> None:
    sealed = seal(os.urandom(2 * CHUNK + 5), deterministic=deterministic)
    for position in range(len(sealed)):  # header, nonces, ciphertexts and tags alike
        broken = bytearray(sealed)
        broken[position] ^= 1 << (position % 8)
        with pytest.raises(DecryptionError):
            opened(bytes(broken))


@MODES
def test_truncation_at_any_length_and_appending_are_detected(deterministic: bool) -> None:
    sealed = seal(os.urandom(3 * CHUNK), deterministic=deterministic)
    for length in range(len(sealed)):
        with pytest.raises(DecryptionError):
            opened(sealed[:length])
    for tail in (b"\x00", sealed[HEADER_SIZE:HEADER_SIZE + 40], sealed[-40:]):
        with pytest.raises(DecryptionError):
            opened(sealed + tail)


@MODES
def test_dropped_reordered_duplicated_and_spliced_chunks_are_detected(deterministic: bool) -> None:
    header, chunks = chunks_of(seal(os.urandom(3 * CHUNK + 4), deterministic=deterministic), deterministic)
    _, other = chunks_of(seal(os.urandom(3 * CHUNK + 4), deterministic=deterministic), deterministic)
    assert len(chunks) == 4
    forgeries = {
        "final dropped": chunks[:3],
        "middle dropped": [chunks[0], chunks[2], chunks[3]],
        "swapped": [chunks[1], chunks[0], *chunks[2:]],
        "duplicated": [chunks[0], chunks[0], *chunks[1:]],
        "another file's chunk, same index": [chunks[0], other[1], *chunks[2:]],
        "another file's final chunk": [*chunks[:3], other[3]],
    }
    for name, forged in forgeries.items():
        with pytest.raises(DecryptionError):
            opened(header + b"".join(forged))
            pytest.fail(name)


@MODES
def test_wrong_key_or_context_opens_nothing(deterministic: bool) -> None:
    sealed = seal(b"secret rows", deterministic=deterministic)
    for key, context in ((os.urandom(32), CONTEXT), (KEY, b"training-1/shard-1"), (KEY, b"")):
        with pytest.raises(DecryptionError, match="does not authenticate"):
            opened(sealed, key=key, context=context)
    assert opened(sealed) == b"secret rows"


def test_malformed_headers_and_arguments_give_clear_errors() -> None:
    sealed = seal(b"x", deterministic=False)
    with pytest.raises(DecryptionError, match="bad magic"):
        opened(b"NOTSEALED" + sealed[9:])
    with pytest.raises(DecryptionError, match="truncated header"):
        opened(sealed[:HEADER_SIZE - 1])
    huge = sealed[:8] + (2**32 - 1).to_bytes(4, "big") + sealed[12:]
    with pytest.raises(DecryptionError, match="chunk size"):
        opened(huge)
    assert issubclass(DecryptionError, IntegrityError)
    with pytest.raises(ValueError, match="32 bytes"):
        seal_stream(b"short", [b""], context=CONTEXT)
    with pytest.raises(ValueError, match="chunk_size"):
        seal_stream(KEY, [b""], context=CONTEXT, chunk_size=0)


@MODES
def test_range_reads_equal_slicing_and_open_only_their_chunks(deterministic: bool) -> None:
    size = 5 * CHUNK + 3
    data = os.urandom(size)
    sealed = seal(data, deterministic=deterministic)
    reads: list[tuple[int, int]] = []

    def read_at(offset: int, length: int) -> bytes:
        reads.append((offset, length))
        return sealed[offset:offset + length]

    cases = [(0, 0), (0, size), (0, 1), (CHUNK - 1, 2), (CHUNK, CHUNK), (17, 40), (size - 1, 1), (size, 0)]
    for offset, length in cases:
        assert open_range(KEY, read_at, offset, length, context=CONTEXT, total_plaintext_size=size) == \
            data[offset:offset + length]
        reads.clear()
        open_range(KEY, read_at, offset, length, context=CONTEXT, total_plaintext_size=size)
        span = sealed_span(offset, length, chunk_size=CHUNK, total_plaintext_size=size, deterministic=deterministic)
        body = [(start, start + n) for start, n in reads if start >= HEADER_SIZE]  # all but the header
        assert (min(body)[0], max(body)[1]) == span if body else span[0] == span[1]
    reads.clear()
    open_range(KEY, read_at, 2 * CHUNK + 1, 3, context=CONTEXT, total_plaintext_size=size)
    chunk_reads = [offset for offset, length in reads if offset >= HEADER_SIZE and length > 16]
    assert len(chunk_reads) == 1  # one chunk opened (besides the header and, chained, one tag)
    with pytest.raises(DecryptionError):  # a wrong total makes the final chunk fail, never wrong bytes
        open_range(KEY, read_at, size - 4, 4, context=CONTEXT, total_plaintext_size=size + 1)
    with pytest.raises(DecryptionError):
        open_range(KEY, read_at, 4 * CHUNK, 4, context=CONTEXT, total_plaintext_size=5 * CHUNK)
    with pytest.raises(DecryptionError, match="truncated"):
        open_range(KEY, lambda o, n: sealed[o:o + n][:-1], 0, 4, context=CONTEXT, total_plaintext_size=size)
    with pytest.raises(ValueError, match="outside"):
        open_range(KEY, read_at, size - 1, 2, context=CONTEXT, total_plaintext_size=size)
