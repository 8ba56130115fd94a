"""A text corpus (``*.txt`` files under a directory) tokenized into flat token files. Blocking, bounded memory.

Byte-level tokens (the default): a byte is its own token (0..255) and 256 separates documents, so
the vocabulary is 257 and tokens are ``uint16``. With a ``vocab_size``, a byte-level BPE is learnt on
the corpus first (:mod:`._bpe`) and written beside the token files as ``tokenizer.json``; its tokens
are ``uint16`` up to 65536 of them, ``uint32`` above. A document is read in blocks and written as it is
read, so memory is one block whatever the corpus size. Token files are cut at document
boundaries once they reach ``file_tokens`` (a longer document is cut where it must), so a test
split of whole token files holds out whole documents.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aitbc_agent_sdk.errors import DatasetError
from aitbc_agent_sdk.records._datasets import TokenLayout
from aitbc_agent_sdk.data._bpe import TOKENIZER_FILE, check_vocab_size, encode_pieces, layout_of, train_bpe

TEXT_SUFFIXES = (".txt",)
BYTE_VOCAB = 257
BYTE_EOT = 256
FILE_TOKENS = 8 << 20  # 16 MiB of uint16 per token file: a shard's unit of transfer and caching
_READ = 1 << 20
_PIECE = 1 << 16  # characters per piece the BPE encodes: a batch of them runs on every core
_BATCH = 64


def text_files(root: Path) -> list[Path]:
    """The corpus's documents in a stable order (hidden files and directories skipped, as ``ipfs add``)."""
    found = [p for p in root.rglob("*") if p.suffix.lower() in TEXT_SUFFIXES and p.is_file()
             and not any(part.startswith(".") for part in p.relative_to(root).parts)]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


class _TokenWriter:
    def __init__(self, out_dir: Path, file_tokens: int, layout: TokenLayout) -> None:
        self.out_dir, self.file_tokens = out_dir, file_tokens
        self.dtype, self.eot = ("<u2" if layout.dtype == "uint16" else "<u4"), layout.eot
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
            self._file.write(part.astype(self.dtype).tobytes())
            self._written += len(part)
            if self._written >= self.file_tokens:
                self.close()

    def end_document(self) -> None:
        self.write(np.array([self.eot], dtype=np.int64))
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


def _pieces(path: Path) -> Iterator[str]:
    """A document's text in pieces of about ``_PIECE`` characters, cut after a newline where there is one
    (so a word is rarely split), UTF-8 with invalid bytes replaced."""
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        rest = ""
        while block := f.read(_PIECE):
            text = rest + block
            cut = text.rfind("\n") + 1
            if cut < len(text) // 2:  # no newline late enough: before a space (it starts the next word's token)
                cut = max(cut, text.rfind(" "))
            cut = cut or len(text)
            rest = text[cut:]
            yield text[:cut]
        if rest:
            yield rest


def _corpus_pieces(documents: list[Path]) -> Iterator[str]:
    for doc in documents:
        yield from _pieces(doc)


def tokenize_corpus(root: Path, out_dir: Path, *, file_tokens: int = FILE_TOKENS,
                    vocab_size: int | None = None) -> tuple[TokenLayout, list[Path]]:
    """Write ``out_dir/NNNNNN.bin`` token files for the documents under ``root``; return the layout and files.
    ``vocab_size`` (None or 256: byte-level) learns a BPE of that many tokens and writes ``tokenizer.json`` too."""
    documents = text_files(root)
    if not documents:
        raise DatasetError(f"{root}: no {'/'.join(TEXT_SUFFIXES)} files to tokenize")
    if file_tokens < 2:
        raise ValueError("file_tokens must be >= 2")
    check_vocab_size(vocab_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = None
    layout = TokenLayout(dtype="uint16", vocab_size=BYTE_VOCAB, eot=BYTE_EOT, tokenizer="bytes")
    if vocab_size is not None and vocab_size != 256:
        tokenizer = train_bpe(_corpus_pieces(documents), vocab_size)
        layout = layout_of(tokenizer)
        (out_dir / TOKENIZER_FILE).write_text(tokenizer.to_str(), encoding="utf-8")  # its byte symbols are not ASCII
    writer = _TokenWriter(out_dir, file_tokens, layout)
    try:
        for doc in documents:
            if tokenizer is None:
                for block in _blocks(doc):
                    writer.write(np.frombuffer(block, dtype=np.uint8))
            else:
                _encode_document(tokenizer, doc, writer)
            writer.end_document()
    finally:
        writer.close()
    return layout, writer.paths


def _encode_document(tokenizer: Any, doc: Path, writer: _TokenWriter) -> None:
    batch: list[str] = []
    for piece in _pieces(doc):
        batch.append(piece)
        if len(batch) == _BATCH:
            writer.write(encode_pieces(tokenizer, batch))
            batch = []
    if batch:
        writer.write(encode_pieces(tokenizer, batch))


def decode_bytes(tokens: np.ndarray) -> str:
    """Byte-level tokens back to text (separators become newlines; broken UTF-8 is replaced)."""
    arr = np.asarray(tokens, dtype=np.int64)
    return bytes(np.where(arr == BYTE_EOT, 10, arr).clip(0, 255).astype(np.uint8)).decode("utf-8", "replace")


def encode_bytes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)


class ByteCodec:
    """Byte-level tokens as a :class:`~._bpe.TextCodec`: what ``sample`` uses for a corpus without a BPE."""

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in encode_bytes(text)]

    def decode(self, tokens: Sequence[int]) -> str:
        return decode_bytes(np.asarray(tokens, dtype=np.int64))
