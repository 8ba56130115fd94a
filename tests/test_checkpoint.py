import pytest
import torch

from aitbc_agent_sdk.errors import TrainingError
from aitbc_agent_sdk.wire._checkpoint import decode_data, decode_metadata, decode_state, encode_data, encode_state
from aitbc_agent_sdk.data._datasets import LabeledData
from aitbc_agent_sdk.tasks._networks import build_model, model_spec_for


def test_state_round_trip_with_metadata() -> None:
    data = LabeledData(torch.rand(10, 64), torch.arange(10), 10)
    model = build_model(model_spec_for("cnn", data, hidden=32), seed=0)
    state = model.state_dict()
    blob = encode_state(state, {"round": "3", "worker": "0xabc"})
    assert isinstance(blob, bytes)
    decoded = decode_state(blob)
    assert decoded.keys() == state.keys()
    for key in state:
        assert torch.equal(decoded[key], state[key]) and decoded[key].dtype == state[key].dtype
    assert decode_metadata(blob) == {"round": "3", "worker": "0xabc"}
    build_model(model_spec_for("cnn", data, hidden=32)).load_state_dict(decoded)


def test_mixed_dtypes_and_non_contiguous() -> None:
    state = {"i": torch.tensor(7), "h": torch.rand(3).half(), "t": torch.rand(4, 3).t()}
    decoded = decode_state(encode_state(state))
    for key in state:
        assert torch.equal(decoded[key], state[key])
    assert decode_metadata(encode_state(state)) == {}


def test_metadata_must_be_strings() -> None:
    with pytest.raises(TypeError):
        encode_state({"a": torch.zeros(1)}, {"round": 3})  # type: ignore[dict-item]


@pytest.mark.parametrize("blob", [b"", b"garbage", b"\xff" * 8 + b"{}", b"\x02\x00\x00\x00\x00\x00\x00\x00{x"])
def test_malformed_blob_raises_training_error(blob: bytes) -> None:
    with pytest.raises(TrainingError, match="malformed"):
        decode_state(blob)
    with pytest.raises(TrainingError, match="malformed"):
        decode_metadata(blob)


def test_truncated_blob_raises() -> None:
    blob = encode_state({"w": torch.rand(100)})
    with pytest.raises(TrainingError, match="malformed"):
        decode_state(blob[:-10])


def test_data_round_trip() -> None:
    data = LabeledData(torch.rand(6, 8, 8), torch.tensor([0, 1, 2, 0, 1, 3]), 5)
    back = decode_data(encode_data(data))
    assert torch.equal(back.features, data.features) and torch.equal(back.labels, data.labels)
    assert back.num_classes == 5 and back.feature_shape == (8, 8)


def test_decode_data_rejects_a_model_state() -> None:
    with pytest.raises(TrainingError, match="not an encoded dataset"):
        decode_data(encode_state({"w": torch.zeros(2)}))
    bad = encode_state({"x": torch.zeros(2, 1), "y": torch.tensor([0, 9])}, {"num_classes": "3"})
    with pytest.raises(TrainingError, match="outside num_classes"):
        decode_data(bad)
