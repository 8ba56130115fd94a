"""CAR v1 streams (what ``dag/export`` sends) read and verified as they arrive. Pure: no I/O.

A CAR v1 is ``varint(len) + dag-cbor {roots: [CID], version: 1}`` then sections of
``varint(len) + CID + block``. The exporter (kubo's and js-ipfs' ``dag/export``) walks the DAG
depth first, links in order, and sends each CID once: a block seen before is skipped.

:class:`CarFileReader` holds such a stream to one UnixFS file: every section must be the block the
walk needs next (one that a verified parent links to), its bytes must hash to its CID, and every
node passes :class:`~._bounds.DagBudget` before its children are expected. A block the exporter
skipped as a repeat comes from a small cache, or is asked for (:attr:`CarFileReader.wants`).
Sizes are bounded before anything is buffered: varints, the header, each section, and the whole
stream (the file size the root declares, itself held to the caller's ``max_bytes``, plus slack).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

from ..errors import ContentNotFoundError, FetchLimitError, IntegrityError, StorageError
from ._bounds import MAX_BLOCK_BYTES, Child, DagBudget, node_parts
from ._cid import SHA2_256, Buffer, cid_to_str, read_uvarint

__all__ = ["CarFileReader", "CarSections", "IncompleteCarError", "MAX_HEADER_BYTES", "MAX_SECTION_BYTES", "block_matches",
           "car_bytes_limit", "read_car_header", "split_cid"]

IDENTITY = 0x00
MAX_CID_BYTES = 128  # a CIDv1 with a 64-byte digest is ~70 bytes
MAX_HEADER_BYTES = 1024  # one root: ~60 bytes
MAX_SECTION_BYTES = MAX_CID_BYTES + MAX_BLOCK_BYTES
_MAX_VARINT_BYTES = 9  # 63 bits, more than any length here
HELD_BYTES = 64 * 1024 * 1024  # blocks kept for repeats the walk already knows of


class IncompleteCarError(ContentNotFoundError):
    """The stream ended before the whole DAG came: content missing, not content forged.

    (Daemons report a failure after the first byte in an HTTP trailer; this is how it shows.)
    """


def car_bytes_limit(file_size: int) -> int:
    """The most CAR bytes a file of ``file_size`` bytes may take: its data plus framing slack.

    Chunks of 1 KiB cost ~10% in CIDs, varints and dag-pb framing, and 256 KiB ones 0.03%.
    """
    return file_size + file_size // 4 + 1024 * 1024


def split_cid(section: Buffer) -> tuple[bytes, int]:
    """(binary CID, its length) at the start of a section (or of its first bytes); CIDv0 is a bare
    sha2-256 multihash."""
    view = memoryview(section)
    try:
        if len(view) >= 2 and view[0] == SHA2_256 and view[1] == 32:
            end = 34
        else:
            version, pos = read_uvarint(view, 0)
            _, pos = read_uvarint(view, pos)  # codec
            _, pos = read_uvarint(view, pos)  # multihash code
            digest_len, pos = read_uvarint(view, pos)
            if version != 1:
                raise ValueError(f"CID version {version}")
            end = pos + digest_len
    except ValueError as exc:
        raise IntegrityError(f"CAR section with a malformed CID: {exc}") from exc
    if end > min(len(view), MAX_CID_BYTES):
        raise IntegrityError("CAR section with a truncated or oversized CID")
    return bytes(view[:end]), end


def block_matches(cid: bytes, block: Buffer) -> bool:
    """Whether ``block`` hashes to ``cid`` (sha2-256 or identity multihash, CIDv0 or v1)."""
    if len(cid) == 34 and cid[0] == SHA2_256:
        return hashlib.sha256(block).digest() == cid[2:]
    try:
        _, pos = read_uvarint(cid, 0)
        _, pos = read_uvarint(cid, pos)
        code, pos = read_uvarint(cid, pos)
        length, pos = read_uvarint(cid, pos)
    except ValueError:
        return False
    digest = cid[pos:]
    if len(digest) != length:
        return False
    if code == SHA2_256 and length == 32:
        return hashlib.sha256(block).digest() == digest
    return code == IDENTITY and bytes(block) == digest


# --- the header: a tiny dag-cbor reader ------------------------------------------------------

def _cbor(buf: bytes, pos: int, depth: int = 0) -> tuple[object, int]:
    """One CBOR item (the kinds a CAR header uses: uint, bytes, text, array, map, tag 42)."""
    if depth > 4:
        raise ValueError("nested too deep")
    if pos >= len(buf):
        raise ValueError("truncated")
    major, info = buf[pos] >> 5, buf[pos] & 31
    pos += 1
    if info < 24:
        arg = info
    elif info <= 27:
        width = 1 << (info - 24)
        if pos + width > len(buf):
            raise ValueError("truncated")
        arg = int.from_bytes(buf[pos:pos + width], "big")
        pos += width
    else:
        raise ValueError(f"unsupported additional info {info}")
    if major == 0:
        return arg, pos
    if major in (2, 3):
        if pos + arg > len(buf):
            raise ValueError("truncated string")
        raw = buf[pos:pos + arg]
        return (raw if major == 2 else raw.decode()), pos + arg
    if major in (4, 5):
        if arg > len(buf):  # every item takes at least one byte
            raise ValueError("impossible length")
        items = []
        for _ in range(arg * (2 if major == 5 else 1)):
            item, pos = _cbor(buf, pos, depth + 1)
            items.append(item)
        if major == 4:
            return items, pos
        keys = items[::2]
        if not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):  # type: ignore[arg-type]
            raise ValueError("map keys must be distinct strings")
        return dict(zip(keys, items[1::2], strict=True)), pos  # type: ignore[arg-type]
    if major == 6 and arg == 42:  # a CID: byte string, multibase identity prefix 0x00
        item, pos = _cbor(buf, pos, depth + 1)
        if not isinstance(item, bytes) or item[:1] != b"\x00":
            raise ValueError("malformed CID link")
        return _Link(item[1:]), pos
    raise ValueError(f"unsupported CBOR major type {major}")


class _Link(bytes):
    """A CID inside dag-cbor (tag 42)."""


def read_car_header(header: bytes) -> list[bytes]:
    """The roots of a CAR v1 header (the bytes after its length varint)."""
    try:
        value, end = _cbor(header, 0)
    except (ValueError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"malformed CAR header: {exc}") from exc
    if end != len(header) or not isinstance(value, dict):
        raise IntegrityError("malformed CAR header: not one map")
    if value.get("version") != 1:
        raise IntegrityError(f"unsupported CAR version {value.get('version')!r} (only v1 is read)")
    roots = value.get("roots")
    if not isinstance(roots, list) or not all(isinstance(r, _Link) for r in roots):
        raise IntegrityError("malformed CAR header: roots is not a list of CIDs")
    return [bytes(r) for r in roots]


# --- framing -----------------------------------------------------------------------------------

class CarSections:
    """Cut a CAR byte stream into its header and sections, with every length bounded first.

    ``feed`` takes the stream's pieces as they arrive (kept as views, not copied); ``next``
    returns the next whole section (CID, block) or None until more bytes come. Each block is
    joined once from the pieces. ``limit`` caps the bytes consumed: a frame that would pass it
    is refused as soon as its length is read; it may be lowered once the file size is known.
    ``roots`` is what the header must say.
    """

    def __init__(self, limit: int, roots: list[bytes]) -> None:
        self.limit = limit
        self.consumed = 0
        self.header_read = False
        self._roots = roots
        self._parts: list[memoryview] = []
        self._have = 0

    def feed(self, data: Buffer) -> None:
        if data:
            self._parts.append(memoryview(data).cast("B"))
            self._have += len(data)

    def next(self) -> tuple[bytes, bytes] | None:
        if not self.header_read:
            length = self._frame(MAX_HEADER_BYTES, "header")
            if length is None:
                return None
            roots = read_car_header(self._take(length))
            if roots != self._roots:
                raise IntegrityError(f"the CAR stream's roots are {[cid_to_str(r) for r in roots]},"
                                     f" not {[cid_to_str(r) for r in self._roots]}")
            self.header_read = True
        length = self._frame(MAX_SECTION_BYTES, "section")
        if length is None:
            return None
        cid, cid_len = split_cid(self._peek(min(length, MAX_CID_BYTES)))
        self._take(cid_len)
        return cid, self._take(length - cid_len)

    def close(self) -> None:
        """The stream ended: it must not stop inside a frame."""
        if self._have:
            raise IncompleteCarError(f"the CAR stream ends inside a section ({self._have} bytes left over)")

    def _frame(self, cap: int, what: str) -> int | None:
        """Consume the next frame's length varint once the whole frame is buffered; None until then."""
        head = self._peek(_MAX_VARINT_BYTES + 1)
        try:
            length, skip = read_uvarint(head, 0)
        except ValueError:
            if len(head) > _MAX_VARINT_BYTES:
                raise FetchLimitError(f"CAR {what} length varint is over {_MAX_VARINT_BYTES} bytes") from None
            return None
        if length > cap:
            raise FetchLimitError(f"CAR {what} of {length} bytes is over the {cap}-byte limit")
        if self.consumed + skip + length > self.limit:
            raise FetchLimitError(f"the CAR stream is over its limit of {self.limit} bytes")
        if length == 0:
            raise IntegrityError(f"empty CAR {what}")
        if self._have < skip + length:
            return None
        self._take(skip)
        return length

    def _peek(self, n: int) -> bytes:
        first = self._parts[0] if self._parts else b""
        if len(first) >= n:
            return bytes(first[:n])
        out = bytearray()
        for part in self._parts:
            out += part[:n - len(out)]
            if len(out) >= n:
                break
        return bytes(out)

    def _take(self, n: int) -> bytes:
        """Remove the first ``n`` buffered bytes and return them, joined (the only copy)."""
        parts, took = [], 0
        while took < n:
            part = self._parts[0]
            need = n - took
            if len(part) <= need:
                parts.append(part)
                del self._parts[0]
                took += len(part)
            else:
                parts.append(part[:need])
                self._parts[0] = part[need:]
                took = n
        self._have -= n
        self.consumed += n
        return parts[0].tobytes() if len(parts) == 1 else b"".join(parts)


