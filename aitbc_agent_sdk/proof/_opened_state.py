"""Could the task's own model, optimizer and scheduler be in this opened boundary state? Pure, no I/O.

A worker's boundary file hashes to its commitment, but every number in it is the worker's. Adam
with betas (1.0, 0.999) divides by zero, a StepLR whose step_size is 0 too, NaN moments poison the
replay. So before a spot check replays anything, an opened state must have:

* the model's tensors: names, dtypes, shapes, finite values (or the task's own infinities);
* optimizer state for the task's parameters only: moments of their parameter's shape and dtype,
  finite (second moments non-negative), step counts whole and within ``MAX_STEP_COUNT``;
* the task's param groups: a hyper-parameter that a scheduler may move lies in the range torch's
  own constructors enforce (and finite, bounded); every other field equals the task's own;
* the task's scheduler: equal to a freshly built one except for its position (``last_epoch`` and
  the like), which is bounded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

MAX_STEP_COUNT = 1 << 31  # optimizer and scheduler steps: far above any job's, resumed over every round
MAX_LEARNING_RATE = 1e3  # a job's learning rate is at most 10; schedulers may peak above it
MAX_HYPERPARAMETER = 1e6  # decays, accumulators' starts: bounded, so nothing overflows on the way
MAX_STATE_SCALAR = 1e12  # other scalar optimizer state (NAdam's mu_product, ASGD's eta and mu)

# Hyper-parameters by name, as torch's optimizers call them: (low, high, low inclusive, high inclusive).
_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "lr": (0.0, MAX_LEARNING_RATE, True, True),
    "betas": (0.0, 1.0, True, False),
    "momentum": (0.0, 1.0, True, False),
    "eps": (0.0, 1.0, False, True),
    "weight_decay": (0.0, MAX_HYPERPARAMETER, True, True),
    "dampening": (0.0, 1.0, True, True),
    "alpha": (0.0, 1.0, True, True),
    "rho": (0.0, 1.0, True, True),
    "lr_decay": (0.0, MAX_HYPERPARAMETER, True, True),
    "initial_accumulator_value": (0.0, MAX_HYPERPARAMETER, True, True),
    "momentum_decay": (0.0, MAX_HYPERPARAMETER, True, True),
    "lambd": (0.0, MAX_HYPERPARAMETER, True, True),
}
_STEP_NAMES = frozenset({"step", "n_iter", "func_evals"})
_SCALAR_STATE = _STEP_NAMES | {"mu_product", "eta", "mu"}  # the state torch keeps as 0-dim tensors
_NON_NEGATIVE_STATE = frozenset({"exp_avg_sq", "max_exp_avg_sq", "square_avg", "sum", "acc_delta", "exp_inf"})
# A scheduler's position; every other field of its state is the task's configuration.
_SCHEDULER_POSITION = frozenset({"last_epoch", "_step_count", "_last_lr", "_is_initial",
                                 "_get_lr_called_within_step"})


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: Any) -> float | None:
    """``value`` as a finite float; None for anything else (JSON's NaN, Infinity and 400-digit integers)."""
    if not _is_number(value):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _outside(value: Any, low: float, high: float, low_in: bool = True, high_in: bool = True) -> bool:
    value = _finite(value)
    if value is None:
        return True
    above_low = value >= low if low_in else value > low
    below_high = value <= high if high_in else value < high
    return not (above_low and below_high)


def _whole_outside(value: Any, low: float, high: float) -> bool:
    return _outside(value, low, high) or value != int(value)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 64 else text[:61] + "..."


def _differs(fresh: Any, saved: Any, where: str, position: frozenset[str] = frozenset()) -> str | None:
    """``saved`` must equal ``fresh`` leaf for leaf (numbers compared as numbers), except for fields named
    in ``position`` (a scheduler's position), which must only be bounded."""
    if isinstance(fresh, Mapping):
        if not isinstance(saved, Mapping) or set(saved) != {str(k) for k in fresh}:
            return f"{where} has other fields than the task's"
        for key, own in fresh.items():
            value = saved[str(key)]
            problem = (_position_problem(str(key), value, own, where) if key in position
                       else _differs(own, value, f"{where}.{key}", position))
            if problem is not None:
                return problem
        return None
    if isinstance(fresh, (list, tuple)):
        if not isinstance(saved, list) or len(saved) != len(fresh):
            return f"{where} is not the task's"
        return next((p for i, (own, value) in enumerate(zip(fresh, saved))
                     if (p := _differs(own, value, f"{where}[{i}]", position))), None)
    if _is_number(fresh) and _is_number(saved) and _finite(saved) == _finite(fresh) is not None:
        return None
    if _is_number(fresh) and _finite(fresh) is None and _is_number(saved) and fresh == saved:
        return None  # the task's own infinity (ReduceLROnPlateau's best), kept as it was
    if not _is_number(fresh) and type(fresh) is type(saved) and fresh == saved:
        return None
    return f"{where} is {_shown(saved)}, the task's is {_shown(fresh)}"


def model_problem(tensors: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor]) -> str | None:
    """The model's tensors: the same names, dtypes and shapes as the task's model, floats finite."""
    if set(own) != set(tensors):
        return (f"model keys differ: extra {[k[:64] for k in sorted(set(tensors) - set(own))[:5]]}, "
                f"missing {sorted(set(own) - set(tensors))[:5]}")
    for key, tensor in tensors.items():
        if tensor.dtype != own[key].dtype or tensor.shape != own[key].shape:
            return f"{key} is {tensor.dtype}{tuple(tensor.shape)}, the model's {own[key].dtype}{tuple(own[key].shape)}"
        if tensor.is_floating_point() and not _finite_as_the_tasks(tensor, own[key]):
            return f"model tensor {key} has non-finite values"
    return None


