"""A keep_state task's optimizer state stays on the provider between rounds, and goes when the training closes."""

from pathlib import Path

import torch
from torch import nn

from aitbc_agent_sdk import Agent, AgentConfig, TrainingSpec
from aitbc_agent_sdk.errors import TrainingError
from aitbc_agent_sdk.records import JobConfig
from aitbc_agent_sdk.chain._escrow import training_key
from aitbc_agent_sdk.provider._owners import TrainingOwner
from aitbc_agent_sdk.wire._task_state import encode_task_state, restore_task_state

TASK = '''
import torch
from torch import nn
from aitbc_agent_sdk import TrainingTask


class StatefulLinear(TrainingTask):
    name = "stateful-linear"
    keep_state = True

    def build_model(self, info, params):
        n = 1
        for d in info.feature_shape:
            n *= d
        return nn.Sequential(nn.Flatten(), nn.Linear(n, info.num_classes))

    def configure_optimizer(self, model, params, config, total_steps):
        opt = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
'''


def _stepped() -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 10)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    return optimizer, scheduler


def test_optimizer_and_scheduler_state_round_trip_without_pickle() -> None:
    optimizer, scheduler = _stepped()
    fresh = torch.optim.AdamW(nn.Linear(3, 2).parameters(), lr=0.1)
    fresh_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(fresh, 10)
    restore_task_state(encode_task_state(optimizer, scheduler), fresh, fresh_scheduler)
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])
    assert fresh_scheduler.last_epoch == 1 and fresh.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]


def test_a_state_that_does_not_fit_the_task_is_a_clear_error() -> None:
    optimizer, scheduler = _stepped()
    other = torch.optim.AdamW(nn.Linear(5, 5).parameters(), lr=0.1)
    try:
        restore_task_state(encode_task_state(optimizer, scheduler), other, None)
    except TrainingError as exc:
        assert "does not fit" in str(exc)
    else:
        raise AssertionError("a state of another model's shape was loaded")


async def test_workers_resume_their_state_each_round_and_drop_it_once_the_training_closes(tmp_path: Path) -> None:
    (tmp_path / "stateful.py").write_text(TASK)
    async with Agent(AgentConfig(home=tmp_path / "home", providers=2)) as agent:
        task = await agent.coordinator.tasks.add(tmp_path / "stateful.py")
        spec = TrainingSpec(model_type=task.name, task=task, target_workers=2, rounds=3,
                            job=JobConfig(epochs=1, learning_rate=1e-2))
        report = await agent.run_distributed_training(spec)
        accepted = {c.job_id for c in await agent.coordinator.db.checkpoints(report.training_id, "accepted")}
        kept = [c for c in await agent.coordinator.db.checkpoints(report.training_id, None) if c.job_id in accepted]
        by_round = {r: sorted(c.task_state for c in kept if c.round == r) for r in (1, 2, 3)}
        # The coordinator knows which results started fresh: every worker's first round only.
        assert by_round == {1: ["fresh", "fresh"], 2: ["resumed", "resumed"], 3: ["resumed", "resumed"]}, by_round
        owner = training_key(agent.coordinator.address, report.training_id).hex()  # the training's on-chain key
        states = [p.config.work_dir / "task-state" / owner for p in agent.stack.providers]
        assert sum(any(d.rglob("*.safetensors")) for d in states if d.exists()) == 2
        # Each provider pinned its results (three rounds each) for the training, and they are pinned now.
        store = agent.stack.store
        pinned = [provider.pins.pinned(TrainingOwner(agent.coordinator.address, report.training_id))
                  for provider in agent.stack.providers]
        assert all(len(cids) >= 3 for cids in pinned), pinned
        assert set().union(*pinned) <= set(await store.pins())
        for provider in agent.stack.providers:  # what each provider's offer refresh runs
            assert provider.chain is not None
            await provider._sweep()
        assert not any(d.exists() for d in states)  # the escrow is settled: the state is gone
        assert not set().union(*pinned) & set(await store.pins())  # and so are the providers' pins
