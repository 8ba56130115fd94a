"""Training tasks users write: packing, loading and checking their code, the built-ins on the task
interface, and the two example tasks run by `aitbc distributed-training run --task` end to end."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
import sqlite3
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from aitbc_agent_sdk.errors import ConfigError, TrainingError
from aitbc_agent_sdk.flow._tasks import check_task_source, parse_task_params
from aitbc_agent_sdk.records import MAX_TASK_BYTES, JobConfig, TaskManifest, TaskPackage, TaskRef
from aitbc_agent_sdk.storage._unixfs import compute_cid
from aitbc_agent_sdk.tasks._bound_task import bind_task
from aitbc_agent_sdk.tasks._builtin_tasks import BUILTIN_TASKS
from aitbc_agent_sdk.data._datasets import LabeledData, load_dataset
from aitbc_agent_sdk.tasks._networks import MODEL_NAMES, build_model, model_spec_for
from aitbc_agent_sdk.tasks._task import DataInfo, TrainingTask
from aitbc_agent_sdk.tasks._task_loop import evaluate_task
from aitbc_agent_sdk.tasks._task_package import (
    decode_package, encode_package, load_task, missing_requirements, pack_task)

TASKS = Path(__file__).resolve().parents[1] / "examples" / "tasks"
SOME_CID = "QmR1zGB5tUrV4ceRtsWq4NfNAN4zQjDgCqjyDrwDVdG3VM"

TASK_CODE = """
from torch import nn
from aitbc_agent_sdk import TrainingTask

