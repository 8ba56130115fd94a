"""A result's check costs a fixed budget, drawn in secret each round: labelled test samples by the SDK,
test windows of a token stream by the task's ``checking_params`` (the gpt task: tokens // (context + 1)
windows with the round's seed), so the coordinator's work per result does not grow with the task's
own ``eval_windows`` and no worker can tune its result to the samples it is scored on."""

from __future__ import annotations

import numpy as np
import torch

from aitbc_agent_sdk.records import FaultPolicy, TaskRef
from aitbc_agent_sdk.data._datasets import load_dataset
from aitbc_agent_sdk.tasks._bound_task import bind_task
from aitbc_agent_sdk.data._shard_files import TokenData, drawn_samples
from aitbc_agent_sdk.coordinator.data._inputs import round_checker


def tokens() -> TokenData:
    stream = torch.randint(0, 255, (1 << 15,), generator=torch.Generator().manual_seed(0)).to(torch.uint16)
    return TokenData(parts=(stream.numpy(),), vocab_size=256, eot=255)


def test_labelled_checks_draw_a_fixed_number_of_samples_per_seed():
    test = load_dataset("digits")
    first, second = drawn_samples(test, 64, seed=1), drawn_samples(test, 64, seed=2)
    assert len(first) == len(second) == 64
    assert not torch.equal(first.features, second.features)  # another round, other samples
    assert torch.equal(first.features, drawn_samples(test, 64, seed=1).features)  # one round: one draw for all
    assert len(drawn_samples(test.subset(np.arange(10)), 64, seed=1)) == 10


def test_a_language_models_check_reads_its_token_budget_with_the_rounds_seed():
    params = {"layers": 1, "heads": 2, "width": 32, "context": 16, "eval_windows": 4096}
    task = bind_task(TaskRef(name="gpt", params=params))
    checker = round_checker(task, FaultPolicy(val_tokens=170), seed=7)
    assert checker.params.eval_windows == 10 and checker.params.eval_seed == 7  # 170 // 17, not 4096
    assert task.params.eval_windows == 4096  # the round's full evaluation keeps the task's own
    data = tokens()
    model = task.build(task.model_spec(data), seed=0)
    state = model.state_dict()

    def loss(seed: int) -> float:
        return round_checker(task, FaultPolicy(val_tokens=170), seed).validation_loss(task.model_spec(data), state, data)
    assert loss(7) == loss(7) and loss(7) != loss(8)  # the windows follow the secret seed


def test_results_are_scored_with_one_model_loaded_anew_not_one_built_each(monkeypatch):
    task = bind_task(TaskRef(name="mlp", params={"hidden": 16}))
    data = load_dataset("digits").subset(np.arange(64))
    spec = task.model_spec(data)
    first, second = task.build(spec, seed=1).state_dict(), task.build(spec, seed=2).state_dict()
    built = []
    original = type(task.task).build_model
    monkeypatch.setattr(type(task.task), "build_model", lambda self, *a: built.append(1) or original(self, *a))
    scores = [task.validation_loss(spec, state, data) for state in (first, second, first)]
    assert len(built) == 1  # at 85M parameters a build costs more than the check's forward pass
    assert scores[0] == scores[2] != scores[1]  # each result is scored on its own weights
