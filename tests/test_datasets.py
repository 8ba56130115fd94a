from pathlib import Path

import numpy as np
import pytest
import torch

from aitbc_agent_sdk.errors import DatasetError
from aitbc_agent_sdk.data._datasets import DATASET_NAMES, LabeledData, load_dataset, train_test_split


def test_digits_bundled() -> None:
    assert "digits" in DATASET_NAMES
    d = load_dataset("digits")
    assert len(d) == 1797 and d.feature_shape == (64,) and d.num_classes == 10
    assert d.features.dtype == torch.float32 and d.labels.dtype == torch.int64
    assert float(d.features.min()) == 0.0 and float(d.features.max()) == 1.0  # /16 scaling


def _xy(n: int = 12) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random((n, 5)).astype(np.float32), np.arange(n) % 3


@pytest.mark.parametrize(("fx", "fy"), [("x", "y"), ("X", "y"), ("features", "labels")])
def test_npz_round_trip(tmp_path: Path, fx: str, fy: str) -> None:
    x, y = _xy()
    path = tmp_path / "d.npz"
    np.savez(path, **{fx: x, fy: y})
    d = load_dataset(path)
    assert np.array_equal(d.features.numpy(), x)
    assert np.array_equal(d.labels.numpy(), y)
    assert d.num_classes == 3


def test_pt_round_trip(tmp_path: Path) -> None:
    x, y = _xy()
    path = tmp_path / "d.pt"
    torch.save({"x": torch.from_numpy(x).double(), "y": torch.from_numpy(y)}, path)
    d = load_dataset(str(path))
    assert d.features.dtype == torch.float32
    torch.testing.assert_close(d.features, torch.from_numpy(x))
    assert d.labels.tolist() == y.tolist()


def test_pt_refuses_arbitrary_objects(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"x": torch.zeros(2, 2), "y": torch.tensor([0, 1]), "obj": Path("/")}, path)
    with pytest.raises(DatasetError, match="not a readable"):
        load_dataset(path)


def test_csv_round_trip_with_string_labels(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("a,species,b\n1.5,setosa,2\n0.5,virginica,3\n2.0,setosa,1\n7,versicolor,0\n")
    d = load_dataset(path, label_column="species")
    assert d.feature_shape == (2,)
    assert d.features.tolist() == [[1.5, 2.0], [0.5, 3.0], [2.0, 1.0], [7.0, 0.0]]
    # sorted class names: setosa=0, versicolor=1, virginica=2
    assert d.labels.tolist() == [0, 2, 0, 1] and d.num_classes == 3


def test_csv_integer_labels_keep_their_values(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("f,label\n0.1,2\n0.2,0\n0.3,2\n")
    d = load_dataset(path, label_column="label")
    assert d.labels.tolist() == [2, 0, 2] and d.num_classes == 3


@pytest.mark.parametrize(
    ("name", "content", "label_column", "match"),
    [
        ("d.csv", "a,b,label\n1,2,0\n", "target", r"no label column 'target'.*\['a', 'b', 'label'\]"),
        ("d.csv", "a,label\n1,0\n", None, "name the target column with --label-column"),
        ("d.csv", "a,label\n1,0\nxyz,1\n", "label", "non-numeric"),
        ("d.csv", "a,label\n1,0\n2,0\n", "label", "at least 2 classes"),
        ("d.csv", "a,label\n", "label", "empty"),
        ("d.csv", "", "label", "empty"),
        ("d.txt", "a,label\n1,0\n", "label", "unknown extension"),
    ],
)
def test_dataset_errors(tmp_path: Path, name: str, content: str, label_column: str | None, match: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DatasetError, match=match):
        load_dataset(path, label_column=label_column)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset(tmp_path / "nope.npz")
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset("mnist-from-the-internet")


def test_npz_errors(tmp_path: Path) -> None:
    x, y = _xy()
    np.savez(tmp_path / "len.npz", x=x, y=y[:-1])
    with pytest.raises(DatasetError, match="12 feature rows but 11 labels"):
        load_dataset(tmp_path / "len.npz")
    np.savez(tmp_path / "keys.npz", data=x, target=y)
    with pytest.raises(DatasetError, match=r"found \['data', 'target'\]"):
        load_dataset(tmp_path / "keys.npz")
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 5)), y=np.zeros(0, dtype=np.int64))
    with pytest.raises(DatasetError, match="empty"):
        load_dataset(tmp_path / "empty.npz")
    np.savez(tmp_path / "str.npz", x=np.array([["a", "b"], ["c", "d"]]), y=np.array([0, 1]))
    with pytest.raises(DatasetError, match="not numeric"):
        load_dataset(tmp_path / "str.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(DatasetError, match="not a readable"):
        load_dataset(tmp_path / "bad.npz")


def test_split_is_stratified_deterministic_and_disjoint() -> None:
    d = load_dataset("digits")
    train, test = train_test_split(d, 0.2, seed=5)
    train2, test2 = train_test_split(d, 0.2, seed=5)
    other, _ = train_test_split(d, 0.2, seed=6)
    assert torch.equal(train.features, train2.features) and torch.equal(test.labels, test2.labels)
    assert not torch.equal(train.labels, other.labels)
    assert len(train) + len(test) == len(d)
    assert abs(len(test) - 0.2 * len(d)) <= 10
    # Stratified: every class keeps within one sample of 20 % in the test split.
    for cls in range(10):
        n_cls = int((d.labels == cls).sum())
        assert abs(int((test.labels == cls).sum()) - 0.2 * n_cls) <= 1
    # Disjoint and covering: tag each row with its index and check the split's tags.
    tagged = LabeledData(torch.arange(len(d), dtype=torch.float32)[:, None], d.labels, d.num_classes)
    tr, te = train_test_split(tagged, 0.2, seed=5)
    ids = torch.cat([tr.features[:, 0], te.features[:, 0]]).long().sort().values
    assert torch.equal(ids, torch.arange(len(d)))


def test_subset_keeps_num_classes() -> None:
    d = LabeledData(torch.zeros(4, 2), torch.tensor([0, 1, 2, 2]), 3)
    s = d.subset(np.array([0, 1]))
    assert len(s) == 2 and s.num_classes == 3 and s.labels.tolist() == [0, 1]
