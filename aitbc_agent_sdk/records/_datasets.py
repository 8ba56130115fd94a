"""Datasets as directories of files: what a prepared dataset holds and which bytes a shard is.

A dataset manifest and a shard's file slices come from the content store under CIDs a
stranger may have chosen, so every path is a validated relative path (it names a file
inside a job directory or a UnixFS directory, never anything outside), every count and
size is bounded, and slices are checked against the file sizes they cut.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from .. import limits
from ._base import Cid, Record

DATASET_FORMAT = "aitbc-dataset/1"
MANIFEST_NAME = "aitbc-dataset.json"
MAX_DATASET_FILES = 200_000  # a manifest of this many entries is ~20 MB of JSON: bounded, still readable
MAX_SLICES = MAX_DATASET_FILES  # per shard or test split: an image shard lists its files
MAX_DATASET_BYTES = 1 << 44  # 16 TiB
_PART = r"[^/\\\x00-\x1f\x7f.][^/\\\x00-\x1f\x7f]{0,254}"  # no separators or control characters
_PATH = re.compile(rf"^{_PART}(/{_PART}){{0,15}}$")

DatasetKind = Literal["arrays", "images", "tokens", "files"]
TokenDtype = Literal["uint16", "uint32"]
TargetKind = Literal["classes", "values", "none"]  # class labels, float regression targets, or no target
TARGET_KINDS: tuple[str, ...] = ("classes", "values", "none")
MAX_TARGET_WIDTH = limits.MAX_CLASSES  # floats per row of a vector target: as wide as a classifier's head
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
# A vocabulary is not a class count: a BPE of 50k tokens is common, a million is far past any in use.
MAX_VOCAB = limits.MAX_VOCAB
MAX_TOKENIZER_BYTES = 64 << 20  # a tokenizer.json of MAX_VOCAB tokens and their merges, with room


def _relative_path(value: str) -> str:
    # No '..', no leading '/', no empty part, no hidden files: a name that stays where it is put. Names
    # never become paths on a provider (parts are stored by index); they resolve inside the dataset's directory.
    if not _PATH.fullmatch(value):
        raise ValueError(f"{value!r} is not a dataset path: relative, <= 16 parts, no hidden or control characters")
    return value


RelPath = Annotated[str, AfterValidator(_relative_path)]


class DatasetFile(Record):
    path: RelPath
    cid: Cid
    size: int = Field(ge=0, le=MAX_DATASET_BYTES)
    label: int | None = Field(default=None, ge=0, lt=limits.MAX_CLASSES, description="images: the class index")


class ArrayLayout(Record):
    """Labelled arrays as flat files. Classes: rows sorted by class, so any split is a few row ranges per class.
    Values and none: rows in a seeded random order, one range (``class_rows`` holds the row count only)."""

    features: RelPath = "x.f32"
    labels: RelPath | None = Field(default="y.i64", description="y.i64 (classes), y.f32 (values), None (none)")
    feature_shape: tuple[Annotated[int, Field(ge=1)], ...] = Field(min_length=1, max_length=limits.MAX_INPUT_RANK)
    target: TargetKind = "classes"  # manifests written before targets had kinds hold classes
    target_width: int = Field(default=1, ge=1, le=MAX_TARGET_WIDTH, description="values: floats per row")
    num_classes: int = Field(ge=0, le=limits.MAX_CLASSES, description="classes: >= 2; values and none: 0")
    class_rows: tuple[Annotated[int, Field(ge=0)], ...] = Field(max_length=limits.MAX_CLASSES,
                                                                  description="rows of class 0, 1, ... in order")

    @model_validator(mode="after")
    def _target_consistent(self) -> ArrayLayout:
        if self.target == "classes":
            if self.num_classes < 2 or len(self.class_rows) != self.num_classes or self.labels is None:
                raise ValueError("a classes target needs >= 2 classes, one row count per class and a label file")
        elif self.num_classes != 0 or len(self.class_rows) != 1 or (self.labels is None) != (self.target == "none"):
            raise ValueError(f"a {self.target} target has no classes, one row count, and "
                             f"{'no' if self.target == 'none' else 'a'} label file")
        if self.target != "values" and self.target_width != 1:
            raise ValueError("only a values target has a width")
        return self

    @property
    def rows(self) -> int:
        return sum(self.class_rows)

    @property
    def row_bytes(self) -> int:
        n = 4
        for dim in self.feature_shape:
            n *= dim
        return n

    @property
    def label_bytes(self) -> int:
        """Bytes of one row's target: an int64 class, ``target_width`` float32 values, or nothing."""
        return {"classes": 8, "values": 4 * self.target_width, "none": 0}[self.target]


