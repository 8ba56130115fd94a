"""Plaintext slices of sealed files: which sealed bytes to fetch, and opening them into a file. Blocking.

A sealed file's slice is read as two ranges of the stored (sealed) file: its header and the
span of chunks covering the slice (``sealed.sealed_span``). Both arrive verified by CID; the
chunks' tags then authenticate every plaintext byte written here.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import DecryptionError
from ._sealed import HEADER_SIZE, SealedHeader, iter_range, sealed_span

__all__ = ["HEADER_SIZE", "open_slice", "slice_span"]


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
