"""Mistakes in a user's task are caught before anything is funded, each named with its file and line:
a misspelt hook or class attribute, a metric that evaluate() does not return, an error raised in the
task's code (on the coordinator's rehearsal and in a provider's failure reason), and --dataset-size
against the bytes the user gave."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from aitbc_agent_sdk.coordinator.data._datasets import DatasetStore
from aitbc_agent_sdk.coordinator.data._tasks import TaskCache
from aitbc_agent_sdk.errors import ConfigError, TrainingError
from aitbc_agent_sdk.flow._tasks import check_task_source
from aitbc_agent_sdk.limits import TEXT_MAX_LENGTH
from aitbc_agent_sdk.records import JobConfig, ModelSpec, TaskRef, TrainingSpec
from aitbc_agent_sdk.provider._process import TASK_FILE, WEIGHTS_FILE
from aitbc_agent_sdk.provider._worker_process import run_job
from aitbc_agent_sdk.storage._local import LocalContentStore
from aitbc_agent_sdk.storage._unixfs import compute_cid
from aitbc_agent_sdk.wire._checkpoint import encode_state
from aitbc_agent_sdk.data._datasets import load_dataset
from aitbc_agent_sdk.tasks._bound_task import bind_task
from aitbc_agent_sdk.data._shard_files import write_shard
from aitbc_agent_sdk.tasks._task_package import encode_package, load_task, pack_task
from aitbc_cli.app import main

HEADER = """\
import torch
from torch import nn
from torch.nn import functional as F
from aitbc_agent_sdk import TrainingTask


class Mine(TrainingTask):
"""
MODEL = """
def build_model(self, info, params):
    return nn.Linear(info.feature_shape[0], info.num_classes)
