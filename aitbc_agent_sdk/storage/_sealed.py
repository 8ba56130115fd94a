"""Sealed content: a streaming AEAD format (AES-256-GCM) for data stored on IPFS.

Layout: a header, then the plaintext in chunks of ``chunk_size`` (the last 0..chunk_size bytes)::

    header   magic "AITBCS" | version u8 | mode u8 | chunk_size u32 | salt 16 bytes
    chunk i  [nonce 12 bytes, deterministic mode only] ciphertext | tag 16 bytes

Keys: ``HKDF-SHA256(key, salt, info = label | mode | context)`` gives a per-file AES key and
nonce key, so the ``context`` (training id, file role) binds every chunk. Each chunk's
associated data is the header, its index and a final-chunk flag: a changed header, dropped,
reordered, duplicated, truncated or appended chunks and chunks from another file all fail.
The sealer holds a chunk back until more follows, so every file ends with a final chunk.

Nonces never repeat under a key:
- random mode (the default): a random salt gives a fresh file key; chunk ``i`` uses nonce ``i``.
- deterministic mode (resumable uploads: the CID over the ciphertext must come out the same
  when an interrupted upload starts again): the salt is fixed, so the file key depends on
  (key, context) only. A nonce derived from those alone would repeat the day one key and
  context seal different bytes (a re-cut shard, an edited file), and in GCM that leaks the XOR
  of the plaintexts and the authentication key. So each nonce is a synthetic IV,
  ``HMAC-SHA256(nonce key, associated data | plaintext)[:12]``, stored before the chunk: other
  plaintext, another nonce; same plaintext, same ciphertext; no rule for callers, no extra pass.
  Files sealed under one key and context share a header, so the associated data also holds the
  previous chunk's tag and a stream mixing their chunks fails (a range read checks chunks one
  by one: keep contexts unique per file version where that matters). The price: a SHA-256 pass
  while sealing, 12 bytes a chunk, and equal chunks at one index of two such files show.

Blocking and pure but for the streams and files handed in. Hostile input raises DecryptionError
(never a crash), a caller's own bad argument ValueError.
"""

from __future__ import annotations

import hmac
import os
import struct
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import DecryptionError

MAGIC = b"AITBCS"
VERSION = 1
KEY_SIZE = 32
TAG_SIZE = 16
NONCE_SIZE = 12
SALT_SIZE = 16
DEFAULT_CHUNK_SIZE = 1024 * 1024
MAX_CHUNK_SIZE = 16 * 1024 * 1024  # a hostile header cannot make an opener buffer more than this
MAX_CONTEXT_BYTES = 1024
_HEADER = struct.Struct(">6sBBI16s")
HEADER_SIZE = _HEADER.size
_RANDOM, _DETERMINISTIC = 0, 1
_LABEL = b"aitbc-sealed-v1\x00"
_INDEX = struct.Struct(">QB")  # chunk index, final flag
_FILE_PIECE = 4 * 1024 * 1024
Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True)
class SealedHeader:
    chunk_size: int
    deterministic: bool
    salt: bytes

    def pack(self) -> bytes:
        mode = _DETERMINISTIC if self.deterministic else _RANDOM
        return _HEADER.pack(MAGIC, VERSION, mode, self.chunk_size, self.salt)

    @classmethod
    def parse(cls, raw: bytes) -> SealedHeader:
        if len(raw) < HEADER_SIZE:
            raise DecryptionError(f"sealed content: truncated header ({len(raw)} of {HEADER_SIZE} bytes)")
        magic, version, mode, chunk_size, salt = _HEADER.unpack(bytes(raw[:HEADER_SIZE]))
        if magic != MAGIC:
            raise DecryptionError("not sealed content (bad magic)")
        if version != VERSION or mode not in (_RANDOM, _DETERMINISTIC):
            raise DecryptionError(f"sealed content: unsupported version {version} or mode {mode}")
        if not 1 <= chunk_size <= MAX_CHUNK_SIZE:
            raise DecryptionError(f"sealed content: chunk size {chunk_size} outside 1..{MAX_CHUNK_SIZE}")
        return cls(chunk_size=chunk_size, deterministic=mode == _DETERMINISTIC, salt=salt)