def _finite_as_the_tasks(tensor: torch.Tensor, own: torch.Tensor) -> bool:
    """Finite, except where the task's own tensor holds the same infinity (a buffer such as a -inf mask)."""
    odd = ~torch.isfinite(tensor)
    if not bool(odd.any()):
        return True
    return torch.equal(odd, ~torch.isfinite(own)) and torch.equal(tensor[odd], own[odd])


def _hyperparameter_problem(name: str, value: Any, where: str) -> str | None:
    low, high, low_in, high_in = _RANGES[name]
    values = value if isinstance(value, list) else [value]
    for v in values:
        if _outside(v, low, high, low_in, high_in):
            bounds = f"{'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"
            return f"{where}.{name} is {_shown(value)}, outside {bounds}"
    return None


def _same_kind(own: Any, value: Any) -> bool:
    """Both numbers, or both lists of as many numbers (betas)."""
    if isinstance(own, (list, tuple)):
        return (isinstance(value, list) and len(value) == len(own)
                and all(_is_number(v) for v in (*own, *value)))
    return _is_number(own) and _is_number(value)


def param_groups_problem(saved: Any, fresh: Sequence[Mapping[str, Any]]) -> str | None:
    """The optimizer's param groups: known hyper-parameters within their ranges, the rest the task's own."""
    if not isinstance(saved, list) or len(saved) != len(fresh):
        return "the optimizer's param groups are not this task's"
    for index, (group, own) in enumerate(zip(saved, fresh)):
        where = f"param group {index}"
        if not isinstance(group, dict) or set(group) != set(own):
            return f"{where} has other fields than the task's"
        for name, value in group.items():
            if name in _RANGES and _same_kind(own[name], value):
                problem = _hyperparameter_problem(name, value, where)
            else:
                problem = _differs(own[name], value, f"{where}.{name}")
            if problem is not None:
                return problem
    return None