class {cls}(TrainingTask):
    def build_model(self, info, params):
        return nn.Linear(info.feature_shape[0], info.num_classes)
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def example(name: str):
    """One of examples/tasks/ as a module (its pure helpers are tested directly)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", TASKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- packing -------------------------------------------------------------------------------------


def test_a_file_and_a_directory_pack_with_their_entry_and_manifest(tmp_path):
    single = pack_task(write(tmp_path / "one" / "my_task.py", TASK_CODE.format(cls="Mine")))
    assert single.manifest.entry == "my_task.py:Mine" and single.manifest.name == "my_task"
    assert list(single.files) == ["my_task.py"]

    plain = tmp_path / "plain"
    write(plain / "helper.py", "WIDTH = 3\n")
    write(plain / "task.py", TASK_CODE.format(cls="Plain"))
    package = pack_task(plain)
    assert package.manifest.entry == "task.py:Plain" and sorted(package.files) == ["helper.py", "task.py"]

    # Two task classes: the manifest names the entry, the name and what the task needs.
    named = tmp_path / "named"
    write(named / "a.py", TASK_CODE.format(cls="A"))
    write(named / "b.py", TASK_CODE.format(cls="B"))
    write(named / "aitbc-task.json", json.dumps({"entry": "b.py:B", "name": "bee", "requires": {"numpy": ">=1"}}))
    manifest = pack_task(named).manifest
    assert (manifest.entry, manifest.name, manifest.requires) == ("b.py:B", "bee", {"numpy": ">=1"})


def test_the_same_code_packs_to_the_same_bytes_and_cid_wherever_it_lies(tmp_path):
    first = write(tmp_path / "a" / "focal_tabular.py", (TASKS / "focal_tabular.py").read_text())
    second = write(tmp_path / "b" / "focal_tabular.py", (TASKS / "focal_tabular.py").read_text())
    blob = encode_package(pack_task(first))
    assert blob == encode_package(pack_task(second)) == encode_package(pack_task(TASKS / "focal_tabular.py"))
    assert compute_cid(blob) == compute_cid(encode_package(pack_task(second)))
    assert decode_package(blob) == pack_task(first)
    first.write_text(first.read_text() + "\n# one more line\n")
    assert compute_cid(encode_package(pack_task(first))) != compute_cid(blob)


@pytest.mark.parametrize("files,message", [
    ({"t.py": "import torch\n"}, "no TrainingTask subclass"),
    ({"t.py": TASK_CODE.format(cls="A") + TASK_CODE.format(cls="B")}, "several TrainingTask subclasses"),
    ({"t.py": "def broken(:\n"}, "SyntaxError"),
    ({"t.csv": "a,b\n1,2\n"}, "not a .py file"),
    ({}, "no such task file"),
])
def test_bad_task_code_is_a_clear_config_error(tmp_path, files, message):
    for name, text in files.items():
        write(tmp_path / name, text)
    source = tmp_path / (next(iter(files)) if files else "missing.py")
    with pytest.raises(ConfigError, match=message):
        pack_task(source)


@pytest.mark.parametrize("name", ["../x.py", "/abs.py", "a/../b.py", "x.pyc", "a\\b.py", "t.py/../../x.py"])
def test_a_package_cannot_name_a_file_outside_its_directory(name):
    manifest = TaskManifest(name="t", entry="t.py:T")
    with pytest.raises(ValidationError, match="not a task file name"):
        TaskPackage(manifest=manifest, files={"t.py": "", name: ""})
    # ... nor can a stranger's package from the store
    blob = json.dumps({"format": "aitbc-task/1", "manifest": manifest.model_dump(), "files": {"t.py": "", name: ""}})
    with pytest.raises(TrainingError, match="not a task package"):
        decode_package(blob.encode())


def test_an_oversized_package_is_refused():
    manifest = TaskManifest(name="t", entry="t.py:T")
    half = "#" * (MAX_TASK_BYTES // 2)
    TaskPackage(manifest=manifest, files={"t.py": half, "u.py": half})  # at the limit: accepted
    with pytest.raises(ValidationError, match="above"):
        TaskPackage(manifest=manifest, files={"t.py": half, "u.py": half + "#"})


# -- loading -------------------------------------------------------------------------------------


def _helper_task(directory: Path, width: int) -> Path:
    write(directory / "helper.py", f"WIDTH = {width}\n")
    write(directory / "net" / "layers.py", "from torch import nn\n\ndef head(n, c):\n    return nn.Linear(n, c)\n")
    return write(directory / "entry.py", """
        from torch import nn
        from aitbc_agent_sdk import TrainingTask
        import helper
        from net.layers import head

        class WithHelper(TrainingTask):
            def build_model(self, info, params):
                width = helper.WIDTH
                return nn.Sequential(nn.Linear(info.feature_shape[0], width), head(width, info.num_classes))
    """)


def test_load_task_imports_a_package_of_several_files_each_with_its_own_helpers(tmp_path):
    info = DataInfo(feature_shape=(5,), num_classes=3, samples=10)
    packages = []
    for width in (4, 7):  # two tasks whose helper modules have the same names
        _helper_task(tmp_path / f"src{width}", width)
        packages.append(pack_task(tmp_path / f"src{width}"))
        shutil.rmtree(tmp_path / f"src{width}")  # what runs is the unpacked copy
    for width, package in zip((4, 7), packages):
        assert sorted(package.files) == ["entry.py", "helper.py", "net/layers.py"]
        task = load_task(package, tmp_path / f"unpacked{width}")
        assert (tmp_path / f"unpacked{width}" / "net" / "layers.py").is_file()
        model = task.build_model(info, task.params())
        assert model(torch.zeros(2, 5)).shape == (2, 3)
        assert model[0].out_features == width  # its own helper.py, not the other task's


def test_missing_requirements_names_what_is_absent_and_what_is_too_old():
    torch_version = importlib.metadata.version("torch")
    assert missing_requirements({"torch": ">=1.0", "pydantic": ""}) == []
    assert missing_requirements({"no-such-package-aitbc": ">=1"}) == ["no-such-package-aitbc>=1 (not installed)"]
    assert missing_requirements({"torch": "<1.0"}) == [f"torch<1.0 (have {torch_version})"]


def test_task_params_are_checked_against_the_tasks_own_params():
    task = example("focal_tabular").FocalTabular()
    good = bind_task(TaskRef(name="focal-tabular", cid=SOME_CID, params=parse_task_params(["gamma=0.5", "depth=3"])),
                     task)
    assert (good.params.gamma, good.params.depth) == (0.5, 3)
    for pairs, message in ([["gamma=-1"], "gamma"], [["gamma=high"], "gamma"], [["depth=2.5"], "depth"],
                           [["no_such=1"], "no_such"]):
        with pytest.raises(ConfigError, match=message):
            bind_task(TaskRef(name="focal-tabular", cid=SOME_CID, params=parse_task_params(pairs)), task)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_task_params(["gamma"])
    with pytest.raises(ConfigError, match="hidden"):
        bind_task(TaskRef(name="mlp", params={"hidden": 0}))


def test_evaluate_must_return_the_loss_and_the_tasks_metric():
    class NoLoss(TrainingTask):
        def build_model(self, info, params):
            return torch.nn.Linear(2, 2)

        def evaluate(self, model, data, params, device):
            return {"accuracy": 1.0}

    data = LabeledData(torch.zeros(4, 2), torch.tensor([0, 1, 0, 1]), 2)
    task = NoLoss()
    with pytest.raises(TrainingError, match="'loss' and its metric 'accuracy'"):
        evaluate_task(task, task.build_model(None, task.params()), data, task.params())


# -- the built-ins and the examples' own parts ---------------------------------------------------


@pytest.fixture
def one_thread():
    """Tiny models on a shared machine: one thread is faster than contending for the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def plain_adam_loop(model, data, config, *, seed):
    """The reference: Adam and cross-entropy in plain PyTorch, over a shuffle from its own seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate)
    n, batch_size = len(data), min(config.batch_size, len(data))
    model.train()
    epoch_loss = float("nan")
    for _ in range(config.epochs):
        order, loss_sum = torch.randperm(n, generator=generator), 0.0
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size]
            loss = torch.nn.functional.cross_entropy(model(data.features[idx]), data.labels[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(idx)
        epoch_loss = loss_sum / n
    return epoch_loss


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_builtin_tasks_train_bit_identically_to_plain_pytorch(name, one_thread):
    data = load_dataset("digits").subset(torch.arange(300))
    spec = model_spec_for(name, data, hidden=32)
    old, new = build_model(spec, seed=3), build_model(spec, seed=3)
    config = JobConfig(batch_size=32, learning_rate=0.01, epochs=2)
    torch.manual_seed(0)
    old_loss = plain_adam_loop(old, data, config, seed=11)
    torch.manual_seed(0)
    task = bind_task(TaskRef(name=name, params={"hidden": 32}))
    new_result = task.train(new, data, config, seed=11)
    assert old_loss == new_result.loss
    old_state, new_state = old.state_dict(), new.state_dict()
    assert old_state.keys() == new_state.keys()
    assert all(torch.equal(old_state[k], new_state[k]) for k in old_state)
    assert BUILTIN_TASKS[name].name == name


def test_resnet_augmentation_is_reproducible_and_keeps_the_images():
    resnet = example("resnet_small")
    images = torch.arange(4 * 3 * 6 * 6, dtype=torch.float32).reshape(4, 3, 6, 6)
    first = resnet.augment(images, torch.Generator().manual_seed(1), 2, True)
    assert torch.equal(first, resnet.augment(images, torch.Generator().manual_seed(1), 2, True))
    assert not torch.equal(first, resnet.augment(images, torch.Generator().manual_seed(2), 2, True))
    assert first.shape == images.shape and not torch.equal(first, images)
    flipped = resnet.augment(images, torch.Generator().manual_seed(1), 0, True)
    assert all(torch.equal(f, x) or torch.equal(f, x.flip(2)) for f, x in zip(flipped, images))
    # a crop of padding 1 is the image shifted by at most one pixel each way, zeros filling in
    padded = torch.nn.functional.pad(images, (1, 1, 1, 1))
    windows = [padded[:, :, dy : dy + 6, dx : dx + 6] for dy in range(3) for dx in range(3)]
    shifted = resnet.augment(images, torch.Generator().manual_seed(1), 1, False)
    assert all(any(torch.equal(s, w[i]) for w in windows) for i, s in enumerate(shifted))
    assert len({next(j for j, w in enumerate(windows) if torch.equal(s, w[i])) for i, s in enumerate(shifted)}) > 1


def test_focal_loss_and_the_warmup_cosine_schedule():
    focal = example("focal_tabular")
    logits, targets = torch.tensor([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0]]), torch.tensor([0, 0, 1])
    ce = torch.nn.functional.cross_entropy(logits, targets)
    assert torch.allclose(focal.focal_loss(logits, targets, 0.0), ce)  # gamma 0 is cross-entropy
    assert focal.focal_loss(logits, targets, 2.0) < ce  # easy rows count less
    schedule = [focal.warmup_cosine(step, 100, 10, 0.05) for step in range(100)]
    assert schedule[0] == pytest.approx(0.1) and schedule[9] == 1.0 and schedule[10] == 1.0
    assert schedule[-1] == pytest.approx(0.05, abs=1e-3) and schedule[10:] == sorted(schedule[10:], reverse=True)
    assert focal.macro_f1(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 1, 1]), 3) == pytest.approx((2 / 3 + 0.8) / 2)


# -- end to end: `aitbc distributed-training run --task ...` -------------------------------------


def run_task(aitbc_cmd, env, *args):
    return subprocess.run([*aitbc_cmd, "distributed-training", "run", "--yes", "--json", "--target-workers", "2",
                           "--providers", "2", "--rounds", "2", *args], env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=300)


def stored_task(home: Path) -> dict:
    with sqlite3.connect(home / "aitbc.db") as conn:
        (data,) = conn.execute("SELECT data FROM trainings").fetchone()
    return json.loads(data)["spec"]["task"]


def check_report(done, home: Path, example_file: str, metrics: set[str], baseline: float) -> dict:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["status"] == "complete" and [r["round"] for r in report["rounds"]] == [1, 2]
    assert report["final_accuracy"] > baseline, (report["final_accuracy"], baseline)
    for round_ in report["rounds"]:
        assert metrics <= round_["metrics"].keys()
        assert round_["metrics"]["accuracy"] == pytest.approx(round_["accuracy"])
    # the code that ran travelled by the CID of its package
    assert stored_task(home)["cid"] == compute_cid(encode_package(pack_task(TASKS / example_file)))
    return report


def test_focal_tabular_trains_on_a_csv_through_the_cli(aitbc_cmd, cli_env, aitbc_home, tmp_path):
    data = example("make_data").write_breast_cancer_csv(tmp_path / "cancer.csv")
    labels = load_dataset(data, label_column="diagnosis").labels
    majority = float(torch.bincount(labels).max()) / len(labels)  # ~0.63: always "benign"
    done = run_task(aitbc_cmd, cli_env, "--task", str(TASKS / "focal_tabular.py"), "--data-path", str(data),
                    "--label-column", "diagnosis", "--task-param", "gamma=2", "--task-param", "hidden=32")
    report = check_report(done, aitbc_home, "focal_tabular.py", {"accuracy", "loss", "macro_f1", "cross_entropy"},
                          baseline=max(majority + 0.2, 0.85))
    assert report["rounds"][-1]["metrics"]["macro_f1"] > 0.8
    assert stored_task(aitbc_home)["params"] == {"gamma": 2, "hidden": 32}


def test_resnet_small_trains_on_multichannel_images_through_the_cli(aitbc_cmd, cli_env, aitbc_home, tmp_path):
    data = example("make_data").write_colour_digits_npz(tmp_path / "digits.npz")
    assert load_dataset(data).feature_shape == (3, 16, 16)
    done = run_task(aitbc_cmd, cli_env, "--task", str(TASKS / "resnet_small.py"), "--data-path", str(data),
                    "--task-param", "flip=false")  # digits are not mirror-symmetric; crops stay on
    check_report(done, aitbc_home, "resnet_small.py", {"accuracy", "loss", "top3_accuracy"},
                 baseline=0.6)  # ten balanced classes: chance is 0.1


def test_a_task_that_is_neither_builtin_nor_code_is_a_usage_error_with_nothing_left(
        aitbc_cmd, cli_env, aitbc_home, tmp_path):
    done = subprocess.run([*aitbc_cmd, "distributed-training", "run", "--yes", "--task", "nosuch"], env=cli_env,
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--task 'nosuch' is neither a built-in task (mlp, cnn, transformer, gpt) nor a .py file" in done.stderr
    assert list(tmp_path.iterdir()) == []  # no home (aitbc_home lies in tmp_path), nothing in the working directory
    # the same check, for the other shapes of --task
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="neither a built-in"):
        check_task_source(str(tmp_path / "data.csv"))
    one_task = write(tmp_path / "one" / "task.py", TASK_CODE.format(cls="One")).parent
    for accepted in ("cnn", str(TASKS / "resnet_small.py"), str(one_task)):
        check_task_source(accepted)


BROKEN_TASK = '''
from torch import nn
from aitbc_agent_sdk import TrainingTask


class Broken(TrainingTask):
    def build_model(self, info, params):
        return nn.Linear(3, info.num_classes)  # the wrong input width: digits have 64 features
'''


def test_a_task_that_breaks_fails_its_dry_run_before_anything_is_funded(aitbc_cmd, cli_env, aitbc_home, tmp_path):
    (tmp_path / "broken.py").write_text(BROKEN_TASK)
    done = subprocess.run([*aitbc_cmd, "distributed-training", "run", "--yes", "--task", str(tmp_path / "broken.py"),
                           "--target-workers", "2", "--rounds", "1", "--json"], env=cli_env,
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    error = json.loads(done.stdout)  # with --json the error is the one JSON object printed
    assert error["type"] == "ConfigError" and "task 'broken' failed a dry run on 64 samples: RuntimeError" in (
        error["error"]), error
    assert error["error"].endswith(f"default loss() of the task class at {tmp_path / 'broken.py'}:6)"), error
    db = aitbc_home / "aitbc.db"
    if db.exists():  # the embedded stack started; no training was created, nothing was funded
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT COUNT(*) FROM trainings").fetchone() == (0,)
