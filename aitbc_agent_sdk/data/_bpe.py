"""Byte-level BPE for text corpora, with HuggingFace ``tokenizers``. Blocking.

GPT-2's scheme: text is split by the byte-level pre-tokenizer (every byte has a token, so any text
encodes), merges are learnt on the corpus itself, and one special token separates documents. Training
is deterministic for the same text and vocabulary size (merge ties are broken by the pair's ids, and
ids follow the sorted byte alphabet), so the same corpus imports to the same CIDs.

A tokenizer read back (for ``sample``) comes from the content store, so its JSON is checked to be
the pipeline this module writes before ``tokenizers`` parses it: a normalizer or a split pattern of a
stranger's choosing never runs here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from aitbc_agent_sdk.errors import DatasetError
from aitbc_agent_sdk.records._datasets import MAX_TOKENIZER_BYTES, MAX_VOCAB, TokenLayout, token_dtype

EOT_TEXT = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"
MIN_BPE_VOCAB = 512  # the 256 bytes, the separator and some merges: below this, bytes do as well
MIN_FREQUENCY = 2  # a pair seen once is noise, not a word piece
TRAIN_CHARS = 1 << 30  # the BPE learns from the corpus's first GiB of text; the rest is only encoded


class TextCodec(Protocol):
    """Text to a corpus's tokens and back (what ``sample`` needs of a tokenizer)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: Sequence[int]) -> str: ...


def check_vocab_size(vocab_size: int | None) -> None:
    """DatasetError for a vocabulary setting out of range (None or 256: byte-level tokens)."""
    if vocab_size is not None and vocab_size != 256 and not MIN_BPE_VOCAB <= vocab_size <= MAX_VOCAB:
        raise DatasetError(f"a BPE vocabulary holds {MIN_BPE_VOCAB} to {MAX_VOCAB} tokens (256: byte-level "
                           f"tokens), got {vocab_size}")


def train_bpe(pieces: Iterable[str], vocab_size: int) -> Any:
    """A byte-level BPE of at most ``vocab_size`` tokens (fewer when the text has no more pairs to merge)
    learnt on ``pieces``; the separator is token 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415 (BPE users only)

    check_vocab_size(vocab_size)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=MIN_FREQUENCY, show_progress=False,
                                  special_tokens=[EOT_TEXT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_capped(pieces, TRAIN_CHARS), trainer)
    return tokenizer


def _capped(pieces: Iterable[str], chars: int) -> Iterator[str]:
    for piece in pieces:
        if chars <= 0:
            return
        chars -= len(piece)
        yield piece


def layout_of(tokenizer: Any) -> TokenLayout:
    vocab = tokenizer.get_vocab_size()
    return TokenLayout(dtype=token_dtype(vocab), vocab_size=vocab,
                       eot=tokenizer.token_to_id(EOT_TEXT), tokenizer="bpe", tokenizer_file=TOKENIZER_FILE)


def encode_pieces(tokenizer: Any, pieces: list[str]) -> np.ndarray:
    """The tokens of ``pieces`` in order, as int64. A literal separator in the text is text, not a boundary."""
    tokenizer.encode_special_tokens = True
    batch = tokenizer.encode_batch_fast(pieces, add_special_tokens=False)
    return np.concatenate([np.asarray(e.ids, dtype=np.int64) for e in batch]) if batch else np.empty(0, np.int64)


# What train_bpe writes, the only pipeline a stored tokenizer may have (null: absent).
_PIPELINE = {
    "normalizer": None, "post_processor": None, "truncation": None, "padding": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
}


def _check_json(blob: bytes, layout: TokenLayout) -> None:
    """DatasetError unless ``blob`` is a byte-level BPE as train_bpe writes it, of ``layout``'s vocabulary."""
    if len(blob) > MAX_TOKENIZER_BYTES:
        raise DatasetError(f"the tokenizer holds {len(blob)} bytes, above the limit of {MAX_TOKENIZER_BYTES}")
    try:
        doc = json.loads(blob)
    except ValueError as exc:
        raise DatasetError(f"the tokenizer is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or any(doc.get(k) != v for k, v in _PIPELINE.items()):
        raise DatasetError("the tokenizer is not a byte-level BPE without a normalizer or post-processor")
    model, decoder, added = doc.get("model"), doc.get("decoder"), doc.get("added_tokens")
    if not isinstance(decoder, dict) or decoder.get("type") != "ByteLevel":
        raise DatasetError("the tokenizer's decoder is not byte-level")
    if not isinstance(model, dict) or model.get("type") != "BPE" or model.get("dropout") is not None \
            or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise DatasetError("the tokenizer's model is not a plain BPE")
    vocab, merges = model.get("vocab"), model.get("merges")
    if not isinstance(vocab, dict) or not isinstance(merges, list) or len(vocab) != layout.vocab_size \
            or len(merges) >= layout.vocab_size:
        raise DatasetError(f"the tokenizer's vocabulary is not the {layout.vocab_size} tokens the dataset declares")
    if sorted(i for i in vocab.values() if isinstance(i, int)) != list(range(layout.vocab_size)):
        raise DatasetError("the tokenizer's token ids are not 0 .. vocabulary - 1, each once")
    if not isinstance(added, list) or len(added) != 1 or not isinstance(added[0], dict) \
            or added[0].get("content") != EOT_TEXT or added[0].get("id") != layout.eot:
        raise DatasetError(f"the tokenizer's special token is not the separator {layout.eot}")


class BpeCodec:
    """A stored tokenizer, checked against the dataset's layout (see :func:`load_tokenizer`)."""

    def __init__(self, tokenizer: Any, eot: int) -> None:
        self._tokenizer, self._eot = tokenizer, eot

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in encode_pieces(self._tokenizer, [text])]

    def decode(self, tokens: Sequence[int]) -> str:
        """Documents joined by newlines, as byte-level decoding shows the separator."""
        out, doc = [], []
        for t in tokens:
            if t == self._eot:
                out.append(self._tokenizer.decode(doc, skip_special_tokens=False))
                doc = []
            else:
                doc.append(int(t))
        out.append(self._tokenizer.decode(doc, skip_special_tokens=False))
        return "\n".join(out)