def _overhead(deterministic: bool) -> int:
    return TAG_SIZE + (NONCE_SIZE if deterministic else 0)


def _check_key(key: bytes, context: bytes) -> None:
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_SIZE:
        raise ValueError(f"a sealing key is {KEY_SIZE} bytes")
    if not isinstance(context, (bytes, bytearray)) or len(context) > MAX_CONTEXT_BYTES:
        raise ValueError(f"context must be bytes, at most {MAX_CONTEXT_BYTES}")


def _check_chunk_size(chunk_size: int) -> None:
    if not isinstance(chunk_size, int) or not 1 <= chunk_size <= MAX_CHUNK_SIZE:
        raise ValueError(f"chunk_size must be 1..{MAX_CHUNK_SIZE} bytes")


def _check_range(offset: int, length: int, total: int) -> None:
    if offset < 0 or length < 0 or offset + length > total:
        raise ValueError(f"range {offset}+{length} is outside 0..{total}")


class _ChunkCipher:
    """Seals and opens the chunks of one file under its derived keys."""

    def __init__(self, key: bytes, context: bytes, header: SealedHeader) -> None:
        mode = _DETERMINISTIC if header.deterministic else _RANDOM
        derived = HKDF(SHA256(), 2 * KEY_SIZE, salt=header.salt,
                       info=_LABEL + bytes([mode]) + bytes(context)).derive(bytes(key))
        self._aead = AESGCM(derived[:KEY_SIZE])
        self._nonce_key = derived[KEY_SIZE:]
        self._header = header.pack()
        self.deterministic = header.deterministic

    def _aad(self, index: int, final: bool, previous_tag: bytes) -> bytes:
        return self._header + _INDEX.pack(index, final) + (previous_tag if self.deterministic else b"")

    def seal(self, index: int, plaintext: Buffer, final: bool, previous_tag: bytes = b"") -> bytes:
        aad = self._aad(index, final, previous_tag)
        if not self.deterministic:
            return self._aead.encrypt(bytes(4) + index.to_bytes(8, "big"), plaintext, aad)
        mac = hmac.new(self._nonce_key, aad, sha256)
        mac.update(plaintext)
        nonce = mac.digest()[:NONCE_SIZE]
        return nonce + self._aead.encrypt(nonce, plaintext, aad)

    def open(self, index: int, sealed: Buffer, final: bool, previous_tag: bytes = b"") -> bytes:
        view = memoryview(sealed)  # no copy of the chunk on its way to the cipher
        if self.deterministic:
            nonce, body = bytes(view[:NONCE_SIZE]), view[NONCE_SIZE:]
        else:
            nonce, body = bytes(4) + index.to_bytes(8, "big"), view
        try:
            return self._aead.decrypt(nonce, body, self._aad(index, final, previous_tag))
        except InvalidTag as exc:
            raise DecryptionError(f"sealed content: {'final ' if final else ''}chunk {index} does not authenticate "
                                  "(wrong key or context, or changed, truncated or reordered content)") from exc


