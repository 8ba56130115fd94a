"""The update codec: weights or deltas as float32, bf16 or blockwise int8, and what it refuses."""

from __future__ import annotations

import re

import pytest
import torch

from aitbc_agent_sdk.coordinator.checks._verification import checkpoint_problem
from aitbc_agent_sdk.errors import TrainingError
from aitbc_agent_sdk.wire._checkpoint import decode_state, encode_state
from aitbc_agent_sdk.wire._update_codec import (
    DELTA,
    INT8_BLOCK,
    SCALES,
    decode_residual,
    decode_update,
    encode_residual,
    encode_update,
    encoded_bytes,
    update_delta,
)


def states(seed: int = 0, scale: float = 0.01) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(seed)
    reference = {"w": torch.randn(33, 17, generator=g), "b": torch.randn(300, generator=g),
                 "steps": torch.tensor(7, dtype=torch.int64)}
    trained = {k: (v + scale * torch.randn(v.shape, generator=g) if v.is_floating_point() else v + 1)
               for k, v in reference.items()}
    return reference, trained


@pytest.mark.parametrize("encoding,tolerance", [("float32", 1e-6), ("bf16", 1e-2 * 0.05)])
def test_float_round_trip(encoding: str, tolerance: float) -> None:
    reference, trained = states()
    blob, residual = encode_update(trained, reference, encoding)
    decoded = decode_update(blob, reference, encoding)
    assert list(decoded) == list(reference) and decoded["steps"].item() == 8
    for k in ("w", "b"):
        assert decoded[k].dtype == torch.float32
        assert (decoded[k] - trained[k]).abs().max().item() <= tolerance
    assert (residual is None) == (encoding == "float32")


def test_int8_error_is_at_most_half_a_scale() -> None:
    reference, trained = states()
    blob, residual = encode_update(trained, reference, "int8")
    sent = decode_state(blob)
    delta = update_delta(trained, reference)
    vector = torch.cat([delta[k].reshape(-1) for k in sorted(delta)])
    scales = sent[SCALES].repeat_interleave(INT8_BLOCK)[: vector.numel()]
    decoded = decode_update(blob, reference, "int8")
    error = torch.cat([(decoded[k] - trained[k]).reshape(-1) for k in sorted(delta)])
    assert sent[DELTA].dtype == torch.int8 and sent[DELTA].numel() == vector.numel()
    assert bool((error.abs() <= scales / 2 + 1e-6).all())
    back = torch.cat([residual[k].reshape(-1) for k in sorted(delta)])
    assert torch.allclose(back, -error, atol=1e-6)  # the residual is exactly what rounding lost


def test_weights_is_the_checkpoint_itself() -> None:
    reference, trained = states()
    blob, residual = encode_update(trained, reference, "weights")
    assert residual is None
    assert all(torch.equal(decode_update(blob, reference, "weights")[k], trained[k]) for k in trained)
    plain = encode_state(trained)  # today's checkpoint, with no encoding in its metadata
    assert torch.equal(decode_update(plain, reference, "weights")["w"], trained["w"])


def test_error_feedback_tracks_the_true_sum() -> None:
    reference, _ = states()
    g = torch.Generator().manual_seed(1)
    true_sum = torch.zeros_like(reference["w"])
    sent_sum = torch.zeros_like(reference["w"])
    residual, plain_sum = None, torch.zeros_like(reference["w"])
    for _ in range(40):
        trained = {**reference, "w": reference["w"] + 1e-3 * torch.randn(reference["w"].shape, generator=g)
                   + 1e-4}  # a small bias each round: what rounding without feedback keeps losing
        blob, residual = encode_update(trained, reference, "int8", residual=residual)
        sent_sum += decode_update(blob, reference, "int8")["w"] - reference["w"]
        plain = decode_update(encode_update(trained, reference, "int8")[0], reference, "int8")
        plain_sum += plain["w"] - reference["w"]
        true_sum += trained["w"] - reference["w"]
    with_feedback = (sent_sum - true_sum).abs().max().item()
    assert with_feedback <= 1e-3 / 127 * 4  # bounded by one round's rounding, not growing with rounds
    assert with_feedback < (plain_sum - true_sum).abs().max().item()


def test_int8_is_about_a_quarter_of_float32() -> None:
    numel = 1_000_000
    assert encoded_bytes(numel, "float32") == 4 * numel and encoded_bytes(numel, "bf16") == 2 * numel
    assert encoded_bytes(numel, "int8") <= 0.27 * encoded_bytes(numel, "float32")
    reference = {"w": torch.zeros(numel)}
    trained = {"w": torch.randn(numel)}
    int8 = len(encode_update(trained, reference, "int8")[0])
    float32 = len(encode_update(trained, reference, "float32")[0])
    assert int8 <= 0.27 * float32


def hostile(blob_tensors: dict, metadata: dict) -> bytes:
    return encode_state(blob_tensors, metadata)


def test_hostile_blobs_are_refused() -> None:
    reference, trained = states()
    blob, _ = encode_update(trained, reference, "int8")
    good, n = decode_state(blob), 33 * 17 + 300
    meta = {"update_encoding": "int8", "int8_block": str(INT8_BLOCK)}
    cases = {
        "encoded as 'float32'": encode_update(trained, reference, "float32")[0],
        "int8_block": hostile(good, {**meta, "int8_block": "128"}),
        "expected int8": hostile({**good, DELTA: good[DELTA][:-1]}, meta),
        "negative": hostile({**good, SCALES: -good[SCALES]}, meta),
        "extra": hostile({**good, "evil": torch.zeros(1)}, meta),
        "missing": hostile({DELTA: good[DELTA], SCALES: good[SCALES]}, meta),
        "steps": hostile({**good, "steps": torch.tensor(1.0)}, meta),
        "malformed": blob[: len(blob) // 2],
    }
    for expected, bad in cases.items():
        with pytest.raises(TrainingError, match=re.escape(expected)):
            decode_update(bad, reference, "int8")
    # Non-finite values decode into non-finite weights: the verification's rule for them is the one
    # for whole weights (a signed result that proves itself bad, so slashable), not a format error.
    nan_delta = hostile({"steps": good["steps"], DELTA: torch.full((n,), float("nan"))},
                        {"update_encoding": "float32"})
    nan_scales = hostile({**good, SCALES: torch.full_like(good[SCALES], float("nan"))}, meta)
    for bad, encoding in ((nan_delta, "float32"), (nan_scales, "int8")):
        assert "non-finite" in checkpoint_problem(decode_update(bad, reference, encoding), reference)
    wrong_shape = encode_state({**trained, "w": torch.zeros(17, 33)})
    with pytest.raises(TrainingError, match="'w'"):
        decode_update(wrong_shape, reference, "weights")
    with pytest.raises(TrainingError, match="unknown"):
        decode_update(blob, reference, "int4")


def test_residual_round_trip_and_misfit() -> None:
    reference, trained = states()
    _, residual = encode_update(trained, reference, "int8")
    back = decode_residual(encode_residual(residual), reference)
    assert back is not None and all(torch.equal(back[k], residual[k]) for k in residual)
    other = {"w": torch.zeros(3, 3), "b": torch.zeros(300), "steps": torch.tensor(0)}
    assert decode_residual(encode_residual(residual), other) is None
    assert decode_residual(b"not safetensors", reference) is None
