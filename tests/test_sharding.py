import numpy as np
import pytest

from aitbc_agent_sdk.data._sharding import dirichlet_partition, iid_partition, label_counts


def _assert_partition(parts: list[np.ndarray], n: int) -> None:
    joined = np.concatenate(parts)
    assert len(joined) == n  # disjoint: no index counted twice
    assert np.array_equal(np.sort(joined), np.arange(n))  # covers every index


@pytest.mark.parametrize(("n", "k"), [(10, 3), (1797, 4), (7, 7), (100, 1)])
def test_iid_disjoint_cover_and_balanced(n: int, k: int) -> None:
    parts = iid_partition(n, k, seed=3)
    assert len(parts) == k
    _assert_partition(parts, n)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_iid_is_deterministic_and_seed_dependent() -> None:
    a = iid_partition(500, 4, seed=1)
    b = iid_partition(500, 4, seed=1)
    c = iid_partition(500, 4, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_iid_rejects_more_shards_than_samples() -> None:
    with pytest.raises(ValueError, match="at least"):
        iid_partition(3, 4, seed=0)


def _labels(n_per_class: int = 100, classes: int = 10) -> np.ndarray:
    return np.repeat(np.arange(classes), n_per_class)


def _skew(labels: np.ndarray, parts: list[np.ndarray], classes: int) -> float:
    """Mean total-variation distance between each shard's label mix and the global mix."""
    global_mix = np.bincount(labels, minlength=classes) / len(labels)
    tvs = []
    for p in parts:
        mix = np.bincount(labels[p], minlength=classes) / len(p)
        tvs.append(0.5 * np.abs(mix - global_mix).sum())
    return float(np.mean(tvs))


def test_dirichlet_disjoint_cover_and_deterministic() -> None:
    labels = _labels()
    a = dirichlet_partition(labels, 5, alpha=0.3, seed=7)
    b = dirichlet_partition(labels, 5, alpha=0.3, seed=7)
    _assert_partition(a, len(labels))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_dirichlet_small_alpha_is_more_skewed_than_iid() -> None:
    labels = _labels()
    iid = [_skew(labels, iid_partition(len(labels), 5, seed=s), 10) for s in range(5)]
    non_iid = [_skew(labels, dirichlet_partition(labels, 5, alpha=0.1, seed=s), 10) for s in range(5)]
    assert np.mean(iid) < 0.1
    assert np.mean(non_iid) > 0.4
    # And a large alpha comes back close to IID.
    near_iid = [_skew(labels, dirichlet_partition(labels, 5, alpha=1000.0, seed=s), 10) for s in range(5)]
    assert np.mean(near_iid) < 0.1


@pytest.mark.parametrize("min_samples", [1, 20, 50])
def test_dirichlet_min_samples_respected(min_samples: int) -> None:
    labels = _labels(n_per_class=30)
    for seed in range(10):
        parts = dirichlet_partition(labels, 6, alpha=0.05, seed=seed, min_samples=min_samples)
        assert min(len(p) for p in parts) >= min_samples
        _assert_partition(parts, len(labels))


def test_dirichlet_rejects_impossible_min_samples_and_bad_alpha() -> None:
    with pytest.raises(ValueError, match="at least"):
        dirichlet_partition(_labels(n_per_class=2), 4, alpha=0.5, seed=0, min_samples=10)
    with pytest.raises(ValueError, match="alpha"):
        dirichlet_partition(_labels(), 4, alpha=0.0, seed=0)


def test_label_counts() -> None:
    assert label_counts(np.array([0, 2, 2, 1, 2]), 4) == (1, 1, 3, 0)
    assert label_counts(np.array([], dtype=np.int64), 3) == (0, 0, 0)
    with pytest.raises(ValueError):
        label_counts(np.array([0, 5]), 3)
