import math

import pytest
import torch

from aitbc_agent_sdk.aggregate._aggregation import AggregationStrategy, FedAvg
from aitbc_agent_sdk.aggregate._robust import NormClipping
from aitbc_agent_sdk.aggregate._robust import (
    CoordinateMedian,
    Krum,
    MultiKrum,
    TrimmedMean,
    krum_scores,
    median_rows,
    trimmed_mean_rows,
)
from aitbc_agent_sdk.aggregate._strategies import STRATEGIES, make_strategy


def _run(agg: AggregationStrategy, states, weights=None):
    agg.begin()
    for i, s in enumerate(states):
        agg.accumulate(s, 1.0 if weights is None else weights[i])
    return agg.result()


def _scalars(values, key="w"):
    return [{key: torch.tensor([float(v)])} for v in values]


# --- the plain functions ------------------------------------------------------------------


def test_median_rows_odd_and_even() -> None:
    assert median_rows(torch.tensor([[1.0], [100.0], [5.0]])).tolist() == [5.0]
    # even count: mean of the two middle values, (2 + 3) / 2
    assert median_rows(torch.tensor([[100.0], [1.0], [3.0], [2.0]])).tolist() == [2.5]


def test_trimmed_mean_rows_drops_both_ends() -> None:
    x = torch.tensor([[4.0, 0.0], [100.0, 1.0], [1.0, 2.0], [3.0, 3.0], [2.0, -50.0]])
    # column 0 sorted 1,2,3,4,100 -> drop 1 and 100 -> (2+3+4)/3 = 3
    # column 1 sorted -50,0,1,2,3 -> drop -50 and 3 -> (0+1+2)/3 = 1
    assert trimmed_mean_rows(x, 1).tolist() == [3.0, 1.0]
    with pytest.raises(ValueError, match="cannot trim"):
        trimmed_mean_rows(x, 3)


def test_krum_scores_hand_computed() -> None:
    v = torch.tensor([0.0, 1.0, 3.0, 7.0, 700.0], dtype=torch.float64)
    sq = (v[:, None] - v[None, :]) ** 2
    # n=5, f=1: sum of the 2 nearest squared distances
    #   0 -> 1, 9 = 10;  1 -> 1, 4 = 5;  3 -> 4, 9 = 13;  7 -> 16, 36 = 52;  700 -> 693^2 + 697^2
    expected = [10.0, 5.0, 13.0, 52.0, 693.0**2 + 697.0**2]
    assert krum_scores(sq, f=1).tolist() == expected
    with pytest.raises(ValueError, match="2f\\+2"):
        krum_scores(sq[:4, :4], f=1)


# --- the strategies on hand computations --------------------------------------------------


def test_median_hand_computation_and_integer_max() -> None:
    states = [
        {"w": torch.tensor([1.0, -2.0]), "n": torch.tensor(3)},
        {"w": torch.tensor([5.0, 7.0]), "n": torch.tensor(9)},
        {"w": torch.tensor([100.0, 0.5]), "n": torch.tensor(4)},
    ]
    out = _run(CoordinateMedian(), states)
    assert out["w"].tolist() == [5.0, 0.5]
    assert out["n"].dtype == torch.int64 and int(out["n"]) == 9


def test_median_ignores_weights_but_drops_zero_weight_states() -> None:
    states = _scalars([1, 5, 100])
    # A huge self-reported weight on the outlier buys it nothing (unweighted median) ...
    assert _run(CoordinateMedian(), states, [1.0, 1.0, 1e9])["w"].tolist() == [5.0]
    # ... but weight 0 means "contributes nothing", as in FedAvg: median of [1, 100] = 50.5.
    assert _run(CoordinateMedian(), states, [1.0, 0.0, 1.0])["w"].tolist() == [50.5]


def test_trimmed_mean_hand_computation() -> None:
    states = _scalars([4, 100, 1, 3, 2])
    # n=5, trim 0.2 -> k = 1 from each end -> mean(2, 3, 4) = 3
    assert _run(TrimmedMean(0.2), states)["w"].tolist() == [3.0]
    # trim 0.1 -> k = floor(0.5) = 0: the plain mean 110 / 5 = 22
    assert _run(TrimmedMean(0.1), states)["w"].tolist() == [22.0]


def test_krum_picks_the_honest_cluster() -> None:
    # The honest states are 0, 1, 3, 7; the last is an outlier (x100 of 7).
    states = [{"a": torch.tensor([float(v)]), "b": torch.zeros(2), "n": torch.tensor(i)} for i, v in
              enumerate([0, 1, 3, 7, 700])]
    agg = Krum(f=1)
    out = _run(agg, states)
    # scores 10, 5, 13, 52, huge (see test_krum_scores_hand_computed): state 1 wins
    assert agg.selected == [1]
    assert out["a"].tolist() == [1.0] and out["b"].tolist() == [0.0, 0.0]
    assert int(out["n"]) == 4  # integer buffers are the max over all states, as in FedAvg


