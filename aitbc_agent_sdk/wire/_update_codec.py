"""A worker's upload as bytes: its weights, or its change over the round (float32, bf16 or int8). Pure.

A delta upload holds ONE flat vector (the floating tensors' deltas in sorted key order), so the
safetensors header stays tiny whatever the model; non-floating tensors (counters) travel as they
are under their own names. int8 is blockwise: ``INT8_BLOCK`` values share one float32 scale
(absmax / 127), rounded to nearest. The lossy encodings return a residual (what rounding lost) that
the provider adds to next round's delta (error feedback), so nothing is lost for good.

The encoding and block size are in the blob's metadata, so they are part of the bytes a worker
signs (through the checkpoint CID). Decoding trusts nothing in the blob: a strange encoding,
length, dtype, key or scale raises ``TrainingError``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from aitbc_agent_sdk.errors import TrainingError
from aitbc_agent_sdk.records import UpdateEncoding
from aitbc_agent_sdk.wire._checkpoint import decode_metadata, decode_state, encode_state

INT8_BLOCK = 256
ENCODING_KEY = "update_encoding"
BLOCK_KEY = "int8_block"
DELTA = "__update__.delta"  # float32/bf16: the flat delta; int8: the quantized values
SCALES = "__update__.scales"  # int8: one float32 scale per block
_PAYLOAD_BYTES_PER_VALUE = {"weights": 4, "float32": 4, "bf16": 2, "int8": 1}


def _floating_keys(state: Mapping[str, Tensor]) -> list[str]:
    return sorted(k for k, v in state.items() if v.is_floating_point())


def update_delta(state: Mapping[str, Tensor], reference: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``state - reference`` in float32 for each floating tensor of the reference."""
    return {k: state[k].detach().float() - reference[k].detach().float() for k in _floating_keys(reference)}