# --- the file walk -------------------------------------------------------------------------------

_Visit = tuple[bytes, int | None, int, int]  # (CID, size its parent declared or None, file offset, depth)


class CarFileReader:
    """Check a ``dag/export`` CAR of one UnixFS file and release its bytes in order.

    ``feed(piece)`` returns the file bytes that pieces so far verified (possibly none). When the
    walk reaches a block the exporter skipped as a repeat and it is not held, ``wants`` names it:
    fetch it (any verified way) and pass it to ``supply``, which continues. ``finish()`` once the
    stream ends: the walk must be complete, and nothing may follow it.
    """

    def __init__(self, root: bytes, budget: DagBudget, *, held_bytes: int = HELD_BYTES) -> None:
        self.budget = budget
        self.wants: bytes | None = None
        self._root = root
        # Before the root says how big the file is: room for the header and the root's section.
        self._sections = CarSections(MAX_HEADER_BYTES + MAX_SECTION_BYTES + 2 * _MAX_VARINT_BYTES, [root])
        self._stack: list[tuple[Iterator[Child], int]] = []
        self._next: _Visit | None = (root, None, 0, 0)
        self._seen: set[bytes] = set()
        self._refs: dict[bytes, int] = {}  # links in accepted parents not yet walked
        self._held: dict[bytes, bytes] = {}
        self._held_bytes = 0
        self._held_cap = held_bytes

    @property
    def done(self) -> bool:
        return self._next is None

    def feed(self, data: Buffer) -> list[bytes]:
        if data and self._next is None:
            raise IntegrityError(f"the CAR stream of {self.budget.root} goes on after the whole file")
        self._sections.feed(data)
        return self._drain()

    def supply(self, cid: bytes, block: bytes) -> list[bytes]:
        """The block ``wants`` named; then go on with what is buffered."""
        if cid != self.wants:
            raise StorageError(f"supplied {cid_to_str(cid)} but the walk wants"
                               f" {cid_to_str(self.wants) if self.wants else 'nothing'}")
        if not block_matches(cid, block):
            raise IntegrityError(f"block {cid_to_str(cid)} does not match its hash")
        self.wants = None
        return self._visit(block) + self._drain()

    def finish(self) -> None:
        self._sections.close()
        if self.wants is not None or self._next is not None:
            missing = self.wants or (self._next[0] if self._next else b"")
            raise IncompleteCarError(f"the CAR stream of {self.budget.root} ended before block {cid_to_str(missing)}")

    def _drain(self) -> list[bytes]:
        out: list[bytes] = []
        while self.wants is None:
            section = self._sections.next()
            if section is None:
                break
            cid, block = section
            if self._next is None:
                raise IntegrityError(f"the CAR stream of {self.budget.root} has an extra block"
                                     f" {cid_to_str(cid)} after the whole file")
            if cid != self._next[0]:
                raise IntegrityError(f"the CAR stream of {self.budget.root} sent block {cid_to_str(cid)}"
                                     f" where the walk needs {cid_to_str(self._next[0])}")
            if not block_matches(cid, block):
                raise IntegrityError(f"block {cid_to_str(cid)} in the CAR stream does not match its hash")
            out += self._visit(block)
        return out

    def _visit(self, block: bytes) -> list[bytes]:
        """Accept the block of ``_next``, then walk on through repeats whose blocks are held."""
        out: list[bytes] = []
        while True:
            assert self._next is not None
            cid, size, start, depth = self._next
            node = self.budget.accept(cid, block, size, depth)
            if size is None:  # the root: now the stream's whole size can be bounded
                self._sections.limit = self._sections.consumed + car_bytes_limit(node.size)
            self._seen.add(cid)
            self._remember(cid, block)
            data, children = node_parts(node, start, self.budget.lo, self.budget.hi)
            if data:
                out.append(data)
            if children:
                for child, _, _ in children:
                    self._refs[child] = self._refs.get(child, 0) + 1
                self._stack.append((iter(children), depth + 1))
            self._next = self._advance()
            if self._next is None or self._next[0] not in self._seen:
                return out  # the stream must send it next
            held = self._held.get(self._next[0])
            if held is None:
                self.wants = self._next[0]
                return out
            block = held

    def _remember(self, cid: bytes, block: bytes) -> None:
        """Hold a block while links already seen point at it (the exporter sends it once). One that
        did repeat stays held, within the cap: zero-filled regions recur across subtrees."""
        left = self._refs.get(cid, 0) - (cid != self._root)
        if left > 0:
            self._refs[cid] = left
            if cid not in self._held and self._held_bytes + len(block) <= self._held_cap:
                self._held[cid] = block
                self._held_bytes += len(block)
        else:
            self._refs.pop(cid, None)

    def _advance(self) -> _Visit | None:
        while self._stack:
            children, depth = self._stack[-1]
            child = next(children, None)
            if child is None:
                self._stack.pop()
                continue
            cid, size, start = child
            return cid, size, start, depth
        return None