"""


def task_file(directory: Path, *body: str, name: str = "mine.py") -> Path:
    """A task file of HEADER + ``body`` (pieces of the class body, each dedented, then indented once)."""
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + "".join(textwrap.indent(textwrap.dedent(piece).strip("\n") + "\n", "    ")
                                     for piece in body))
    return path


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


# -- misspelt hooks and attributes: refused when the task is packed ---------------------------------


@pytest.mark.parametrize(("method", "hook"), [
    ("los", "loss"), ("evalute", "evaluate"), ("build_modle", "build_model"),
    ("configure_optimizers", "configure_optimizer"), ("Batches", "batches"),
])
def test_a_misspelt_hook_names_the_hook_and_its_file_and_line(tmp_path: Path, method: str, hook: str) -> None:
    path = task_file(tmp_path, f"""
        def build_model(self, info, params):
            return nn.Linear(info.feature_shape[0], info.num_classes)

        def {method}(self, *args):
            return None
    """)
    with pytest.raises(ConfigError) as caught:
        pack_task(path)
    assert f"{path}:{line_of(path, f'def {method}(')}: method {method!r}" in str(caught.value)
    assert f"did you mean {hook!r}" in str(caught.value)


def test_misspelt_class_attributes_are_named_each_with_its_line(tmp_path: Path) -> None:
    path = task_file(tmp_path, """
        metrics = "macro_f1"
        higher_is_beter: bool = False
    """, MODEL)
    with pytest.raises(ConfigError) as caught:
        pack_task(path)
    lines = str(caught.value).splitlines()
    assert lines == [
        f"{path}:{line_of(path, 'metrics =')}: class attribute 'metrics' of Mine is not a TrainingTask hook; "
        "did you mean 'metric'? (a helper's name starts with '_')",
        f"{path}:{line_of(path, 'higher_is_beter')}: class attribute 'higher_is_beter' of Mine is not a "
        "TrainingTask hook; did you mean 'higher_is_better'? (a helper's name starts with '_')"]


def test_helpers_and_names_far_from_every_hook_are_fine(tmp_path: Path) -> None:
    path = task_file(tmp_path, MODEL, """
        threshold = 0.5
        def _los(self):
            return 0
        def loss_fn(self, logits, targets):
            return F.cross_entropy(logits, targets)
        def summary(self):
            return "a helper"
        def metric_fn(self, logits, targets):
            return 0.0
        def losses(self):
            return []
        def batch(self, rows):
            return rows
    """)
    assert pack_task(path).manifest.name == "mine"


def test_a_report_label_too_long_for_the_report_is_refused_before_funding(tmp_path: Path) -> None:
    path = task_file(tmp_path, MODEL, f"""
        loss_name = "{'x' * 65}"
    """)
    with pytest.raises(ConfigError, match=rf"^{path}:\d+: loss_name of Mine must be a name of 1 to 64"):
        pack_task(path)


def test_a_misspelt_hook_in_a_task_directory_names_the_file_inside_it(tmp_path: Path) -> None:
    directory = tmp_path / "pkg"
    (directory / "helper.py").parent.mkdir(parents=True)
    (directory / "helper.py").write_text("class Mixin:\n    def evalute(self, *args):\n        return {}\n")
    path = task_file(directory, MODEL)
    path.write_text(path.read_text().replace("import torch\n", "import torch\nfrom helper import Mixin\n")
                    .replace("class Mine(TrainingTask)", "class Mine(Mixin, TrainingTask)"))
    with pytest.raises(ConfigError, match=rf"^{directory / 'helper.py'}:2: method 'evalute' of Mixin"):
        pack_task(directory)


def test_the_cli_refuses_a_misspelt_hook_before_anything_starts(tmp_path: Path, aitbc_home: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = task_file(tmp_path, MODEL, "def los(self, model, batch, params):\n    return 0\n")
    with pytest.raises(SystemExit) as exited:
        main(["distributed-training", "run", "--task", str(path), "--yes", "--json", "--rounds", "1"])
    error = json.loads(capsys.readouterr().out)
    assert exited.value.code == 2 and error["type"] == "ConfigError", error
    assert f"{path}:{line_of(path, 'def los(')}: method 'los'" in error["error"] and "'loss'" in error["error"]
    assert not aitbc_home.exists()  # no stack was started, no wallet made, nothing funded


# -- the rehearsal: the task's code run once on a few samples, on the coordinator ---------------------


@pytest.fixture
def digits() -> object:
    return load_dataset("digits").subset(torch.arange(64))


async def rehearse(tmp_path: Path, path: Path, digits: object) -> None:
    """The rehearsal as `run` makes it: the task packed into a store, loaded back by its CID, run once."""
    tasks = TaskCache(LocalContentStore(tmp_path / "store"), tmp_path / "tasks")
    ref = await tasks.add(path)
    bound = await tasks.bound(TrainingSpec(model_type=ref.name, target_workers=1, task=ref))
    bound.rehearse(digits, JobConfig(batch_size=16), seed=0)


async def test_a_shape_error_in_the_tasks_loss_names_the_users_file_and_line(tmp_path: Path, digits) -> None:
    path = task_file(tmp_path / "code", MODEL, """
        def loss(self, model, batch, params):
            inputs, targets = batch
            return (model(inputs) @ targets.float()).mean()  # [N, 10] @ [N]: no such product
    """)
    with pytest.raises(ConfigError) as caught:
        await rehearse(tmp_path, path, digits)
    message = str(caught.value)
    assert message.startswith("task 'mine' failed a dry run on 64 samples: RuntimeError: ")
    assert message.endswith(f"(at {path}:{line_of(path, 'no such product')} in loss)")
    assert str(tmp_path / "tasks") not in message  # the copy the coordinator imported is not the user's file


async def test_an_error_in_a_default_hook_names_the_hook_and_the_task_class(tmp_path: Path, digits) -> None:
    path = task_file(tmp_path, """
        def build_model(self, info, params):
            return nn.Linear(3, info.num_classes)  # digits have 64 features
    """)
    with pytest.raises(ConfigError, match=rf"RuntimeError: .*\(in TrainingTask's default loss\(\) of the task class "
                                          rf"at {path}:{line_of(path, 'class Mine')}\)"):
        await rehearse(tmp_path, path, digits)


async def test_a_metric_evaluate_does_not_return_names_the_keys_and_the_line(tmp_path: Path, digits) -> None:
    path = task_file(tmp_path, MODEL, """
        metric = "f1"
        def evaluate(self, model, data, params, device):
            return {"macro_f1": 0.5, "loss": 1.0}
    """)
    with pytest.raises(ConfigError) as caught:
        await rehearse(tmp_path, path, digits)
    assert str(caught.value) == (
        f"{path}:{line_of(path, 'metric =')}: Mine.evaluate() returned the keys ['loss', 'macro_f1'], without "
        "'f1' (did you mean 'macro_f1'?); evaluate must return 'loss' and the task's metric = 'f1'")
    without_loss = task_file(tmp_path / "b", MODEL, """
        def evaluate(self, model, data, params, device):
            return {"accuracy": 1.0}
    """)
    with pytest.raises(ConfigError, match=rf"^{without_loss}:{line_of(without_loss, 'def evaluate')}: .*without "
                                          "'loss'"):
        await rehearse(tmp_path / "b", without_loss, digits)


def test_the_cli_dry_run_refuses_a_broken_task_with_its_line(tmp_path: Path, aitbc_home: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = task_file(tmp_path, MODEL, """
        def batches(self, data, params, batch_size, generator, device):
            yield data.features[:batch_size].view(-1, 8, 8), data.labels[:batch_size]
    """)
    with pytest.raises(SystemExit) as exited:
        main(["distributed-training", "run", "--task", str(path), "--dry-run", "--json", "--workers", "1",
              "--rounds", "1"])
    error = json.loads(capsys.readouterr().out)
    assert exited.value.code == 2 and error["type"] == "ConfigError", error
    assert error["error"].endswith(f"(in TrainingTask's default loss() of the task class at "
                                   f"{path}:{line_of(path, 'class Mine')})"), error
    assert not aitbc_home.exists()  # a dry run works in a scratch home: nothing here, nothing funded


# -- the provider: a job's failure reason carries the line, bounded ----------------------------------


def test_a_providers_failure_reason_names_the_package_file_and_line(tmp_path: Path) -> None:
    path = task_file(tmp_path / "code", MODEL, """
        def loss(self, model, batch, params):
            raise ValueError("x" * 5000)  # a customer's error text of any length
    """)
    package = pack_task(path)
    cid = compute_cid(encode_package(package))
    ref = TaskRef(name="mine", cid=cid)
    data = load_dataset("digits").subset(torch.arange(32))
    spec = ModelSpec(name="task", input_shape=data.feature_shape, num_classes=data.num_classes, hidden=1)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    write_shard(job_dir, data)
    (job_dir / TASK_FILE).write_bytes(encode_package(package))
    model = bind_task(ref, load_task(package, tmp_path / "loaded")).build(spec)
    (job_dir / WEIGHTS_FILE).write_bytes(encode_state(model.state_dict()))
    request = {"job_dir": str(job_dir), "model": spec.model_dump(mode="json"), "config": JobConfig().model_dump(),
               "task": ref.model_dump(mode="json"), "seed": 0}
    with pytest.raises(TrainingError) as caught:
        run_job(request, {}, lambda event: None)
    reason = str(caught.value)
    assert len(reason) < TEXT_MAX_LENGTH and reason.startswith("ValueError: xxx")
    assert reason.endswith(f"... (at mine.py:{line_of(path, 'raise ValueError')} in loss)")  # no provider path


# -- --dataset-size: the bytes the user gave, named by the user's path ------------------------------


async def test_dataset_size_counts_the_corpus_on_disk_not_its_tokens(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 100)  # 4,400 bytes
    data = DatasetStore(LocalContentStore(tmp_path / "store"), tmp_path / "data")
    _, manifest = await data.import_dataset(corpus, declared_size=5000)  # its uint16 tokens are 8,800 bytes
    assert manifest.kind == "tokens"
    with pytest.raises(ConfigError) as caught:
        await data.import_dataset(corpus, declared_size=4000)
    assert str(caught.value) == (f"the dataset {corpus} holds 4.4 kB (4400 bytes), more than the 4 kB (4000 bytes) "
                                 "the training declared with --dataset-size")
    assert not list((tmp_path / "data" / "staging").iterdir())  # nothing half-written is left


def test_check_task_source_imports_and_checks_the_code(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"failed to import: NameError: .* \(at .*mine\.py:8 in Mine\)"):
        check_task_source(str(task_file(tmp_path, "oops = undefined_name\n")))


# -- the dry run's speed: providers that will train nothing start no training process ---------------


async def test_providers_of_a_dry_run_start_no_training_process(tmp_path: Path) -> None:
    from aitbc_agent_sdk import Agent, AgentConfig

    async with Agent(AgentConfig(home=tmp_path / "cold", providers=1, warm_providers=False)) as agent:
        assert [p.pid for p in agent.stack.providers[0].training.processes] == [None]
    async with Agent(AgentConfig(home=tmp_path / "warm", providers=1)) as agent:
        assert all(p.pid for p in agent.stack.providers[0].training.processes)
