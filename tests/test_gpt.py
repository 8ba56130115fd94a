"""The built-in ``gpt`` task: the model's causality and tied head, sampling, the task's parameters,
windows of token shards, and a short training on real text (the standard library's own sources)."""

from __future__ import annotations

import math
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from aitbc_agent_sdk.errors import ConfigError, DatasetError
from aitbc_agent_sdk.records import JobConfig, TaskRef
from aitbc_agent_sdk.tasks._bound_task import bind_task
from aitbc_agent_sdk.tasks._builtin_tasks import BUILTIN_TASKS
from aitbc_agent_sdk.wire._checkpoint import decode_state
from aitbc_agent_sdk.data._datasets import load_dataset
from aitbc_agent_sdk.tasks._gpt import GPT, GptConfig, generate
from aitbc_agent_sdk.tasks._gpt_task import GptTask, draw_windows, warmup_cosine
from aitbc_agent_sdk.data._shard_files import TokenData
from aitbc_agent_sdk.tasks._task_loop import evaluate_task
from aitbc_agent_sdk.wire._task_state import restore_task_state

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SMALL = {"layers": 2, "heads": 2, "width": 64, "context": 32, "windows_per_epoch": 128, "eval_windows": 64,
         "warmup_steps": 5}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def byte_tokens(*names: str) -> TokenData:
    """Source files of the standard library as a byte-level token stream, one part per file."""
    parts = tuple(np.frombuffer((STDLIB / n).read_bytes(), dtype=np.uint8).astype(np.uint16) for n in names)
    return TokenData(parts, vocab_size=256, eot=0)


def small_gpt(**changes: int | float) -> GPT:
    torch.manual_seed(0)
    return GPT(GptConfig(**{"vocab_size": 50, "layers": 2, "heads": 2, "width": 32, "context": 16, **changes}))


def test_a_future_token_never_changes_earlier_logits():
    model = small_gpt().eval()
    tokens = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 50
    before, after = model(tokens), model(changed)
    assert torch.allclose(before[:, :10], after[:, :10], atol=1e-6)
    assert not torch.allclose(before[:, 10:], after[:, 10:], atol=1e-4)


def test_the_head_is_the_token_embedding_and_residual_projections_are_scaled():
    model = small_gpt(layers=8)
    assert not any("head" in key for key in model.state_dict())  # the tied matrix is stored once
    tokens = torch.tensor([[1, 2, 3]])
    before = model(tokens)
    with torch.no_grad():
        model.token_embedding.weight[7] += 1.0  # token 7 is not in the input: only the head reads its row
    after = model(tokens)
    assert not torch.allclose(before[..., 7], after[..., 7])
    assert torch.allclose(before[..., :7], after[..., :7])
    assert model.blocks[0].mlp.proj.weight.std() < 0.5 * model.blocks[0].mlp.up.weight.std()
    with pytest.raises(ValueError, match="context"):
        model(torch.zeros((1, 17), dtype=torch.long))


def test_generate_is_seeded_bounded_and_greedy_at_temperature_zero():
    model = small_gpt()
    first = generate(model, [1, 2, 3], 12, generator=torch.Generator().manual_seed(5))
    assert first == generate(model, [1, 2, 3], 12, generator=torch.Generator().manual_seed(5))
    assert len(first) == 12 and all(0 <= t < 50 for t in first)
    assert generate(model, list(range(40)), 3) != []  # a prompt longer than the context keeps its tail
    greedy = generate(model, [4], 5, temperature=0.0)
    assert greedy == generate(model, [4], 5, temperature=0.0, top_k=1)
    assert generate(model, [4], 0) == []
    for bad in ({"prompt": []}, {"prompt": [50]}, {"max_new_tokens": -1}, {"temperature": -1.0},
                {"temperature": math.nan}, {"top_k": 0}):
        call = {"prompt": [1], "max_new_tokens": 2, **bad}
        with pytest.raises(ValueError):
            generate(model, call.pop("prompt"), call.pop("max_new_tokens"), **call)


def test_gpt_params_are_bounded_and_the_width_divides_by_the_heads():
    assert "gpt" in BUILTIN_TASKS and {"mlp", "cnn", "transformer"} <= BUILTIN_TASKS.keys()
    bound = bind_task(TaskRef(name="gpt", params={"layers": 2}))
    assert bound.params.layers == 2 and bound.params.width == 128
    trial = bound.task.rehearsal_params(bound.params)  # the dry run before funding draws a few windows
    assert (trial.windows_per_epoch, trial.eval_windows, trial.layers) == (8, 8, 2)
    for bad in ({"width": 130, "heads": 4}, {"layers": 0}, {"dropout": 1.0}, {"unknown": 1}):
        with pytest.raises(ConfigError, match="bad parameters"):
            bind_task(TaskRef(name="gpt", params=bad))
    with pytest.raises(Exception, match="gpt"):  # the error lists the built-ins, gpt among them
        bind_task(TaskRef(name="nope"))