class StreamSealer:
    """Push-style sealer: ``header``, then ``feed`` pieces of any size, then ``finish`` once."""

    def __init__(self, key: bytes, *, context: bytes, chunk_size: int = DEFAULT_CHUNK_SIZE,
                 deterministic: bool = False) -> None:
        _check_key(key, context)
        _check_chunk_size(chunk_size)
        salt = bytes(SALT_SIZE) if deterministic else os.urandom(SALT_SIZE)
        header = SealedHeader(chunk_size=chunk_size, deterministic=deterministic, salt=salt)
        self.header = header.pack()
        self._cipher = _ChunkCipher(key, context, header)
        self._chunk_size = chunk_size
        self._pending = bytearray()
        self._index = 0
        self._previous_tag = b""
        self._done = False

    def feed(self, data: Buffer) -> list[bytes]:
        if self._done:
            raise ValueError("the sealer is finished")
        out: list[bytes] = []
        view = memoryview(data).cast("B")
        size, pos = self._chunk_size, 0
        while pos < len(view):
            if len(self._pending) == size:  # full, and more follows: not the final chunk
                out.append(self._seal_next(self._pending))
                self._pending = bytearray()
            if not self._pending and len(view) - pos > size:  # a whole chunk with more behind it: no copy
                out.append(self._seal_next(view[pos:pos + size]))
                pos += size
                continue
            take = min(size - len(self._pending), len(view) - pos)
            self._pending += view[pos:pos + take]
            pos += take
        return out

    def _seal_next(self, plaintext: Buffer) -> bytes:
        sealed = self._cipher.seal(self._index, plaintext, False, self._previous_tag)
        self._previous_tag = sealed[-TAG_SIZE:]
        self._index += 1
        return sealed

    def finish(self) -> bytes:
        if self._done:
            raise ValueError("the sealer is finished")
        self._done = True
        return self._cipher.seal(self._index, self._pending, True, self._previous_tag)


class StreamOpener:
    """Push-style opener over ciphertext cut anywhere; holds at most one sealed chunk.

    Each piece ``feed`` returns is authentic, but only ``finish`` proves nothing was cut off the end.
    """

    def __init__(self, key: bytes, *, context: bytes) -> None:
        _check_key(key, context)
        self._key, self._context = bytes(key), bytes(context)
        self._cipher: _ChunkCipher | None = None
        self._sealed_len = HEADER_SIZE
        self._pending = bytearray()
        self._index = 0
        self._previous_tag = b""
        self._done = False

    def feed(self, data: Buffer) -> list[bytes]:
        if self._done:
            raise ValueError("the opener is finished")
        out: list[bytes] = []
        view = memoryview(data).cast("B")
        pos = 0
        while pos < len(view):
            if len(self._pending) == self._sealed_len:  # a whole unit, and more follows
                if self._cipher is None:
                    self._start()
                else:
                    out.append(self._open_next(self._pending))
                    self._pending = bytearray()
            unit = self._sealed_len
            if self._cipher is not None and not self._pending and len(view) - pos > unit:  # no copy
                out.append(self._open_next(view[pos:pos + unit]))
                pos += unit
                continue
            take = min(unit - len(self._pending), len(view) - pos)
            self._pending += view[pos:pos + take]
            pos += take
        return out

    def _open_next(self, sealed: Buffer) -> bytes:
        assert self._cipher is not None
        plaintext = self._cipher.open(self._index, sealed, False, self._previous_tag)
        self._previous_tag = bytes(sealed[-TAG_SIZE:])
        self._index += 1
        return plaintext

    def _start(self) -> None:
        header = SealedHeader.parse(self._pending)
        self._cipher = _ChunkCipher(self._key, self._context, header)
        self._sealed_len = header.chunk_size + _overhead(header.deterministic)
        self._min_final = _overhead(header.deterministic)
        self._pending = bytearray()

    def finish(self) -> bytes:
        if self._done:
            raise ValueError("the opener is finished")
        self._done = True
        if self._cipher is None and len(self._pending) == HEADER_SIZE:
            self._start()
        if self._cipher is None:
            raise DecryptionError(f"sealed content: truncated header ({len(self._pending)} of {HEADER_SIZE} bytes)")
        if len(self._pending) < self._min_final:
            raise DecryptionError(f"sealed content: truncated (no final chunk after {self._index} chunks)")
        return self._cipher.open(self._index, self._pending, True, self._previous_tag)


