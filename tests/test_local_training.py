import pytest
import torch

from aitbc_agent_sdk.records import JobConfig, TaskRef
from aitbc_agent_sdk.data._datasets import load_dataset, train_test_split
from aitbc_agent_sdk.tasks._evaluation import evaluate
from aitbc_agent_sdk.tasks._bound_task import bind_task
from aitbc_agent_sdk.tasks._task_loop import EpochStats, LocalTrainResult
from aitbc_agent_sdk.tasks._networks import build_model, fit_normalization, model_spec_for
from aitbc_agent_sdk.data._sharding import iid_partition


def train_builtin(name, model, data, config, *, seed, on_epoch=None, **params) -> LocalTrainResult:
    """The production loop with a built-in task, as a worker runs it."""
    bound = bind_task(TaskRef(name=name, params=params))
    return bound.train(model, data, config, seed=seed, on_epoch=on_epoch)


@pytest.fixture(scope="module")
def split():
    return train_test_split(load_dataset("digits"), 0.2, seed=0)


def test_loss_decreases_on_a_digits_shard(split) -> None:
    train, test = split
    shard = train.subset(iid_partition(len(train), 4, seed=0)[0])
    model = build_model(model_spec_for("mlp", train), seed=0)
    fit_normalization(model, train)
    before = evaluate(model, test)
    seen: list[EpochStats] = []
    result = train_builtin("mlp", model, shard, JobConfig(batch_size=32, learning_rate=1e-2, epochs=3), seed=0, on_epoch=seen.append)
    after = evaluate(model, test)

    assert [s.epoch for s in seen] == [1, 2, 3] and all(s.epochs == 3 for s in seen)
    assert seen[-1].loss < seen[0].loss
    assert all(s.samples_per_s > 0 for s in seen)
    assert result.samples == len(shard) and result.loss == seen[-1].loss and result.seconds > 0
    assert after.loss < before.loss / 3
    assert after.accuracy > 0.85 > before.accuracy


def test_training_is_deterministic_for_a_seed(split) -> None:
    train, _ = split
    shard = train.subset(range(200))
    states = []
    for _ in range(2):
        model = build_model(model_spec_for("mlp", train), seed=0)
        train_builtin("mlp", model, shard, JobConfig(batch_size=16, learning_rate=1e-3, epochs=1), seed=4)
        states.append(model.state_dict())
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key


@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_other_models_train(split, name: str) -> None:
    train, _ = split
    shard = train.subset(range(300))
    model = build_model(model_spec_for(name, train, hidden=32), seed=0)
    fit_normalization(model, train)
    seen: list[EpochStats] = []
    train_builtin(name, model, shard, JobConfig(batch_size=32, learning_rate=3e-3, epochs=3), seed=0,
                  on_epoch=seen.append, hidden=32)
    assert seen[-1].loss < seen[0].loss


def test_evaluate_restores_mode_and_counts(split) -> None:
    _, test = split
    model = build_model(model_spec_for("mlp", test), seed=0)
    model.train()
    result = evaluate(model, test, batch_size=100)  # uneven last batch
    assert model.training and result.samples == len(test) and 0.0 <= result.accuracy <= 1.0