def _byte_chars() -> list[str]:
    """GPT-2's printable character for each byte, by byte value: what the ByteLevel pre-tokenizer maps to."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)]
    shifted = iter(range(256, 512))
    return [chr(b) if b in kept else chr(next(shifted)) for b in range(256)]


def byte_tokenizer(eot: int) -> Any:
    """The byte-level corpus's tokens as a ``tokenizers`` Tokenizer: byte b is token b and ``eot`` the separator.

    A byte-level BPE with no merges whose vocabulary is GPT-2's byte alphabet in byte order, so any tool
    that reads a ``tokenizer.json`` (``transformers``' AutoTokenizer) encodes text as the corpus import did."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers  # noqa: PLC0415

    tokenizer = Tokenizer(models.BPE(vocab={c: b for b, c in enumerate(_byte_chars())}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(EOT_TEXT, special=True)])
    if tokenizer.token_to_id(EOT_TEXT) != eot:  # the separator's id follows the 256 bytes
        raise DatasetError(f"a byte-level corpus separates documents with token 256, not {eot}")
    return tokenizer


def load_tokenizer(blob: bytes, layout: TokenLayout) -> BpeCodec:
    """The tokenizer JSON ``blob`` (from the store: a stranger's) for a corpus of ``layout``. JSON only."""
    from tokenizers import Tokenizer  # noqa: PLC0415

    _check_json(blob, layout)
    try:
        tokenizer = Tokenizer.from_str(blob.decode("utf-8"))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception for a model it cannot build
        raise DatasetError(f"the tokenizer does not load: {exc}") from exc
    if tokenizer.get_vocab_size() != layout.vocab_size or tokenizer.token_to_id(EOT_TEXT) != layout.eot:
        raise DatasetError(f"the tokenizer's vocabulary is not the {layout.vocab_size} tokens the dataset declares")
    return BpeCodec(tokenizer, layout.eot)


__all__ = ["BpeCodec", "EOT_TEXT", "TextCodec", "byte_tokenizer", "check_vocab_size", "encode_pieces", "layout_of",
           "load_tokenizer", "train_bpe"]
