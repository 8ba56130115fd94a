"""Model states and datasets as safetensors bytes: no pickle, so a blob from an
untrusted worker can be decoded without running its code."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from aitbc_agent_sdk.errors import TrainingError
from aitbc_agent_sdk.limits import MAX_CLASSES
from aitbc_agent_sdk.data._datasets import LabeledData

# safetensors header is an 8-byte little-endian length followed by JSON.
_HEADER_LEN = struct.Struct("<Q")


def encode_state(state: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> bytes:
    """Serialize a state dict (tensors are made contiguous CPU copies as needed)."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    meta = dict(metadata) if metadata else None
    if meta is not None:
        bad = [k for k, v in meta.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise TypeError(f"metadata keys and values must be str; bad keys: {bad}")
    return save(tensors, metadata=meta)


def decode_state(blob: bytes) -> dict[str, torch.Tensor]:
    """Parse a safetensors blob; anything malformed raises TrainingError."""
    try:
        return load(bytes(blob))
    except (SafetensorError, ValueError, RuntimeError, OverflowError) as exc:
        raise TrainingError(f"malformed checkpoint ({len(blob)} bytes): {exc}") from exc


def decode_metadata(blob: bytes) -> dict[str, str]:
    """Read only the header's ``__metadata__`` without touching tensor data."""
    try:
        (size,) = _HEADER_LEN.unpack_from(blob, 0)
        if size > len(blob) - _HEADER_LEN.size:
            raise ValueError(f"header length {size} exceeds blob")
        header = json.loads(bytes(blob[_HEADER_LEN.size : _HEADER_LEN.size + size]))
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise TrainingError(f"malformed checkpoint header ({len(blob)} bytes): {exc}") from exc
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if meta is None:
        return {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise TrainingError("malformed checkpoint metadata: expected a str -> str map")
    return dict(meta)


def encode_data(data: LabeledData) -> bytes:
    """A dataset shard as tensors ``x``/``y`` plus ``num_classes`` in the metadata."""
    return encode_state(
        {"x": data.features, "y": data.labels},
        {"kind": "labeled_data", "num_classes": str(data.num_classes)},
    )


def decode_data(blob: bytes) -> LabeledData:
    tensors = decode_state(blob)
    meta = decode_metadata(blob)
    try:
        x, y, num_classes = tensors["x"], tensors["y"], int(meta["num_classes"])
    except (KeyError, ValueError) as exc:
        raise TrainingError(f"blob is not an encoded dataset (missing or bad {exc})") from exc
    if x.dtype != torch.float32 or y.dtype != torch.int64 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise TrainingError(
            f"encoded dataset has wrong layout: x {x.dtype}{tuple(x.shape)}, y {y.dtype}{tuple(y.shape)}"
        )
    if not 2 <= num_classes <= MAX_CLASSES or (len(y) and (int(y.min()) < 0 or int(y.max()) >= num_classes)):
        raise TrainingError(f"encoded dataset labels fall outside num_classes={num_classes}")
    return LabeledData(x, y, num_classes)
