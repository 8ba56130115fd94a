import pytest
import torch

from aitbc_agent_sdk.aggregate._aggregation import FedAvg, sample_weights, weighted_average


def _fedavg(states, weights):
    agg = FedAvg()
    for s, w in zip(states, weights, strict=True):
        agg.accumulate(s, w)
    return agg.result()


def test_fedavg_matches_hand_computation() -> None:
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "b": torch.tensor([4.0]), "n": torch.tensor(7)}
    c = {"w": torch.tensor([-1.0, 0.0]), "b": torch.tensor([8.0]), "n": torch.tensor(5)}
    # weights 1, 2, 5 (sum 8):
    #   w = (1*[1,2] + 2*[3,6] + 5*[-1,0]) / 8 = [2, 14] / 8 = [0.25, 1.75]
    #   b = (0 + 8 + 40) / 8 = 6
    #   n = max(3, 7, 5) = 7 (integer counters are not averaged)
    out = _fedavg([a, b, c], [1, 2, 5])
    torch.testing.assert_close(out["w"], torch.tensor([0.25, 1.75]))
    torch.testing.assert_close(out["b"], torch.tensor([6.0]))
    assert out["n"].dtype == torch.int64 and int(out["n"]) == 7


def test_fedavg_does_not_mutate_inputs() -> None:
    a = {"w": torch.tensor([1.0, 2.0])}
    b = {"w": torch.tensor([3.0, 4.0])}
    _fedavg([a, b], [1.0, 3.0])
    assert a["w"].tolist() == [1.0, 2.0] and b["w"].tolist() == [3.0, 4.0]


def _random_states(k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "l1.weight": torch.randn(16, 8, generator=g),
            "l1.bias": torch.randn(16, generator=g),
            "half": torch.randn(5, generator=g).to(torch.bfloat16),
            "steps": torch.randint(0, 100, (), generator=g),
        }
        for _ in range(k)
    ]


def test_fedavg_matches_reference_on_random_states() -> None:
    states = _random_states(7, seed=0)
    weights = [3.0, 1.0, 10.0, 0.5, 2.0, 7.0, 1.0]
    out, ref = _fedavg(states, weights), weighted_average(states, weights)
    assert out.keys() == ref.keys()
    for key in ref:
        assert out[key].dtype == states[0][key].dtype
        torch.testing.assert_close(out[key], ref[key])
    # An independent float64 computation agrees too (the reference is not just self-consistent).
    total = sum(weights)
    expected = sum(s["l1.weight"].double() * w for s, w in zip(states, weights, strict=True)) / total
    torch.testing.assert_close(out["l1.weight"].double(), expected, rtol=1e-6, atol=1e-6)


def test_fedavg_is_order_independent() -> None:
    states = _random_states(5, seed=1)
    weights = [1.0, 2.0, 3.0, 4.0, 5.0]
    forward = _fedavg(states, weights)
    backward = _fedavg(states[::-1], weights[::-1])
    for key in forward:
        torch.testing.assert_close(forward[key], backward[key])


def test_fedavg_identical_states_are_unchanged() -> None:
    # Normalization buffers are identical on every worker and must survive averaging.
    s = {"mean": torch.tensor([0.1, 0.3, 0.7])}
    out = _fedavg([s, dict(s), dict(s)], [13, 200, 7])
    torch.testing.assert_close(out["mean"], s["mean"], rtol=0, atol=1e-7)


def test_fedavg_begin_resets() -> None:
    agg = FedAvg()
    agg.accumulate({"w": torch.tensor([100.0])}, 1.0)
    agg.begin()
    agg.accumulate({"w": torch.tensor([2.0])}, 1.0)
    assert agg.result()["w"].item() == 2.0
    assert agg.count == 1


def test_shape_mismatch_names_the_key() -> None:
    agg = FedAvg()
    agg.accumulate({"a": torch.zeros(2), "b": torch.zeros(3)}, 1.0)
    with pytest.raises(ValueError, match="'b'.*shape"):
        agg.accumulate({"a": torch.zeros(2), "b": torch.zeros(4)}, 1.0)
    with pytest.raises(ValueError, match="'b'.*dtype"):
        agg.accumulate({"a": torch.zeros(2), "b": torch.zeros(3, dtype=torch.float64)}, 1.0)
    with pytest.raises(ValueError, match=r"missing \['b'\].*unexpected \['c'\]"):
        agg.accumulate({"a": torch.zeros(2), "c": torch.zeros(3)}, 1.0)
    with pytest.raises(ValueError, match="'b'"):
        weighted_average([{"b": torch.zeros(3)}, {"b": torch.zeros(1)}], [1.0, 1.0])


def test_empty_and_zero_weight_errors() -> None:
    with pytest.raises(ValueError, match="before any state"):
        FedAvg().result()
    agg = FedAvg()
    agg.accumulate({"w": torch.ones(2)}, 0.0)
    with pytest.raises(ValueError, match="sum to 0"):
        agg.result()
    with pytest.raises(ValueError, match=">= 0"):
        FedAvg().accumulate({"w": torch.ones(2)}, -1.0)
    with pytest.raises(ValueError, match="at least one"):
        weighted_average([], [])
    with pytest.raises(ValueError, match="2 states but 1 weights"):
        weighted_average([{"w": torch.ones(1)}] * 2, [1.0])


def test_sample_weights() -> None:
    assert sample_weights([100, 300]) == [0.25, 0.75]
    assert sample_weights([5]) == [1.0]
    with pytest.raises(ValueError):
        sample_weights([0, 0])
    with pytest.raises(ValueError):
        sample_weights([])