def token_dtype(vocab_size: int) -> TokenDtype:
    """The narrowest token type that holds every token of the vocabulary."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


class TokenLayout(Record):
    """A tokenized corpus: flat little-endian token files, documents separated by ``eot``.

    ``bpe``: the trained tokenizer's JSON is one file of the dataset (``tokenizer_file``); the manifest names it
    by CID (``tokenizer_cid``, filled in once the directory is stored)."""

    dtype: TokenDtype = "uint16"
    vocab_size: int = Field(ge=2, le=MAX_VOCAB)
    eot: int = Field(ge=0, lt=MAX_VOCAB, description="the token between documents")
    tokenizer: Literal["bytes", "bpe"] = "bytes"
    tokenizer_file: RelPath | None = Field(default=None, description="the trained BPE's tokenizer.json")
    tokenizer_cid: Cid | None = Field(default=None, description="the CID of tokenizer_file (bpe)")

    @model_validator(mode="after")
    def _consistent(self) -> TokenLayout:
        # Strangers' layouts: a token type too narrow for the vocabulary would wrap tokens around.
        if self.dtype != token_dtype(self.vocab_size):
            raise ValueError(f"a vocabulary of {self.vocab_size} is stored as {token_dtype(self.vocab_size)}, "
                             f"not {self.dtype}")
        if self.eot >= self.vocab_size:
            raise ValueError(f"the document separator {self.eot} is outside the vocabulary of {self.vocab_size}")
        if (self.tokenizer == "bpe") != (self.tokenizer_file is not None) or (
                self.tokenizer_cid is not None and self.tokenizer_file is None):
            raise ValueError("a bpe corpus names its tokenizer file; a byte-level one has none")
        return self

    @model_serializer(mode="wrap")
    def _without_absent_cid(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A byte-level layout serializes as before this field existed: its records keep their bytes and CIDs.
        data = handler(self)
        if self.tokenizer_cid is None:
            data.pop("tokenizer_cid", None)
        return data

    @property
    def itemsize(self) -> int:
        return 2 if self.dtype == "uint16" else 4


class SealedLayout(Record):
    """The dataset's files are stored sealed (``storage.sealed``): a shard's slices are plaintext ranges, read by
    fetching the sealed header and the chunks that cover them; ``DatasetFile.size`` stays the plaintext size."""

    chunk_size: int = Field(ge=4096, le=1 << 26)
    context: str = Field(default="aitbc-dataset/1", max_length=64, description="prefix of each file's sealing context")

    def file_context(self, path: str) -> bytes:
        return f"{self.context}\0{path}".encode()


class ImageLayout(Record):
    """Images are decoded by the task's loader: the built-ins resize to ``size`` with ``channels`` channels."""

    size: tuple[Annotated[int, Field(ge=1, le=1024)], Annotated[int, Field(ge=1, le=1024)]] = (32, 32)
    channels: Literal[1, 3] = 3


class DatasetManifest(Record):
    """The root of a dataset: the directory its files are in (a UnixFS CID, kubo's) and what they are."""

    format: Literal["aitbc-dataset/1"] = DATASET_FORMAT
    kind: DatasetKind
    root: Cid = Field(description="the directory of the files, as `ipfs add -r` gives it")
    files: tuple[DatasetFile, ...] = Field(min_length=1, max_length=MAX_DATASET_FILES)
    classes: tuple[Annotated[str, Field(max_length=limits.NAME_MAX_LENGTH)], ...] = Field(
        default=(), max_length=limits.MAX_CLASSES, description="images: the class names, index order")
    arrays: ArrayLayout | None = None
    tokens: TokenLayout | None = None
    images: ImageLayout | None = None
    sealed: SealedLayout | None = None

    @model_validator(mode="after")
    def _consistent(self) -> DatasetManifest:
        paths = [f.path for f in self.files]
        if len(set(paths)) != len(paths):
            raise ValueError("a dataset lists the same path twice")
        if (self.kind == "arrays") != (self.arrays is not None) or (self.kind == "tokens") != (self.tokens is not None):
            raise ValueError(f"a {self.kind} dataset needs exactly its own layout")
        if self.kind == "images":
            if self.images is None or len(self.classes) < 2 or any(f.label is None or f.label >= len(self.classes) for f in self.files):
                raise ValueError("an image dataset needs >= 2 classes and a valid label on every file")
        if self.arrays is not None:
            sizes = {f.path: f.size for f in self.files}
            a = self.arrays
            labels_ok = a.labels is None or sizes.get(a.labels) == a.rows * a.label_bytes
            if sizes.get(a.features) != a.rows * a.row_bytes or not labels_ok:
                raise ValueError("the array files' sizes do not match the rows the layout declares")
        if self.tokens is not None and any(f.size % self.tokens.itemsize for f in self.files
                                           if f.path != self.tokens.tokenizer_file):
            raise ValueError("a token file's size is not a whole number of tokens")
        if self.tokens is not None and self.tokens.tokenizer_file is not None:
            found = [f for f in self.files if f.path == self.tokens.tokenizer_file]
            if not found or found[0].cid != self.tokens.tokenizer_cid or found[0].size > MAX_TOKENIZER_BYTES:
                raise ValueError("a bpe dataset holds its tokenizer file (at most "
                                 f"{MAX_TOKENIZER_BYTES} bytes) under the CID its layout names")
        return self

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def file(self, path: str) -> DatasetFile:
        for f in self.files:
            if f.path == path:
                return f
        raise KeyError(path)