def seal_stream(key: bytes, chunks: Iterable[bytes], *, context: bytes, chunk_size: int = DEFAULT_CHUNK_SIZE,
                deterministic: bool = False) -> Iterator[bytes]:
    """Yield the sealed form of ``chunks`` (pieces of any size): the header, then one piece per chunk."""
    sealer = StreamSealer(key, context=context, chunk_size=chunk_size, deterministic=deterministic)

    def sealed() -> Iterator[bytes]:
        yield sealer.header
        for piece in chunks:
            yield from sealer.feed(piece)
        yield sealer.finish()

    return sealed()


def open_stream(key: bytes, chunks: Iterable[bytes], *, context: bytes) -> Iterator[bytes]:
    """Yield the plaintext of sealed ``chunks`` (cut anywhere); DecryptionError at the first bad chunk.

    Only an iterator that ends without an error proves that nothing was cut off the end.
    """
    opener = StreamOpener(key, context=context)

    def opened() -> Iterator[bytes]:
        for piece in chunks:
            yield from opener.feed(piece)
        yield opener.finish()

    return opened()


def sealed_size(plaintext_size: int, chunk_size: int = DEFAULT_CHUNK_SIZE, *, deterministic: bool = False) -> int:
    """The exact size of the sealed form of ``plaintext_size`` bytes."""
    if plaintext_size < 0:
        raise ValueError("plaintext_size must be >= 0")
    _check_chunk_size(chunk_size)
    return HEADER_SIZE + plaintext_size + _chunk_count(plaintext_size, chunk_size) * _overhead(deterministic)