def test_multikrum_averages_the_m_best() -> None:
    states = _scalars([0, 1, 3, 7, 700])
    agg = MultiKrum(f=1, m=2)
    assert _run(agg, states)["w"].tolist() == [0.5]  # states 1 and 0 (scores 5, 10)
    assert agg.selected == [0, 1]
    agg = MultiKrum(f=1, m=3)
    out = _run(agg, states)
    assert agg.selected == [0, 1, 2]  # scores 5, 10, 13; 52 and the outlier are left out
    torch.testing.assert_close(out["w"], torch.tensor([4.0 / 3.0]))


def test_krum_distances_sum_over_all_keys() -> None:
    g = torch.Generator().manual_seed(3)
    states = [
        {"x": torch.randn(4, 3, generator=g), "y": torch.randn(5, generator=g).to(torch.float64)}
        for _ in range(9)
    ]
    agg = MultiKrum(f=2, m=3)
    out = _run(agg, states)
    # Oracle: Krum on the concatenated float64 vectors.
    flat = torch.stack([torch.cat([s["x"].double().flatten(), s["y"]]) for s in states])
    sq = torch.cdist(flat, flat, compute_mode="donot_use_mm_for_euclid_dist") ** 2
    n, f = 9, 2
    scores = [sorted(sq[i, j].item() for j in range(n) if j != i)[: n - f - 2] for i in range(n)]
    best = sorted(range(n), key=lambda i: sum(scores[i]))[:3]
    assert agg.selected == sorted(best)
    torch.testing.assert_close(out["x"], torch.stack([states[i]["x"] for i in best]).mean(0))
    assert out["y"].dtype == torch.float64


def test_norm_clipping_scales_a_large_update_to_max_norm_exactly() -> None:
    ref = {"w": torch.tensor([1.0, 1.0]), "n": torch.tensor(2)}
    big = {"w": torch.tensor([1.0 + 300.0, 1.0 + 400.0]), "n": torch.tensor(5)}  # update norm 500
    small = {"w": torch.tensor([1.3, 1.4]), "n": torch.tensor(1)}  # update [0.3, 0.4], norm 0.5
    clip = NormClipping(ref, max_norm=5.0)
    out = _run(clip, [big])
    # update [300, 400] scaled by 5/500 -> [3, 4], norm exactly 5
    torch.testing.assert_close(out["w"], torch.tensor([4.0, 5.0]))
    assert math.isclose(float((out["w"] - ref["w"]).norm()), 5.0, rel_tol=1e-6)
    # With FedAvg weights 1 and 3: ref + (1*[3,4] + 3*[0.3,0.4]) / 4 = [1.975, 2.3]; small is untouched
    out = _run(clip, [big, small], [1.0, 3.0])
    torch.testing.assert_close(out["w"], torch.tensor([1.975, 2.3]))
    assert int(out["n"]) == 5


