"""Outer optimizers: FedAvg keeps the aggregate, DiLoCo's Nesterov step matches torch's SGD."""

from __future__ import annotations

import pytest
import torch

from aitbc_agent_sdk.errors import TrainingError
from aitbc_agent_sdk.aggregate._outer import FedAvgOuter, NesterovOuter, outer_for


def state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(4, 5, generator=g), "b": torch.randn(5, generator=g), "n": torch.tensor(seed)}


def test_fedavg_outer_is_the_aggregate() -> None:
    outer = outer_for("fedavg", 0.7, 0.9)
    assert isinstance(outer, FedAvgOuter) and outer.state_bytes() is None
    aggregate = state(1)
    new = outer.step(state(0), aggregate)
    assert all(torch.equal(new[k], aggregate[k]) for k in aggregate)


def test_nesterov_matches_torch_sgd_and_survives_a_restart() -> None:
    lr, momentum = 0.7, 0.9
    global_state = state(0)
    params = {k: torch.nn.Parameter(v.clone()) for k, v in global_state.items() if v.is_floating_point()}
    sgd = torch.optim.SGD(params.values(), lr=lr, momentum=momentum, nesterov=True)
    outer = outer_for("diloco", lr, momentum)
    assert isinstance(outer, NesterovOuter) and outer.state_bytes() is None
    for step in range(5):
        aggregate = {k: (v - 0.1 * torch.randn(v.shape) if v.is_floating_point() else v + 1)
                     for k, v in global_state.items()}
        for k, p in params.items():
            p.grad = global_state[k] - aggregate[k]
        sgd.step()
        global_state = outer.step(global_state, aggregate)
        assert global_state["n"].item() == step + 1
        for k, p in params.items():
            assert torch.allclose(global_state[k], p.detach(), atol=1e-5), (step, k)
        if step == 2:  # a coordinator restart: the momentum comes back from bytes
            restored = NesterovOuter(lr, momentum)
            restored.load_state(outer.state_bytes(), global_state)
            outer = restored


def test_momentum_that_does_not_fit_is_refused() -> None:
    outer = NesterovOuter()
    outer.step(state(0), state(1))
    blob = outer.state_bytes()
    other = {"w": torch.zeros(5, 4), "b": torch.zeros(5), "n": torch.tensor(0)}
    with pytest.raises(TrainingError, match="'w'"):
        NesterovOuter().load_state(blob, other)
    with pytest.raises(TrainingError, match="keys"):
        NesterovOuter().load_state(blob, {"w": torch.zeros(4, 5)})
    with pytest.raises(TrainingError, match="unknown"):
        outer_for("adam", 0.7, 0.9)  # type: ignore[arg-type]
