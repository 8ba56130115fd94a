"""What a user brings, made into a dataset directory: which kind it is, what is staged, the manifest. Blocking.

* a ``.npz``/``.pt``/``.csv`` file (or a directory holding just one), or a bundled name: labelled
  arrays, rewritten once into ``x.f32``/``y.i64`` sorted by class (:mod:`._array_files`);
* a directory of ``*.txt`` files: a text corpus, tokenized once into token files (:mod:`._corpus`);
* a directory of ``CLASS/*.png|jpg``: an image folder, stored as it is (no copy, no re-encoding);
* any other directory: files the user's own task reads, stored as they are.

Staged output goes under ``staging`` and is removed by the caller once imported, so the store
holds each dataset once. Hidden files are skipped everywhere, as ``ipfs add`` skips them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from aitbc_agent_sdk.errors import DatasetError
from aitbc_agent_sdk.records._datasets import (
    IMAGE_SUFFIXES,
    ArrayLayout,
    DatasetFile,
    DatasetKind,
    DatasetManifest,
    ImageLayout,
    SealedLayout,
    TargetKind,
    TokenLayout,
)
from aitbc_agent_sdk.data._array_files import ARRAY_SUFFIXES, write_class_sorted, write_labeled
from aitbc_agent_sdk.data._corpus import TEXT_SUFFIXES, tokenize_corpus
from aitbc_agent_sdk.data._datasets import DATASET_NAMES, LabeledData, load_dataset


class PreparedDataset(BaseModel):
    """What to import and how to describe it; saved beside a staged directory, so a rerun reuses it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: DatasetKind
    directory: Path  # what is imported into the store
    staged: bool  # ``directory`` was written here (and is removed after the import)
    arrays: ArrayLayout | None = None
    tokens: TokenLayout | None = None
    images: ImageLayout | None = None
    classes: tuple[str, ...] = ()


def visible_files(root: Path) -> list[Path]:
    return sorted((p for p in root.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(root).parts)),
                  key=lambda p: p.relative_to(root).as_posix())


def dataset_kind(source: Path) -> DatasetKind:
    """The kind of dataset ``source`` is, by its files' names (nothing is read)."""
    if source.is_file():
        if source.suffix.lower() not in ARRAY_SUFFIXES:
            raise DatasetError(f"{source}: unknown extension {source.suffix!r}; use .npz, .pt or .csv, or a directory")
        return "arrays"
    if not source.is_dir():
        raise DatasetError(f"{source}: no such file or directory, and not a bundled dataset {list(DATASET_NAMES)}")
    files = visible_files(source)
    if not files:
        raise DatasetError(f"{source}: the directory holds no (visible) files")
    suffixes = {p.suffix.lower() for p in files}
    if len(files) == 1 and files[0].suffix.lower() in ARRAY_SUFFIXES:
        return "arrays"
    if suffixes <= set(TEXT_SUFFIXES):
        return "tokens"
    depths = {len(p.relative_to(source).parts) for p in files}
    if suffixes <= set(IMAGE_SUFFIXES) and depths == {2} and len(image_classes(source)) >= 2:
        return "images"
    return "files"


def image_classes(root: Path) -> tuple[str, ...]:
    return tuple(sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")))


def prepare_dataset(source: str | Path | LabeledData, staging: Path, *, label_column: str | None = None,
                    kind: DatasetKind | None = None, image_size: tuple[int, int] = (32, 32),
                    target: TargetKind | None = None, vocab_size: int | None = None) -> PreparedDataset:
    """Stage (or point at) the directory to import for ``source``; ``target``: the arrays' target kind (None:
    detected from the data); ``vocab_size``: a text corpus's BPE vocabulary (None or 256: byte-level tokens)."""
    if isinstance(source, LabeledData) or (isinstance(source, str) and source in DATASET_NAMES):
        data = source if isinstance(source, LabeledData) else load_dataset(source)
        labels = None if data.target == "none" else data.labels.numpy()
        layout = write_labeled(data.features.numpy(), labels, staging, target=target or data.target)
        return PreparedDataset(kind="arrays", directory=staging, staged=True, arrays=layout)
    path = Path(source)
    found = kind or dataset_kind(path)
    if vocab_size is not None and found != "tokens":
        raise DatasetError(f"{path}: a vocabulary size applies to a text corpus (.txt files), not to {found} data")
    if found == "arrays":
        file = path if path.is_file() else visible_files(path)[0]
        layout = write_class_sorted(file, staging, label_column=label_column, target=target)
        return PreparedDataset(kind="arrays", directory=staging, staged=True, arrays=layout)
    if not path.is_dir():
        raise DatasetError(f"{path}: a {found} dataset is a directory")
    if found == "tokens":
        layout, _ = tokenize_corpus(path, staging, vocab_size=vocab_size)
        return PreparedDataset(kind="tokens", directory=staging, staged=True, tokens=layout)
    if found == "images":
        return PreparedDataset(kind="images", directory=path, staged=False, images=ImageLayout(size=image_size),
                               classes=image_classes(path))
    return PreparedDataset(kind="files", directory=path, staged=False)


def build_manifest(prepared: PreparedDataset, root: str, entries: list[tuple[str, str, int]], *,
                   sealed: SealedLayout | None = None) -> DatasetManifest:
    """The manifest of the imported directory ``root``, from its files as (path, CID, plaintext size)."""
    label_of = {name: i for i, name in enumerate(prepared.classes)}
    files = []
    for path, cid, size in entries:
        label = label_of.get(path.split("/", 1)[0]) if prepared.kind == "images" else None
        files.append(DatasetFile(path=path, cid=cid, size=size, label=label))
    tokens = prepared.tokens
    if tokens is not None and tokens.tokenizer_file is not None:  # the tokenizer's CID is known once it is stored
        cid = next((f.cid for f in files if f.path == tokens.tokenizer_file), None)
        tokens = tokens.model_copy(update={"tokenizer_cid": cid})
    try:
        return DatasetManifest(kind=prepared.kind, root=root, files=tuple(files), classes=prepared.classes,
                               arrays=prepared.arrays, tokens=tokens, images=prepared.images,
                               sealed=sealed)
    except ValueError as exc:
        where = "" if prepared.staged else f" in {prepared.directory}"  # a staging directory means nothing to users
        raise DatasetError(f"the dataset{where} cannot be described: {exc}") from exc


@dataclass(frozen=True)
class DataShape:
    """What a model is built for, known from the manifest before any data is read."""

    feature_shape: tuple[int, ...]
    num_classes: int
    samples: int
    target: TargetKind = "classes"
    target_width: int = 1


def manifest_shape(manifest: DatasetManifest) -> DataShape:
    if manifest.arrays is not None:
        a = manifest.arrays
        return DataShape(tuple(a.feature_shape), a.num_classes, a.rows, a.target, a.target_width)
    if manifest.images is not None:
        size = manifest.images.size
        return DataShape((manifest.images.channels, *size), len(manifest.classes), len(manifest.files))
    if manifest.tokens is not None:
        layout = manifest.tokens
        token_bytes = sum(f.size for f in manifest.files if f.path != layout.tokenizer_file)
        return DataShape((1,), layout.vocab_size, token_bytes // layout.itemsize)
    return DataShape((1,), 2, len(manifest.files))
