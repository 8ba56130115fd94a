"""Targets of any kind: class labels, float values (regression) and none, detected from the data or chosen with
--target, stored, sharded, loaded by a worker, trained with the default task, and labelled in reports and plots.
Pure functions and files on disk only: the end-to-end run is in test_target_kinds_run.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from aitbc_agent_sdk.errors import ConfigError, DatasetError
from aitbc_agent_sdk.records import (
    EscrowSummary, JobConfig, RoundReport, TrainingPhase, TrainingReport, TrainingSpec)
from aitbc_agent_sdk.records._datasets import DatasetManifest
from aitbc_agent_sdk.storage._unixfs import compute_cid
from aitbc_agent_sdk.data._array_files import write_class_sorted
from aitbc_agent_sdk.tasks._bound_task import bind_task, task_ref_of
from aitbc_agent_sdk.data._dataset_dirs import PreparedDataset, build_manifest
from aitbc_agent_sdk.data._datasets import LabeledData, detect_target, load_dataset, train_test_split
from aitbc_agent_sdk.data._file_sharding import array_rows, merge_shards, plan_split, shard_data, sub_shard
from aitbc_agent_sdk.data._shard_files import load_shard, part_name, write_shard
from aitbc_agent_sdk.wire._checkpoint import decode_state
from aitbc_agent_sdk.tasks._task import TrainingTask

CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
ADDRESS = "0x" + "ab" * 20
RNG = np.random.default_rng(7)
X = RNG.normal(size=(120, 4)).astype(np.float32)
VALUES = (X @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1).astype(np.float64)  # non-integral floats


def write_csv(path: Path, target: list[str], name: str = "target") -> Path:
    lines = ["a,b,c,d," + name] + [",".join(f"{v:.5f}" for v in row) + f",{t}" for row, t in zip(X, target)]
    path.write_text("\n".join(lines) + "\n")
    return path


SOURCES = {  # what a user brings -> the kind it is read as
    "float values.npz": (lambda p: np.savez(p, x=X, y=VALUES), "values", 1),
    "vector values.npz": (lambda p: np.savez(p, x=X, y=np.stack([VALUES, -VALUES], axis=1)), "values", 2),
    "int labels.npz": (lambda p: np.savez(p, x=X, y=np.arange(120) % 3), "classes", 1),
    "integral floats.npz": (lambda p: np.savez(p, x=X, y=(np.arange(120) % 4).astype(np.float32)), "classes", 1),
    "features only.npz": (lambda p: np.savez(p, x=X), "none", 1),
    "float values.pt": (lambda p: torch.save({"x": torch.from_numpy(X), "y": torch.from_numpy(VALUES)}, p),
                        "values", 1),
    "int labels.pt": (lambda p: torch.save({"x": torch.from_numpy(X), "y": torch.arange(120) % 2}, p), "classes", 1),
    "float column.csv": (lambda p: write_csv(p, [f"{v:.4f}" for v in VALUES]), "values", 1),
    "many integers.csv": (lambda p: write_csv(p, [str(i * 7) for i in range(120)]), "values", 1),
    "few integers.csv": (lambda p: write_csv(p, [str(i % 3) for i in range(120)]), "classes", 1),
    "strings.csv": (lambda p: write_csv(p, ["yes" if v > 0 else "no" for v in VALUES]), "classes", 1),
}


@pytest.mark.parametrize("name", SOURCES)
def test_the_target_kind_is_detected_from_the_data(tmp_path: Path, name: str) -> None:
    make, kind, width = SOURCES[name]
    source = tmp_path / name.replace(" ", "_")
    make(source)
    label = "target" if source.suffix == ".csv" else None
    layout = write_class_sorted(source, tmp_path / "out", label_column=label)
    assert (layout.target, layout.target_width) == (kind, width)
    data = load_dataset(source, label_column=label)
    assert data.target == kind and data.target_width == width
    if kind == "values":  # stored as floats, in a seeded shuffle: the same multiset of values, nothing rounded
        stored = np.fromfile(tmp_path / "out" / "y.f32", dtype="<f4").reshape(-1, width)
        assert sorted(stored[:, 0].tolist()) == pytest.approx(sorted(data.labels[:, 0].tolist()))
        assert not (tmp_path / "out" / "y.i64").exists()
    if kind == "none":
        assert layout.labels is None and data.labels.shape == (120, 0)


def test_a_csv_without_a_target_column_is_none_only_when_asked(tmp_path: Path) -> None:
    source = write_csv(tmp_path / "d.csv", [f"{v:.3f}" for v in VALUES])
    with pytest.raises(DatasetError, match="--label-column, or pass --target none"):
        write_class_sorted(source, tmp_path / "o1")
    layout = write_class_sorted(source, tmp_path / "o2", target="none")  # every column is a feature
    assert layout.target == "none" and layout.feature_shape == (5,)


def test_a_forced_kind_the_data_cannot_be_is_a_clear_error(tmp_path: Path) -> None:
    floats = write_csv(tmp_path / "floats.csv", [f"{v:.4f}" for v in VALUES], name="price")
    with pytest.raises(DatasetError, match=r"floats\.csv: column 'price' holds non-integer numbers.*--target values"):
        write_class_sorted(floats, tmp_path / "o1", label_column="price", target="classes")
    words = write_csv(tmp_path / "words.csv", ["yes" if v > 0 else "no" for v in VALUES], name="kind")
    with pytest.raises(DatasetError, match=r"words\.csv: column 'kind' holds text"):
        load_dataset(words, label_column="kind", target="values")
    np.savez(tmp_path / "f.npz", x=X, y=VALUES)
    with pytest.raises(DatasetError, match=r"f\.npz: array 'y' holds non-integer"):
        load_dataset(tmp_path / "f.npz", target="classes")
    np.savez(tmp_path / "n.npz", x=X)
    with pytest.raises(DatasetError, match="no target"):
        write_class_sorted(tmp_path / "n.npz", tmp_path / "o2", target="values")
    # the other way round is fine: integer labels trained as values
    few = write_csv(tmp_path / "few.csv", [str(i % 3) for i in range(120)])
    assert write_class_sorted(few, tmp_path / "o3", label_column="target", target="values").target == "values"


def test_detection_thresholds() -> None:
    assert detect_target(np.array([0.0, 1.0, 2.0] * 10)) == "classes"
    assert detect_target(np.arange(300, dtype=np.float64)) == "values"  # integral, but every row its own value
    assert detect_target(np.arange(300, dtype=np.int64)) == "classes"  # an integer dtype says classes
    assert detect_target(np.arange(300, dtype=np.int64), typed=False) == "values"  # a CSV's integers do not
    assert detect_target(np.array([0.5, 1.0])) == "values"
    rng = np.random.default_rng(0)
    # A CSV of 200 rows and 26 integer classes is classes; 2,000 ages stored as floats are values.
    assert detect_target(rng.integers(0, 26, 200), typed=False) == "classes"
    assert detect_target(rng.integers(18, 98, 2000).astype(np.float32)) == "values"
    assert detect_target(rng.integers(0, 5, (100, 3))) == "values"  # an integer vector per row


def manifest_of(directory: Path, layout) -> DatasetManifest:
    entries = [(p.name, compute_cid(p.read_bytes()), p.stat().st_size) for p in sorted(directory.iterdir())]
    prepared = PreparedDataset(kind="arrays", directory=directory, staged=True, arrays=layout)
    return build_manifest(prepared, CID, entries)


def materialize(directory: Path, source: Path, shard) -> Path:
    directory.mkdir(parents=True)
    for i, piece in enumerate(shard.data.slices):
        with (source / piece.path).open("rb") as fh:
            fh.seek(piece.offset)
            (directory / part_name(i)).write_bytes(fh.read(piece.length))
    return directory


@pytest.mark.parametrize("width", [1, 3])
def test_values_shard_and_split_as_byte_ranges_and_load_as_floats(tmp_path: Path, width: int) -> None:
    y = np.stack([VALUES * (k + 1) for k in range(width)], axis=1)
    np.savez(tmp_path / "v.npz", x=X, y=y)
    layout = write_class_sorted(tmp_path / "v.npz", tmp_path / "out")
    manifest = manifest_of(tmp_path / "out", layout)
    assert manifest.file("y.f32").size == 120 * 4 * width
    plan = plan_split(manifest, num_shards=3, test_fraction=0.25, partition="iid", alpha=0.5, seed=1)
    assert plan.test.samples == 30 and [s.samples for s in plan.shards] == [30, 30, 30]
    assert plan.label_counts == [(), (), ()] and plan.test_label_counts == ()
    seen: list[float] = []
    for i, slices in enumerate([*plan.shards, plan.test]):
        data = load_shard(materialize(tmp_path / f"s{i}", tmp_path / "out", shard_data(manifest, slices)),
                          shard_data(manifest, slices))
        assert data.target == "values" and data.labels.dtype == torch.float32 and data.labels.shape[1] == width
        # each row keeps its own target: the features predict it exactly
        expected = data.features.double() @ torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64) + 0.1
        assert torch.allclose(data.labels[:, 0].double(), expected, atol=1e-3)
        seen += data.labels[:, 0].tolist()
    assert sorted(seen) == pytest.approx(sorted(y[:, 0].tolist()))  # disjoint and covering
    # the elastic pool's re-splits keep feature and target slices paired
    shard = shard_data(manifest, plan.shards[0])
    parts = [sub_shard(shard, 0, 10), sub_shard(shard, 10, 30)]
    assert merge_shards(parts).data.samples == 30
    xs, ys = array_rows(parts[1].data)
    assert sum(x.length for x in xs) == 20 * 16 and sum(v.length for v in ys) == 20 * 4 * width


def test_a_dataset_without_a_target_shards_its_features_alone(tmp_path: Path) -> None:
    np.savez(tmp_path / "n.npz", x=X)
    manifest = manifest_of(tmp_path / "out", write_class_sorted(tmp_path / "n.npz", tmp_path / "out"))
    plan = plan_split(manifest, num_shards=2, test_fraction=0.2, partition="iid", alpha=0.5, seed=0)
    shard = shard_data(manifest, plan.shards[1])
    assert all(s.path == "x.f32" for s in shard.data.slices)
    data = load_shard(materialize(tmp_path / "s", tmp_path / "out", shard), shard)
    assert data.target == "none" and len(data) == shard.data.samples and data.labels.shape == (len(data), 0)
    assert sub_shard(shard, 5, 20).data.samples == 15


def test_dirichlet_is_refused_for_values_naming_the_flag(tmp_path: Path) -> None:
    np.savez(tmp_path / "v.npz", x=X, y=VALUES)
    manifest = manifest_of(tmp_path / "out", write_class_sorted(tmp_path / "v.npz", tmp_path / "out"))
    with pytest.raises(ValueError, match="--partition dirichlet .* target is values.*--partition iid"):
        plan_split(manifest, num_shards=2, test_fraction=0.2, partition="dirichlet", alpha=0.5, seed=0)


def test_the_manifest_records_the_kind_and_old_manifests_stay_classes(tmp_path: Path) -> None:
    np.savez(tmp_path / "v.npz", x=X, y=VALUES)
    manifest = manifest_of(tmp_path / "out", write_class_sorted(tmp_path / "v.npz", tmp_path / "out"))
    again = DatasetManifest.model_validate_json(manifest.model_dump_json())
    assert again == manifest and again.arrays.target == "values" and again.arrays.labels == "y.f32"
    old = json.loads(manifest.model_dump_json())  # as written before targets had kinds
    old["arrays"] = {"features": "x.f32", "labels": "y.i64", "feature_shape": [4], "num_classes": 2,
                     "class_rows": [60, 60]}
    old["files"] = [{"path": "x.f32", "cid": CID, "size": 120 * 16}, {"path": "y.i64", "cid": CID, "size": 120 * 8}]
    parsed = DatasetManifest.model_validate(old)
    assert parsed.arrays.target == "classes" and parsed.arrays.label_bytes == 8


@pytest.mark.parametrize("change, problem", [
    ({"target_width": 10**9}, "less than or equal"),  # a huge target width is bounded before any allocation
    ({"target_width": 2}, "do not match the rows"),  # the label file's bytes disagree with rows x width
    ({"num_classes": 3}, "no classes"),
    ({"target": "classes"}, "classes target needs"),
    ({"labels": None}, "a label file"),
])
def test_a_hostile_values_manifest_is_refused(tmp_path: Path, change: dict, problem: str) -> None:
    np.savez(tmp_path / "v.npz", x=X, y=VALUES)
    manifest = manifest_of(tmp_path / "out", write_class_sorted(tmp_path / "v.npz", tmp_path / "out"))
    raw = json.loads(manifest.model_dump_json())
    raw["arrays"].update(change)
    with pytest.raises(ValueError, match=problem):
        DatasetManifest.model_validate(raw)


def test_a_worker_refuses_a_values_shard_whose_bytes_disagree(tmp_path: Path) -> None:
    data = LabeledData(torch.from_numpy(X), torch.from_numpy(VALUES[:, None].astype(np.float32)), 0, "values")
    shard = write_shard(tmp_path / "s", data)
    assert load_shard(tmp_path / "s").target == "values"
    (tmp_path / "s" / part_name(1)).write_bytes(b"\0" * 12)  # the target part cut short
    with pytest.raises(DatasetError, match="expected 480 bytes"):
        load_shard(tmp_path / "s", shard)
    nan = VALUES[:, None].astype(np.float32).copy()
    nan[3] = np.nan
    write_shard(tmp_path / "t", LabeledData(torch.from_numpy(X), torch.from_numpy(nan), 0, "values"))
    with pytest.raises(DatasetError, match="NaN"):
        load_shard(tmp_path / "t")


def values_data() -> LabeledData:
    return LabeledData(torch.from_numpy(X), torch.from_numpy(VALUES[:, None].astype(np.float32)), 0, "values")


def test_the_default_task_regresses_with_mse_on_values() -> None:
    task = TrainingTask().for_target("values")
    assert (task.metric, task.higher_is_better, task.loss_name) == ("mse", False, "mse")
    assert TrainingTask().for_target("classes").metric == "accuracy"
    data = values_data()
    model = torch.nn.Linear(4, 1)
    metrics = task.evaluate(model, data, task.params(), torch.device("cpu"))
    assert set(metrics) == {"mse", "mae", "r2", "loss"} and metrics["loss"] == metrics["mse"]
    predictions = model(data.features).detach()
    assert metrics["mse"] == pytest.approx(float(((predictions - data.labels) ** 2).mean()), rel=1e-5)
    loss = task.loss(model, (data.features, data.labels), task.params())
    assert float(loss.detach()) == pytest.approx(metrics["mse"], rel=1e-4)
    perfect = torch.nn.Linear(4, 1)
    with torch.no_grad():
        perfect.weight.copy_(torch.tensor([[1.0, -2.0, 0.5, 3.0]]))
        perfect.bias.fill_(0.1)
    best = task.evaluate(perfect, data, task.params(), torch.device("cpu"))
    assert best["mse"] < 1e-8 and best["r2"] == pytest.approx(1.0)


def test_a_task_that_names_its_metric_keeps_it() -> None:
    class Own(TrainingTask):
        metric = "r2"
        higher_is_better = True

    own = Own().for_target("values")
    assert (own.metric, own.higher_is_better, own.loss_name) == ("r2", True, "mse")


def test_the_built_in_mlp_trains_on_values_and_reports_mse() -> None:
    bound = bind_task(task_ref_of(TrainingSpec(model_type="mlp", target_workers=1)))
    train, test = train_test_split(values_data(), 0.25, seed=0)
    spec = bound.model_spec(train)
    assert (spec.target, spec.outputs, spec.num_classes) == ("values", 1, 0)
    bound.rehearse(train, JobConfig(), seed=0)  # every step once, with the metric checked
    metrics = bound.evaluate(test, decode_state(bound.initial_state(train, seed=0)))
    assert "accuracy" not in metrics and {"mse", "mae", "r2"} <= metrics.keys()


def test_a_built_in_model_needs_a_target() -> None:
    bound = bind_task(task_ref_of(TrainingSpec(model_type="mlp", target_workers=1)))
    none = LabeledData(torch.from_numpy(X), torch.zeros((120, 0)), 0, "none")
    with pytest.raises(ConfigError, match="needs a target.*--task"):
        bound.model_spec(none)


def regression_report(metric: str = "mse", higher: bool = False, loss_name: str = "mse") -> TrainingReport:
    rounds = tuple(RoundReport(round=n, accuracy=0.0, loss=0.5 / n, model_cid=CID, worker_losses={ADDRESS: 0.6 / n},
                               workers=1, metrics={"loss": 0.5 / n, "mae": 0.4 / n, "mse": 0.5 / n, "r2": 0.9})
                   for n in (1, 2))
    return TrainingReport(training_id="training_reg", status=TrainingPhase.COMPLETE, final_accuracy=0.0,
                          model_cid=CID, manifest_cid=CID, rounds=rounds, workers=(),
                          escrow=EscrowSummary(address=ADDRESS, deposited_wei=0, paid_wei=0, refunded_wei=0),
                          refund_tx=None, wall_seconds=1.0, compute_seconds=1.0, metric=metric,
                          higher_is_better=higher, loss_name=loss_name)


def test_report_and_plot_labels_come_from_the_task() -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from aitbc_cli.plot import _loss_panel, _score_panel  # noqa: PLC0415
    from aitbc_cli.report_view import final_text  # noqa: PLC0415

    report = regression_report()
    assert final_text(report) == "final mse 0.2500 (lower is better), validation mse 0.2500"
    assert "accuracy" not in final_text(report) and "cross-entropy" not in final_text(report)
    fig, (score, loss) = plt.subplots(1, 2)
    _score_panel(score, report)
    _loss_panel(loss, report)
    assert score.get_ylabel() == "mse" and "lower is better" in score.get_title()
    assert loss.get_ylabel() == "mse"
    plt.close(fig)
    r2 = regression_report(metric="r2", higher=True, loss_name="huber")
    assert final_text(r2) == "final r2 0.9000 (higher is better), validation huber 0.2500"
    fig, (score, loss) = plt.subplots(1, 2)
    _score_panel(score, r2)
    _loss_panel(loss, r2)
    assert score.get_ylabel() == "r2" and loss.get_ylabel() == "huber"
    plt.close(fig)
