"""A text corpus (``*.txt`` files under a directory) tokenized into flat token files. Blocking, bounded memory.

Byte-level tokens: a byte is its own token (0..255) and 256 separates documents, so the
vocabulary is 257 and tokens are ``uint16``. A document is read in blocks and written as it is
read, so memory is one block whatever the corpus size. Token files are cut at document
boundaries once they reach ``file_tokens`` (a longer document is cut where it must), so a test
split of whole token files holds out whole documents.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from aitbc_agent_sdk.errors import DatasetError
from aitbc_agent_sdk.models.datasets import TokenLayout

TEXT_SUFFIXES = (".txt",)
BYTE_VOCAB = 257
BYTE_EOT = 256
FILE_TOKENS = 8 << 20  # 16 MiB of uint16 per token file: a shard's unit of transfer and caching
_READ = 1 << 20


def text_files(root: Path) -> list[Path]:
    """The corpus's documents in a stable order (hidden files and directories skipped, as ``ipfs add``)."""
    found = [p for p in root.rglob("*") if p.suffix.lower() in TEXT_SUFFIXES and p.is_file()
             and not any(part.startswith(".") for part in p.relative_to(root).parts)]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


class _TokenWriter:
    def __init__(self, out_dir: Path, file_tokens: int) -> None:
        self.out_dir, self.file_tokens = out_dir, file_tokens
        self.paths: list[Path] = []
        self._file = None
        self._written = 0

    def write(self, tokens: np.ndarray) -> None:
        while len(tokens):
            if self._file is None:
                path = self.out_dir / f"{len(self.paths):06d}.bin"
                self.paths.append(path)
                self._file, self._written = open(path, "wb"), 0
            room = self.file_tokens - self._written  # a file never exceeds file_tokens
            part, tokens = tokens[:room], tokens[room:]
            self._file.write(part.astype("<u2").tobytes())
            self._written += len(part)
            if self._written >= self.file_tokens:
                self.close()

    def end_document(self) -> None:
        self.write(np.array([BYTE_EOT], dtype=np.uint16))
        if self._file is not None and self._written >= self.file_tokens // 2:
            self.close()  # a document boundary past half a file: a good place to cut

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _blocks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while block := f.read(_READ):
            yield block


def tokenize_corpus(root: Path, out_dir: Path, *, file_tokens: int = FILE_TOKENS) -> tuple[TokenLayout, list[Path]]:
    """Write ``out_dir/NNNNNN.bin`` token files for the documents under ``root``; return the layout and files."""
    documents = text_files(root)
    if not documents:
        raise DatasetError(f"{root}: no {'/'.join(TEXT_SUFFIXES)} files to tokenize")
    if file_tokens < 2:
        raise ValueError("file_tokens must be >= 2")
    out_dir.mkdir(parents=True, exist_ok=True)
    writer = _TokenWriter(out_dir, file_tokens)
    try:
        for doc in documents:
            for block in _blocks(doc):
                writer.write(np.frombuffer(block, dtype=np.uint8))
            writer.end_document()
    finally:
        writer.close()
    return TokenLayout(dtype="uint16", vocab_size=BYTE_VOCAB, eot=BYTE_EOT, tokenizer="bytes"), writer.paths


def decode_bytes(tokens: np.ndarray) -> str:
    """Byte-level tokens back to text (separators become newlines; broken UTF-8 is replaced)."""
    arr = np.asarray(tokens, dtype=np.int64)
    return bytes(np.where(arr == BYTE_EOT, 10, arr).clip(0, 255).astype(np.uint8)).decode("utf-8", "replace")


def encode_bytes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)
