"""A shard on disk: ``shard.json`` (its :class:`ShardData`) and one ``part-NNNNNN`` file per slice.

The provider's job directory and the coordinator's test split share this layout, and
:func:`load_shard` turns it into what a task trains on: :class:`LabeledData` for arrays and
images (images decoded with Pillow at the layout's size), :class:`TokenData` (memory-mapped,
scanned once for tokens outside the vocabulary) for a token corpus, :class:`DataFiles` for anything else, which the
user's task reads itself. The bytes come from strangers: every part's size is checked against
its slice, labels against the classes, features for NaN; image headers are bounded before decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from aitbc_agent_sdk.errors import DatasetError
from aitbc_agent_sdk.records._datasets import ArrayLayout, ShardData
from aitbc_agent_sdk.data._datasets import LabeledData

SHARD_INFO = "shard.json"
MAX_IMAGE_PIXELS = 1 << 26  # 64 Mpx: a header that claims more is refused before decoding
_SCAN = 1 << 22  # tokens checked at a time


def part_name(index: int) -> str:
    return f"part-{index:06d}"


@dataclass(frozen=True)
class TokenData:
    """A token stream as memory maps of its parts (documents separated by ``eot``)."""

    parts: tuple[np.ndarray, ...]
    vocab_size: int
    eot: int

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    @property
    def feature_shape(self) -> tuple[int, ...]:  # DataInfo: one token in, one of ``vocab_size`` out
        return (1,)

    @property
    def num_classes(self) -> int:
        return self.vocab_size

    target = "classes"  # DataInfo: the next token is a class of the vocabulary
    target_width = 1


@dataclass(frozen=True)
class DataFiles:
    """Files of a dataset the SDK does not interpret: local paths, and the dataset path each came from."""

    paths: tuple[Path, ...]
    names: tuple[str, ...]
    feature_shape: tuple[int, ...] = (1,)
    num_classes: int = 2
    target: str = "classes"  # DataInfo's defaults: the user's task decides what the files hold
    target_width: int = 1

    def __len__(self) -> int:
        return len(self.paths)


ShardContent = LabeledData | TokenData | DataFiles


def drawn_samples(content: ShardContent, n: int, seed: int) -> ShardContent:
    """At most ``n`` samples of labelled data drawn with ``seed`` (a result's check: the coordinator draws
    the seed in secret each round); a token stream or files whole: the task draws from them with the seed
    its ``checking_params`` take."""
    if isinstance(content, LabeledData):
        count = min(n, len(content))
        return content.subset(np.sort(np.random.default_rng(seed).choice(len(content), count, replace=False)))
    return content


def _parts(directory: Path, shard: ShardData) -> list[Path]:
    paths = [directory / part_name(i) for i in range(len(shard.data.slices))]
    for path, piece in zip(paths, shard.data.slices, strict=True):
        if not path.is_file() or path.stat().st_size != piece.length:
            raise DatasetError(f"{path.name}: expected {piece.length} bytes of {piece.path}")
    return paths


def _arrays(paths: list[Path], shard: ShardData) -> LabeledData:
    layout = shard.arrays
    assert layout is not None
    labelled = layout.labels is not None
    half = len(paths) // 2 if labelled else len(paths)
    x = np.concatenate([np.fromfile(p, dtype="<f4") for p in paths[:half]]).reshape(-1, *layout.feature_shape)
    if len(x) != shard.data.samples:
        raise DatasetError(f"shard holds {len(x)} rows; it declares {shard.data.samples}")
    if not np.isfinite(x).all():
        raise DatasetError("shard features contain NaN or infinity")
    features = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    if layout.target == "none":
        return LabeledData(features, torch.zeros((len(x), 0)), 0, "none")
    if layout.target == "values":
        # The part sizes were checked against the slices; the slices must hold width floats per row.
        values = np.concatenate([np.fromfile(p, dtype="<f4") for p in paths[half:]])
        if len(values) != len(x) * layout.target_width:
            raise DatasetError(f"shard holds {len(values)} target values for {len(x)} rows of width "
                               f"{layout.target_width}")
        if not np.isfinite(values).all():
            raise DatasetError("shard targets contain NaN or infinity")
        return LabeledData(features, torch.from_numpy(values.reshape(len(x), layout.target_width).copy()), 0, "values")
    y = np.concatenate([np.fromfile(p, dtype="<i8") for p in paths[half:]])
    if len(x) != len(y):
        raise DatasetError(f"shard holds {len(x)} rows and {len(y)} labels; it declares {shard.data.samples}")
    if len(y) and (y.min() < 0 or y.max() >= layout.num_classes):
        raise DatasetError(f"shard labels fall outside the {layout.num_classes} classes")
    return LabeledData(features, torch.from_numpy(y), layout.num_classes)


def decode_image(path: Path, size: tuple[int, int], channels: int) -> np.ndarray:
    """One image as float32 [channels, height, width] in [0, 1]."""
    from PIL import Image, UnidentifiedImageError  # noqa: PLC0415 (only image datasets pay the import)

    try:
        with Image.open(path) as img:
            if img.width * img.height > MAX_IMAGE_PIXELS:
                raise DatasetError(f"{path.name}: {img.width}x{img.height} pixels is above the limit")
            img.draft("RGB" if channels == 3 else "L", size)  # JPEG: decode at a reduced size
            pixels = img.convert("RGB" if channels == 3 else "L").resize((size[1], size[0]))
            arr = np.asarray(pixels, dtype=np.float32) / 255.0
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as exc:
        raise DatasetError(f"{path.name}: not a readable image ({exc})") from exc
    return arr.reshape(size[0], size[1], channels).transpose(2, 0, 1)


def _images(paths: list[Path], shard: ShardData) -> LabeledData:
    layout = shard.images
    assert layout is not None
    x = np.stack([decode_image(p, layout.size, layout.channels) for p in paths])
    return LabeledData(torch.from_numpy(x), torch.tensor(shard.labels, dtype=torch.int64), len(shard.classes))


def _tokens(paths: list[Path], shard: ShardData) -> TokenData:
    layout = shard.tokens
    assert layout is not None  # its dtype fits its vocabulary: TokenLayout checks that
    dtype = "<u2" if layout.dtype == "uint16" else "<u4"
    parts = tuple(np.memmap(p, dtype=dtype, mode="r") for p in paths if p.stat().st_size)
    for part in parts:
        check_tokens(part, layout.vocab_size)
    return TokenData(parts, layout.vocab_size, layout.eot)


def check_tokens(tokens: np.ndarray, vocab_size: int) -> None:
    """DatasetError for a token outside the vocabulary: strangers' bytes, and an embedding would crash (on a
    GPU, with a device-side assert that poisons the process). One sequential pass, a block at a time."""
    if vocab_size > np.iinfo(tokens.dtype).max:
        return  # every value of the type is a token
    for start in range(0, len(tokens), _SCAN):
        top = int(tokens[start : start + _SCAN].max())
        if top >= vocab_size:
            raise DatasetError(f"the token dataset holds token {top}, outside its vocabulary of {vocab_size}")


def load_shard(directory: Path, shard: ShardData | None = None) -> ShardContent:
    """The shard in ``directory`` (its ``shard.json`` unless ``shard`` is given) as a task trains on it."""
    if shard is None:
        try:
            shard = ShardData.model_validate_json((directory / SHARD_INFO).read_bytes())
        except (OSError, ValueError) as exc:
            raise DatasetError(f"{directory}: no valid {SHARD_INFO} ({exc})") from exc
    return _LOADERS[shard.kind](_parts(directory, shard), shard)


def _files(paths: list[Path], shard: ShardData) -> DataFiles:
    return DataFiles(tuple(paths), tuple(s.path for s in shard.data.slices))


_LOADERS = {"arrays": _arrays, "images": _images, "tokens": _tokens, "files": _files}


def write_shard(directory: Path, data: LabeledData) -> ShardData:
    """Labelled data already in memory written as an arrays shard in ``directory`` (a job directory's
    layout): what a test or a benchmark hands a training process without a content store."""
    from aitbc_agent_sdk.records._datasets import DataSlices, FileSlice  # noqa: PLC0415
    from aitbc_agent_sdk.storage._unixfs import compute_cid  # noqa: PLC0415

    x = np.ascontiguousarray(data.features.numpy(), dtype="<f4").tobytes()
    layout = data_layout(data)
    y = target_bytes(data)
    slices = (FileSlice(path=layout.features, cid=compute_cid(x), offset=0, length=len(x)),
              *((FileSlice(path=layout.labels, cid=compute_cid(y), offset=0, length=len(y)),) if layout.labels else ()))
    shard = ShardData(kind="arrays", data=DataSlices(slices=slices, samples=len(data)), arrays=layout)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / part_name(0)).write_bytes(x)
    if layout.labels:
        (directory / part_name(1)).write_bytes(y)
    (directory / SHARD_INFO).write_text(shard.model_dump_json())
    return shard


def target_bytes(data: LabeledData) -> bytes:
    """The target file's bytes of ``data`` (int64 classes or float32 values; none: empty). Pure."""
    dtype = "<i8" if data.target == "classes" else "<f4"
    return np.ascontiguousarray(data.labels.numpy(), dtype=dtype).tobytes()


def data_layout(data: LabeledData) -> ArrayLayout:
    """The layout of ``data`` written as one arrays shard (its rows in the order given). Pure."""
    shape = data.feature_shape
    if data.target == "classes":
        counts = np.bincount(data.labels.numpy(), minlength=data.num_classes)
        return ArrayLayout(feature_shape=shape, num_classes=data.num_classes, class_rows=tuple(int(c) for c in counts))
    return ArrayLayout(feature_shape=shape, labels="y.f32" if data.target == "values" else None, target=data.target,
                       target_width=data.target_width, num_classes=0, class_rows=(len(data),))
