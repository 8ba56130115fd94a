import pytest
import torch

from aitbc_agent_sdk.errors import UnknownModelError
from aitbc_agent_sdk.records import ModelSpec
from aitbc_agent_sdk.data._datasets import LabeledData
from aitbc_agent_sdk.tasks._networks import MODEL_NAMES, build_model, fit_normalization, model_spec_for


def _data(n: int = 40, features: int = 64, classes: int = 10) -> LabeledData:
    g = torch.Generator().manual_seed(0)
    return LabeledData(torch.rand(n, features, generator=g) * 3 + 1, torch.arange(n) % classes, classes)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_forward_shape(name: str) -> None:
    data = _data()
    model = build_model(model_spec_for(name, data, hidden=32), seed=0)
    assert model(data.features[:7]).shape == (7, 10)


def test_registry_has_required_models() -> None:
    assert {"mlp", "cnn", "transformer"} <= set(MODEL_NAMES)


def test_mlp_is_the_benchmark_shape() -> None:
    model = build_model(model_spec_for("mlp", _data()))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert (128, 64) in shapes.values() and (10, 128) in shapes.values()
    assert sum(p.numel() for p in model.parameters()) == 64 * 128 + 128 + 128 * 10 + 10


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_seeded_init_is_deterministic(name: str) -> None:
    spec = model_spec_for(name, _data(), hidden=32)
    a, b, c = build_model(spec, seed=1), build_model(spec, seed=1), build_model(spec, seed=2)
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    assert any(not torch.equal(v, c.state_dict()[k]) for k, v in a.state_dict().items())


def test_seeded_init_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_model(model_spec_for("mlp", _data()), seed=9)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_normalization_buffers_travel_in_state_dict(name: str) -> None:
    data = _data()
    model = build_model(model_spec_for(name, data, hidden=32), seed=0)
    fit_normalization(model, data)
    state = model.state_dict()
    assert "norm.mean" in state and "norm.std" in state
    torch.testing.assert_close(state["norm.mean"], data.features.mean(0))
    torch.testing.assert_close(state["norm.std"], data.features.std(0, unbiased=False))
    assert "norm.mean" not in dict(model.named_parameters())  # buffers, not trained
    # Loading into a fresh model carries the statistics over.
    fresh = build_model(model_spec_for(name, data, hidden=32), seed=0)
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh(data.features[:3]), model(data.features[:3]))


def test_normalization_floors_constant_features() -> None:
    data = _data()
    data.features[:, 0] = 0.5
    model = build_model(model_spec_for("mlp", data), seed=0)
    fit_normalization(model, data)
    assert float(model.state_dict()["norm.std"][0]) > 0
    assert torch.isfinite(model(data.features)).all()


def test_fit_normalization_rejects_wrong_shape() -> None:
    model = build_model(model_spec_for("mlp", _data()), seed=0)
    with pytest.raises(ValueError, match="expects features"):
        fit_normalization(model, _data(features=10))


def test_unknown_model_lists_valid_names() -> None:
    with pytest.raises(UnknownModelError, match=r"'resnet'.*mlp.*cnn.*transformer"):
        model_spec_for("resnet", _data())
    with pytest.raises(UnknownModelError, match="resnet"):
        build_model(ModelSpec(name="resnet", input_shape=(64,), num_classes=10))


def test_cnn_rejects_non_square_features() -> None:
    with pytest.raises(UnknownModelError, match="square"):
        model_spec_for("cnn", _data(features=10))
    # mlp and transformer accept any feature count
    for name in ("mlp", "transformer"):
        model = build_model(model_spec_for(name, _data(features=10), hidden=32), seed=0)
        assert model(torch.rand(2, 10)).shape == (2, 10)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_forward_applies_normalization_first(name: str) -> None:
    # With stats refit, the model cannot tell data from an affine rescaling of it.
    data = _data()
    scaled = LabeledData(data.features * 5 - 2, data.labels, data.num_classes)
    a = build_model(model_spec_for(name, data, hidden=32), seed=0)
    b = build_model(model_spec_for(name, data, hidden=32), seed=0)
    fit_normalization(a, data)
    fit_normalization(b, scaled)
    torch.testing.assert_close(a(data.features), b(scaled.features), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(a(data.features), a(scaled.features), atol=1e-2)