def _chunk_count(plaintext_size: int, chunk_size: int) -> int:
    return max(1, -(-plaintext_size // chunk_size))  # an empty file is one empty final chunk


def _read_pieces(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while piece := f.read(_FILE_PIECE):
            yield piece


def _write_atomic(dst: Path, pieces: Iterable[bytes]) -> int:
    """Write ``pieces`` to a temp file next to ``dst``, moved in place once all of them came."""
    dst = Path(dst)
    tmp = dst.parent / f".{dst.name}.{uuid.uuid4().hex}.tmp"
    written = 0
    try:
        with open(tmp, "wb") as f:
            for piece in pieces:
                f.write(piece)
                written += len(piece)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return written


def seal_file(key: bytes, src: Path, dst: Path, *, context: bytes, chunk_size: int = DEFAULT_CHUNK_SIZE,
              deterministic: bool = False) -> int:
    """Seal the file ``src`` into ``dst`` (written atomically); returns the sealed size."""
    return _write_atomic(dst, seal_stream(key, _read_pieces(Path(src)), context=context,
                                          chunk_size=chunk_size, deterministic=deterministic))


def open_file(key: bytes, src: Path, dst: Path, *, context: bytes) -> int:
    """Open the sealed file ``src`` into ``dst``; ``dst`` appears only if all of it authenticated."""
    return _write_atomic(dst, open_stream(key, _read_pieces(Path(src)), context=context))


def iter_range(key: bytes, read_at: Callable[[int, int], bytes], plaintext_offset: int, length: int, *,
               context: bytes, total_plaintext_size: int) -> Iterator[bytes]:
    """Yield ``length`` plaintext bytes from ``plaintext_offset``, opening only the chunks that cover them.

    ``read_at(offset, size)`` reads the sealed bytes; the header is read at once. A wrong
    ``total_plaintext_size`` (it says which chunk is final) fails that chunk, never gives wrong bytes.
    """
    _check_key(key, context)
    _check_range(plaintext_offset, length, total_plaintext_size)
    header = SealedHeader.parse(_read_exactly(read_at, 0, HEADER_SIZE))
    cipher = _ChunkCipher(key, context, header)
    size, overhead = header.chunk_size, _overhead(header.deterministic)
    last = _chunk_count(total_plaintext_size, size) - 1

    def chunks() -> Iterator[bytes]:
        if length == 0:
            return
        end = plaintext_offset + length
        first = plaintext_offset // size
        position = HEADER_SIZE + first * (size + overhead)
        # Unchecked on its own: a wrong previous tag only makes this chunk fail.
        previous_tag = _read_exactly(read_at, position - TAG_SIZE, TAG_SIZE) if header.deterministic and first else b""
        for index in range(first, -(-end // size)):
            plain_len = size if index < last else total_plaintext_size - last * size
            sealed = _read_exactly(read_at, position, plain_len + overhead)
            plaintext = cipher.open(index, sealed, index == last, previous_tag)
            previous_tag, position = sealed[-TAG_SIZE:], position + size + overhead
            yield plaintext[max(plaintext_offset - index * size, 0):end - index * size]

    return chunks()


def sealed_span(plaintext_offset: int, length: int, *, chunk_size: int, total_plaintext_size: int,
                deterministic: bool = False) -> tuple[int, int]:
    """The sealed bytes ``[start, end)`` ``iter_range`` reads besides the header (an async caller fetches
    the header and this span, then hands ``iter_range`` a ``read_at`` over the two)."""
    _check_chunk_size(chunk_size)
    _check_range(plaintext_offset, length, total_plaintext_size)
    if length == 0:
        return HEADER_SIZE, HEADER_SIZE
    overhead = _overhead(deterministic)
    first, stop_chunk = plaintext_offset // chunk_size, -(-(plaintext_offset + length) // chunk_size)
    start = HEADER_SIZE + first * (chunk_size + overhead) - (TAG_SIZE if deterministic and first else 0)
    stop = HEADER_SIZE + min(stop_chunk * chunk_size, total_plaintext_size) + stop_chunk * overhead
    return start, stop


def open_range(key: bytes, read_at: Callable[[int, int], bytes], plaintext_offset: int, length: int, *,
               context: bytes, total_plaintext_size: int) -> bytes:
    """``iter_range`` joined: the plaintext bytes ``[plaintext_offset, plaintext_offset + length)``."""
    return b"".join(iter_range(key, read_at, plaintext_offset, length, context=context,
                               total_plaintext_size=total_plaintext_size))


def _read_exactly(read_at: Callable[[int, int], bytes], offset: int, size: int) -> bytes:
    data = read_at(offset, size)
    if len(data) != size:
        raise DecryptionError(f"sealed content: {len(data)} bytes at offset {offset}, expected {size} (truncated)")
    return data

# -- plaintext slices of sealed files ---------------------------------------------------------
# A sealed file's slice is read as two ranges of the stored (sealed) file: its header and the span
# of chunks covering the slice (``sealed_span``). Both arrive verified by CID; the chunks' tags then
# authenticate every plaintext byte written here.


def slice_span(offset: int, length: int, *, chunk_size: int, file_size: int) -> tuple[int, int]:
    """The sealed bytes ``(start, length)`` a plaintext slice needs besides the header."""
    start, stop = sealed_span(offset, length, chunk_size=chunk_size, total_plaintext_size=file_size)
    return start, stop - start


def open_slice(key: bytes, header: Path, span: Path, span_start: int, out: Path, *, offset: int, length: int,
               file_size: int, context: bytes, chunk_size: int) -> int:
    """Write plaintext ``[offset, offset + length)`` of a sealed file to ``out`` from its header and span files."""
    head = header.read_bytes()
    if len(head) != HEADER_SIZE or SealedHeader.parse(head).chunk_size != chunk_size:
        raise DecryptionError(f"{header.name}: not the sealed header the dataset declares")
    fd = os.open(span, os.O_RDONLY)
    try:
        def read_at(position: int, size: int) -> bytes:
            if position + size <= HEADER_SIZE:
                return head[position:position + size]
            if position < span_start:
                raise DecryptionError("sealed read outside the fetched span")
            return os.pread(fd, size, position - span_start)

        written = 0
        tmp = out.with_name(out.name + ".open")
        with open(tmp, "wb") as dst:
            for piece in iter_range(key, read_at, offset, length, context=context, total_plaintext_size=file_size):
                dst.write(piece)
                written += len(piece)
        tmp.replace(out)  # only fully authenticated plaintext appears under the part's name
        return written
    finally:
        os.close(fd)