def _state_tensor_problem(key: str, name: str, tensor: torch.Tensor, param: torch.Tensor) -> str | None:
    key = key[:64]
    if not (tensor.is_floating_point() or tensor.dtype in (torch.int32, torch.int64)):
        return f"optimizer state {key} is {tensor.dtype}"
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        return f"optimizer state {key} has non-finite values"
    if tensor.ndim == 0 and param.ndim != 0 and name in _SCALAR_STATE:  # Adam's step, NAdam's mu_product
        value = float(tensor)
        if name in _STEP_NAMES:
            return f"optimizer state {key} is {value!r}, not a step count" if _whole_outside(
                value, 0, MAX_STEP_COUNT) else None
        return f"optimizer state {key} is {value!r}, above {MAX_STATE_SCALAR:g}" if _outside(
            value, -MAX_STATE_SCALAR, MAX_STATE_SCALAR) else None
    if tensor.shape != param.shape or tensor.dtype != param.dtype:
        return (f"optimizer state {key} is {tensor.dtype}{tuple(tensor.shape)}, its parameter "
                f"{param.dtype}{tuple(param.shape)}")
    if name in _NON_NEGATIVE_STATE and bool((tensor < 0).any()):
        return f"optimizer state {key} has negative values"
    return None


def optimizer_state_problem(tensors: Mapping[str, torch.Tensor], scalars: Any,
                            params: Sequence[torch.Tensor]) -> str | None:
    """Per-parameter state (``index.name`` tensors, ``{index: {name: number}}`` scalars) of the task's
    parameters: moments of their shapes and dtypes, finite; step counts whole and bounded."""
    def parameter(index: str) -> torch.Tensor | None:
        return params[int(index)] if index.isascii() and index.isdigit() and int(index) < len(params) else None

    for key, tensor in tensors.items():
        index, _, name = key.partition(".")
        if (param := parameter(index)) is None or not name:
            return f"optimizer state {key[:64]!r} is for no parameter of {len(params)}"
        if (problem := _state_tensor_problem(key, name, tensor, param)) is not None:
            return problem
    if not isinstance(scalars, dict):
        return "optimizer scalars are not a map"
    for index, values in scalars.items():
        if parameter(index) is None:
            return f"optimizer state for parameter {index[:64]!r} of {len(params)}"
        if not isinstance(values, dict) or not all(_is_number(v) for v in values.values()):
            return f"optimizer scalars of {_shown(index)} are not numbers"
        for name, value in values.items():
            bad = _whole_outside(value, 0, MAX_STEP_COUNT) if name in _STEP_NAMES else _outside(
                value, -MAX_STATE_SCALAR, MAX_STATE_SCALAR)
            if bad:
                return f"optimizer scalar {index}.{name[:64]} is {_shown(value)}, out of bounds"
    return None


def _position_problem(name: str, value: Any, own: Any, where: str) -> str | None:
    """A field of a scheduler's position: a bounded whole count, learning rates, or a flag."""
    if isinstance(own, bool):
        bad = not isinstance(value, bool)
    elif name == "last_epoch":
        bad = _whole_outside(value, -1, MAX_STEP_COUNT)
    elif name == "_step_count":
        bad = _whole_outside(value, 0, MAX_STEP_COUNT + 1)
    elif isinstance(own, (list, tuple)):
        bad = not isinstance(value, list) or len(value) != len(own) or any(
            _outside(v, 0.0, MAX_LEARNING_RATE) for v in value)
    else:
        bad = _outside(value, -MAX_STATE_SCALAR, MAX_STATE_SCALAR)
    return f"{where}.{name} is {_shown(value)}" if bad else None


def scheduler_problem(saved: Any, fresh: Any) -> str | None:
    """The scheduler's state: the task's fresh one's, except for its bounded position (nested schedulers,
    as SequentialLR keeps them, likewise)."""
    return _differs(fresh, saved, "scheduler", _SCHEDULER_POSITION)