def test_windows_are_seeded_skip_short_parts_and_check_the_vocabulary():
    data = TokenData((np.arange(5, dtype=np.uint16), np.arange(100, 200, dtype=np.uint16)), 256, 0)
    drawn = draw_windows(data, 300, 9, torch.Generator().manual_seed(3))
    assert torch.equal(drawn, draw_windows(data, 300, 9, torch.Generator().manual_seed(3)))
    assert drawn.shape == (300, 9) and int(drawn.min()) >= 100  # the 5-token part never fits 9 tokens
    assert torch.equal(drawn[:, 1:] - drawn[:, :-1], torch.ones((300, 8), dtype=torch.long))  # contiguous
    assert int(drawn[:, 0].max()) == 191 and int(drawn[:, 0].min()) == 100  # every start reachable
    with pytest.raises(ConfigError, match="context"):
        draw_windows(data, 1, 200, torch.Generator())
    with pytest.raises(DatasetError, match="vocabulary"):
        draw_windows(TokenData((np.arange(300, dtype=np.uint16),), 256, 0), 50, 9, torch.Generator())


def test_the_schedule_warms_up_then_decays_to_its_floor():
    factor = warmup_cosine(warmup_steps=4, horizon=20, min_lr_ratio=0.1)
    assert [factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert factor(4) == 1.0 and factor(20) == pytest.approx(0.1) and factor(50) == pytest.approx(0.1)
    assert all(factor(s) >= factor(s + 1) for s in range(4, 30))


def test_a_few_dozen_steps_on_python_sources_lower_the_test_loss_and_the_state_resumes():
    train, test = byte_tokens("textwrap.py", "shlex.py"), byte_tokens("fnmatch.py")
    bound = bind_task(TaskRef(name="gpt", params=SMALL))
    spec = bound.model_spec(train)
    model = bound.loaded(spec, decode_state(bound.initial_state(train, seed=1)))
    before = evaluate_task(bound.task, model, test, bound.params)
    assert before["perplexity"] == pytest.approx(math.exp(before["loss"]))
    config = JobConfig(batch_size=16, learning_rate=3e-3, epochs=2, rounds=3)
    first = bound.train(model, train, config, seed=2)
    second = bound.train(model, train, config, seed=3, kept_state=first.task_state)
    after = evaluate_task(bound.task, model, test, bound.params)
    assert after["loss"] < before["loss"] - 1.5, (before, after)  # 32 steps: from ~ln(256) to well below
    assert after["bits_per_token"] == pytest.approx(after["loss"] / math.log(2))
    assert second.resumed and not first.resumed
    steps = 2 * 8  # epochs x ceil(128 windows / 16)
    optimizer, scheduler = bound.task.configure_optimizer(model, bound.params, config, steps)
    assert second.task_state is not None and scheduler is not None
    restore_task_state(second.task_state, optimizer, scheduler)
    assert scheduler.last_epoch == 2 * steps  # the schedule continued through round 2, over 3 rounds' horizon
    expected = warmup_cosine(5, 3 * steps, 0.1)(2 * steps) * config.learning_rate
    assert optimizer.param_groups[0]["lr"] == pytest.approx(expected)
    assert optimizer.param_groups[0]["weight_decay"] == 0.1 and optimizer.param_groups[1]["weight_decay"] == 0.0


def test_the_bound_gpt_rehearses_evaluates_and_checks_results_on_token_data():
    train, test = byte_tokens("fnmatch.py"), byte_tokens("glob.py")
    bound = bind_task(TaskRef(name="gpt", params={**SMALL, "windows_per_epoch": 16, "eval_windows": 8}))
    spec = bound.model_spec(train)
    assert spec.num_classes == 256 and tuple(spec.input_shape) == (1,)
    bound.rehearse(train, JobConfig(batch_size=8, learning_rate=1e-3), seed=0)
    state = decode_state(bound.initial_state(train, seed=4))
    assert state.keys() == decode_state(bound.initial_state(train, seed=5)).keys()
    metrics = bound.evaluate(test, state)
    assert {"loss", "perplexity", "bits_per_token"} <= metrics.keys()
    assert bound.validation_loss(spec, state, test) == pytest.approx(metrics["loss"])
    assert isinstance(bound.task, GptTask) and bound.task.keep_state and not bound.task.higher_is_better
    digits = load_dataset("digits")
    with pytest.raises(ConfigError, match="the gpt task trains on a token dataset"):
        bound.initial_state(digits, seed=0)