def test_norm_clipping_median_bound() -> None:
    ref = {"w": torch.zeros(2)}
    states = [{"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([0.0, 2.0])}, {"w": torch.tensor([60.0, 80.0])}]
    clip = NormClipping(ref)  # norms 1, 2, 100 -> bound = median = 2
    out = _run(clip, states)
    assert clip.bound == 2.0
    # [1,0] and [0,2] untouched, [60,80] -> [1.2, 1.6]; mean = [2.2, 3.6] / 3
    torch.testing.assert_close(out["w"], torch.tensor([2.2 / 3, 3.6 / 3]))
    assert clip.result()["w"].tolist() == out["w"].tolist()  # result() is repeatable


def test_norm_clipping_composes_with_a_robust_inner() -> None:
    ref = {"w": torch.zeros(1)}
    clip = NormClipping(ref, max_norm=10.0, inner=CoordinateMedian())
    # clipped to 1, 2, 10 -> median 2
    assert _run(clip, _scalars([1, 2, 1000]))["w"].tolist() == [2.0]


# --- Byzantine robustness -----------------------------------------------------------------


def _byzantine_round(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    honest = [
        {"w": 1.0 + 0.01 * torch.randn(3, 4, generator=g), "b": 1.0 + 0.01 * torch.randn(4, generator=g)}
        for _ in range(5)
    ]
    attacker = {"w": torch.full((3, 4), 1e6), "b": torch.full((4,), 1e6)}
    return honest[:2] + [attacker] + honest[2:]  # the attacker is not conveniently last


@pytest.mark.parametrize(
    "make",
    [
        CoordinateMedian,
        lambda: TrimmedMean(0.2),
        lambda: Krum(f=1),
        lambda: MultiKrum(f=1, m=3),
        lambda: NormClipping({"w": torch.ones(3, 4), "b": torch.ones(4)}, max_norm=0.1),
    ],
    ids=["median", "trimmed-mean", "krum", "multi-krum", "norm-clip"],
)
def test_robust_strategies_resist_one_byzantine_state(make) -> None:
    states = _byzantine_round()
    fedavg = _run(FedAvg(), states)
    assert float((fedavg["w"] - 1.0).abs().min()) > 1e5  # the plain mean is dragged away
    out = _run(make(), states)
    for key in ("w", "b"):
        assert float((out[key] - 1.0).abs().max()) < 0.1, key


@pytest.mark.parametrize(
    "make", [CoordinateMedian, lambda: TrimmedMean(0.2), lambda: Krum(f=1)], ids=["median", "trimmed-mean", "krum"]
)
def test_a_nan_state_does_not_poison_the_order_statistics(make) -> None:
    states = _byzantine_round()
    states[2] = {"w": torch.full((3, 4), math.nan), "b": torch.full((4,), math.nan)}
    out = _run(make(), states)
    for key in ("w", "b"):
        assert torch.isfinite(out[key]).all() and float((out[key] - 1.0).abs().max()) < 0.1


# --- dtypes and bookkeeping ---------------------------------------------------------------


def test_dtypes_are_preserved_and_inputs_untouched() -> None:
    states = [
        {
            "h": torch.tensor([v, -v], dtype=torch.float16),
            "bf": torch.tensor([v], dtype=torch.bfloat16),
            "d": torch.tensor([v], dtype=torch.float64),
            "flag": torch.tensor([v > 1.5, False]),
        }
        for v in (1.0, 2.0, 3.0)
    ]
    before = [{k: t.clone() for k, t in s.items()} for s in states]
    for agg in (CoordinateMedian(), TrimmedMean(0.0), MultiKrum(f=0, m=3)):
        out = _run(agg, states)
        assert {k: t.dtype for k, t in out.items()} == {k: t.dtype for k, t in states[0].items()}
        assert out["h"].tolist() == [2.0, -2.0] and out["bf"].tolist() == [2.0] and out["d"].tolist() == [2.0]
        assert out["flag"].tolist() == [True, False]  # bool buffers: element-wise max (or)
    for s, b in zip(states, before, strict=True):
        for k in s:
            assert torch.equal(s[k], b[k])


def test_median_matches_torch_median_on_random_states() -> None:
    g = torch.Generator().manual_seed(1)
    states = [{"w": torch.randn(6, 5, generator=g), "v": torch.randn(7, generator=g)} for _ in range(7)]
    out = _run(CoordinateMedian(), states)
    for key in ("w", "v"):
        torch.testing.assert_close(out[key], torch.stack([s[key] for s in states]).median(dim=0).values)


def test_begin_resets_the_round() -> None:
    # On [1, 2, 3]: median 2; trim 0.2 of 3 drops floor(0.6) = 0 -> mean 2; Krum (f=0, 1 nearest
    # neighbour) scores 1, 1, 1 -> first state 1; norm clipping at the median norm 2 -> mean(1, 2, 2).
    cases = [
        (CoordinateMedian(), 2.0),
        (TrimmedMean(0.2), 2.0),
        (Krum(f=0), 1.0),
        (NormClipping({"w": torch.zeros(1)}), 5.0 / 3.0),
    ]
    for agg, expected in cases:
        _run(agg, _scalars([100, 200, 300]))
        assert _run(agg, _scalars([1, 2, 3]))["w"].item() == pytest.approx(expected), type(agg).__name__


# --- errors -------------------------------------------------------------------------------


def test_krum_needs_more_than_2f_plus_2_states() -> None:
    agg = Krum(f=1)
    with pytest.raises(ValueError, match=r"more than 2f\+2 = 4 states"):
        _run(agg, _scalars([1, 2, 3, 4]))
    # zero-weight states do not count towards n
    with pytest.raises(ValueError, match="got 4"):
        _run(agg, _scalars([1, 2, 3, 4, 5]), [1, 1, 1, 1, 0])
    # five states are enough: scores (2 nearest) 5, 2, 2, 2, 5 -> the first of the ties, state 2.0
    assert _run(agg, _scalars([1, 2, 3, 4, 5]))["w"].tolist() == [2.0]
    with pytest.raises(ValueError, match="m=5 exceeds n - f = 4"):
        _run(MultiKrum(f=1, m=5), _scalars([1, 2, 3, 4, 5]))


def _all_strategies():
    return [
        CoordinateMedian(),
        TrimmedMean(0.2),
        Krum(f=0),
        NormClipping({"w": torch.zeros(2), "n": torch.tensor(0)}, max_norm=1.0),
        NormClipping({"w": torch.zeros(2), "n": torch.tensor(0)}),
    ]


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"w": torch.zeros(3), "n": torch.tensor(0)}, "shape"),
        ({"w": torch.zeros(2, dtype=torch.float64), "n": torch.tensor(0)}, "dtype"),
        ({"w": torch.zeros(2)}, "missing \\['n'\\]"),
        ({"w": torch.zeros(2), "n": torch.tensor(0), "extra": torch.zeros(1)}, "unexpected \\['extra'\\]"),
    ],
)
def test_mismatched_states_are_rejected(bad, match) -> None:
    good = {"w": torch.zeros(2), "n": torch.tensor(0)}
    for agg in _all_strategies():
        agg.accumulate(good, 1.0)
        with pytest.raises(ValueError, match=match):
            agg.accumulate(bad, 1.0)