def encoded_bytes(numel: int, encoding: UpdateEncoding) -> int:
    """Payload bytes of ``numel`` floating values in ``encoding`` (headers and counters left out)."""
    blocks = -(-numel // INT8_BLOCK) if encoding == "int8" else 0
    return numel * _PAYLOAD_BYTES_PER_VALUE[encoding] + 4 * blocks


def quantize_int8(vector: Tensor) -> tuple[Tensor, Tensor]:
    """Blockwise int8: values and one scale (absmax / 127) per ``INT8_BLOCK`` values."""
    n = vector.numel()
    pad = (-n) % INT8_BLOCK
    flat = vector.float()
    blocks = (torch.nn.functional.pad(flat, (0, pad)) if pad else flat).view(-1, INT8_BLOCK)
    low, high = torch.aminmax(blocks, dim=1)  # the absmax without a temporary |x| of the whole model
    scales = torch.maximum(high, low.neg()).div_(127.0)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.div(blocks, safe[:, None]).round_().clamp_(-127, 127).to(torch.int8).view(-1)
    return (q[:n].clone() if pad else q), scales


def dequantize_int8(q: Tensor, scales: Tensor) -> Tensor:
    n = q.numel()
    padded = torch.nn.functional.pad(q.float(), (0, (-n) % INT8_BLOCK)).view(-1, INT8_BLOCK)
    return (padded * scales[:, None]).view(-1)[:n]


class _CastWire:
    """The flat delta cast to one float dtype."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype, self.keys, self.metadata = dtype, (DELTA,), {}
        self.lossless = dtype == torch.float32

    def encode(self, vector: Tensor) -> dict[str, Tensor]:
        return {DELTA: vector.to(self.dtype)}

    def decode(self, tensors: Mapping[str, Tensor]) -> Tensor:
        return tensors[DELTA].float()

    def check(self, tensors: Mapping[str, Tensor], numel: int) -> None:
        delta = tensors[DELTA]
        if delta.dtype != self.dtype or delta.ndim != 1 or delta.numel() != numel:
            raise TrainingError(f"update vector is {delta.dtype}{tuple(delta.shape)}, expected {self.dtype}({numel},)")


class _Int8Wire:
    """Blockwise int8 values plus one float32 scale per block."""

    keys, lossless, metadata = (DELTA, SCALES), False, {BLOCK_KEY: str(INT8_BLOCK)}

    def encode(self, vector: Tensor) -> dict[str, Tensor]:
        q, scales = quantize_int8(vector)
        return {DELTA: q, SCALES: scales}

    def decode(self, tensors: Mapping[str, Tensor]) -> Tensor:
        return dequantize_int8(tensors[DELTA], tensors[SCALES])

    def check(self, tensors: Mapping[str, Tensor], numel: int) -> None:
        q, scales, blocks = tensors[DELTA], tensors[SCALES], -(-numel // INT8_BLOCK)
        if q.dtype != torch.int8 or q.ndim != 1 or q.numel() != numel:
            raise TrainingError(f"int8 update vector is {q.dtype}{tuple(q.shape)}, expected int8({numel},)")
        if scales.dtype != torch.float32 or scales.ndim != 1 or scales.numel() != blocks:
            raise TrainingError(f"int8 scales are {scales.dtype}{tuple(scales.shape)}, expected float32({blocks},)")
        if bool((scales < 0).any()):
            raise TrainingError("int8 update has a negative scale")
        if bool((q == -128).any()):
            raise TrainingError("int8 update holds -128, outside the symmetric range")


_WIRES: dict[str, _CastWire | _Int8Wire] = {
    "float32": _CastWire(torch.float32), "bf16": _CastWire(torch.bfloat16), "int8": _Int8Wire()}


def _wire(encoding: str) -> _CastWire | _Int8Wire:
    try:
        return _WIRES[encoding]
    except KeyError:
        raise TrainingError(f"unknown update encoding {encoding!r}") from None


def _unflatten(vector: Tensor, like: Mapping[str, Tensor], keys: list[str]) -> dict[str, Tensor]:
    out, at = {}, 0
    for k in keys:
        n = like[k].numel()
        out[k] = vector[at:at + n].view(like[k].shape)
        at += n
    return out


def encode_update(trained: Mapping[str, Tensor], reference: Mapping[str, Tensor], encoding: UpdateEncoding, *,
                  residual: Mapping[str, Tensor] | None = None,
                  metadata: Mapping[str, str] | None = None) -> tuple[bytes, dict[str, Tensor] | None]:
    """The upload's bytes and the new residual (None for lossless encodings)."""
    meta = {**(metadata or {}), ENCODING_KEY: encoding}
    if encoding == "weights":
        return encode_state(trained, meta), None
    wire = _wire(encoding)
    keys = _floating_keys(reference)
    delta = update_delta(trained, reference)
    if residual is not None:
        delta = {k: delta[k] + residual[k].float() for k in keys}
    vector = torch.cat([delta[k].reshape(-1) for k in keys]) if keys else torch.zeros(0)
    sent = wire.encode(vector)
    counters = {k: v.detach() for k, v in trained.items() if not v.is_floating_point()}
    blob = encode_state({**counters, **sent}, {**meta, **wire.metadata})
    if wire.lossless:
        return blob, None
    return blob, _unflatten(vector - wire.decode(sent), reference, keys)


def _check_metadata(blob: bytes, encoding: UpdateEncoding) -> None:
    meta = decode_metadata(blob)
    found = meta.get(ENCODING_KEY, "weights" if encoding == "weights" else None)
    if found != encoding:
        raise TrainingError(f"update is encoded as {found!r}, expected {encoding!r}")
    for key, want in ({} if encoding == "weights" else _WIRES[encoding].metadata).items():
        if meta.get(key) != want:
            raise TrainingError(f"{encoding} update has {key}={meta.get(key)!r}, expected {want!r}")


def _check_keys(found: Mapping[str, Tensor], expected: set[str]) -> None:
    if set(found) != expected:
        extra, missing = sorted(set(found) - expected), sorted(expected - set(found))
        raise TrainingError(f"update keys differ from the model's: extra {extra[:5]}, missing {missing[:5]}")


def _check_like(found: Mapping[str, Tensor], reference: Mapping[str, Tensor], keys: list[str]) -> None:
    for k in keys:
        got, want = found[k], reference[k]
        if got.dtype != want.dtype or got.shape != want.shape:
            raise TrainingError(f"update tensor {k!r} is {got.dtype}{tuple(got.shape)}, "
                                f"expected {want.dtype}{tuple(want.shape)}")


def _decode_weights(blob: bytes, reference: Mapping[str, Tensor]) -> dict[str, Tensor]:
    state = decode_state(blob)
    _check_keys(state, set(reference))
    _check_like(state, reference, sorted(reference))
    return state


def decode_update(blob: bytes, reference: Mapping[str, Tensor], encoding: UpdateEncoding) -> dict[str, Tensor]:
    """The worker's trained weights: the blob's own (``weights``), or ``reference`` + its decoded delta.

    Keys, shapes and dtypes are checked against ``reference`` for every encoding, so a decoded
    state always fits the model; whether its values are honest is the verification's business.
    """
    if encoding == "weights":
        _check_metadata(blob, encoding)
        return _decode_weights(blob, reference)
    wire = _wire(encoding)
    _check_metadata(blob, encoding)
    tensors = decode_state(blob)
    keys = _floating_keys(reference)
    counters = sorted(set(reference) - set(keys))
    _check_keys(tensors, {*counters, *wire.keys})
    _check_like(tensors, reference, counters)
    wire.check(tensors, sum(reference[k].numel() for k in keys))
    delta = _unflatten(wire.decode(tensors), reference, keys)
    out = {k: (reference[k].detach().float() + delta[k]).to(reference[k].dtype) for k in keys}
    out.update({k: tensors[k] for k in counters})
    return {k: out[k] for k in reference}


def encode_residual(residual: Mapping[str, Tensor]) -> bytes:
    """Error-feedback residual as safetensors bytes, for the provider's file between rounds."""
    return encode_state({k: v.float() for k, v in residual.items()}, {"kind": "update_residual"})


def decode_residual(blob: bytes, reference: Mapping[str, Tensor]) -> dict[str, Tensor] | None:
    """The residual back, or None when it does not fit ``reference`` (another model, a broken file)."""
    try:
        state = decode_state(blob)
    except TrainingError:
        return None
    keys = _floating_keys(reference)
    fits = set(state) == set(keys) and all(
        state[k].dtype == torch.float32 and state[k].shape == reference[k].shape
        and bool(torch.isfinite(state[k]).all()) for k in keys)
    return state if fits else None