class FileSlice(Record):
    """Bytes ``[offset, offset + length)`` of one file of the dataset."""

    path: RelPath
    cid: Cid
    offset: int = Field(ge=0, le=MAX_DATASET_BYTES)
    length: int = Field(ge=1, le=MAX_DATASET_BYTES)
    file_size: int | None = Field(default=None, ge=1, le=MAX_DATASET_BYTES,
                                  description="a sealed file's plaintext size: which of its chunks is the last")

    @model_validator(mode="after")
    def _inside(self) -> FileSlice:
        if self.file_size is not None and self.offset + self.length > self.file_size:
            raise ValueError("a slice ends past its file")
        return self

    @property
    def end(self) -> int:
        return self.offset + self.length


class DataSlices(Record):
    """What one shard (or the test split) is: slices of the dataset's files, in order."""

    slices: tuple[FileSlice, ...] = Field(min_length=1, max_length=MAX_SLICES)
    samples: int = Field(ge=1, description="rows, images or tokens")

    @property
    def bytes(self) -> int:
        return sum(s.length for s in self.slices)

    def check_within(self, manifest: DatasetManifest) -> None:
        """Every slice names a file of ``manifest`` by its CID and stays inside it."""
        for s in self.slices:
            try:
                f = manifest.file(s.path)
            except KeyError:
                raise ValueError(f"slice of {s.path!r}, which the dataset does not hold") from None
            if f.cid != s.cid or s.end > f.size:
                raise ValueError(f"slice {s.path}[{s.offset}:{s.end}] does not fit the dataset's file")


class ShardData(Record):
    """A shard (or the test split) as a job carries it: the data's kind and layout, and its slices.

    A provider writes slice ``i`` to ``part-{i:06d}`` in its job directory: the names on disk come
    from the index, never from ``path``, which only tells a task which file a slice came from.
    """

    kind: DatasetKind
    data: DataSlices
    classes: tuple[Annotated[str, Field(max_length=limits.NAME_MAX_LENGTH)], ...] = Field(
        default=(), max_length=limits.MAX_CLASSES)
    labels: tuple[Annotated[int, Field(ge=0, lt=limits.MAX_CLASSES)], ...] = Field(
        default=(), max_length=MAX_SLICES, description="images: each slice's class")
    arrays: ArrayLayout | None = None
    tokens: TokenLayout | None = None
    images: ImageLayout | None = None
    sealed: SealedLayout | None = None
    dataset: Cid | None = Field(default=None, description="the dataset's directory: names its key when sealed")

    @model_validator(mode="after")
    def _consistent(self) -> ShardData:
        if (self.kind == "arrays") != (self.arrays is not None) or (self.kind == "tokens") != (self.tokens is not None):
            raise ValueError(f"a {self.kind} shard needs exactly its own layout")
        if self.kind == "images" and (self.images is None or len(self.labels) != len(self.data.slices)
                                      or any(label >= len(self.classes) for label in self.labels)):
            raise ValueError("an image shard needs its layout and a valid label per slice")
        if self.arrays is not None and self.arrays.labels is not None and len(self.data.slices) % 2:
            raise ValueError("an array shard pairs feature and label slices")
        if self.sealed is not None and (self.dataset is None or any(s.file_size is None for s in self.data.slices)):
            raise ValueError("a sealed shard names its dataset and each slice's file size")
        return self