def test_empty_rounds_and_bad_weights_are_rejected() -> None:
    for agg in _all_strategies():
        with pytest.raises(ValueError):
            agg.result()
        with pytest.raises(ValueError, match="weight"):
            agg.accumulate({"w": torch.zeros(2), "n": torch.tensor(0)}, -1.0)
    for agg in (CoordinateMedian(), TrimmedMean(0.2), Krum(f=0)):
        agg.accumulate({"w": torch.zeros(2), "n": torch.tensor(0)}, 0.0)
        with pytest.raises(ValueError, match="weight 0"):
            agg.result()


@pytest.mark.parametrize(
    "build",
    [
        lambda: TrimmedMean(0.5),
        lambda: TrimmedMean(-0.1),
        lambda: Krum(f=-1),
        lambda: MultiKrum(f=1, m=0),
        lambda: NormClipping({"w": torch.zeros(1)}, max_norm=0.0),
        lambda: NormClipping({"w": torch.zeros(1)}, max_norm=math.inf),
    ],
)
def test_bad_parameters_are_rejected(build) -> None:
    with pytest.raises(ValueError):
        build()


# --- selection by name --------------------------------------------------------------------


def test_registry_and_make_strategy() -> None:
    assert set(STRATEGIES) == {"fedavg", "median", "trimmed-mean", "krum", "multi-krum", "norm-clip"}
    assert isinstance(make_strategy("fedavg"), FedAvg)
    assert isinstance(make_strategy("median"), CoordinateMedian)
    assert make_strategy("trimmed-mean", trim_fraction=0.25).trim_fraction == 0.25
    krum = make_strategy("krum", f=2)
    assert isinstance(krum, Krum) and (krum.f, krum.m) == (2, 1)
    assert isinstance(make_strategy("multi-krum", f=1, m=3), MultiKrum)
    clip = make_strategy("norm-clip", reference={"w": torch.zeros(1)}, max_norm=2.0)
    assert isinstance(clip, NormClipping) and isinstance(clip.inner, FedAvg)


def test_make_strategy_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="unknown aggregation strategy 'mean'.*fedavg, krum, median"):
        make_strategy("mean")
    with pytest.raises(ValueError, match="bad parameters for aggregation strategy 'krum'"):
        make_strategy("krum", f=1, m=3)
    with pytest.raises(ValueError, match="'multi-krum'"):
        make_strategy("multi-krum", f=1)


@pytest.mark.parametrize("name", ["fedavg", "median", "trimmed-mean", "krum", "multi-krum", "norm-clip"])
def test_every_strategy_can_be_picked_for_a_round_of_four_and_shrugs_off_one_boosted_update(name):
    from aitbc_agent_sdk.aggregate._strategies import strategy_for_round
    reference = {"w": torch.zeros(4)}
    honest = [{"w": torch.full((4,), v)} for v in (1.0, 1.1, 0.9)]
    boosted = {"w": torch.full((4,), 100.0)}
    strategy = strategy_for_round(name, 4, reference)
    strategy.begin()
    for state in [*honest, boosted]:
        strategy.accumulate(state, 10.0)
    result = strategy.result()["w"]
    if name == "fedavg":
        assert result[0] > 20  # the plain mean is dragged away: why the others exist
    else:
        assert float(result.abs().max()) <= 1.2, (name, result)
