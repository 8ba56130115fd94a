"""Verification of a worker's result before it is aggregated or paid (no I/O).

A result passes when its checkpoint was fetched intact by CID (the stores check every
block), it carries the worker's own signature, its tensors are finite and shaped like the
model, it is not a replay of a checkpoint seen before, its loss on a validation batch no
worker ever saw did not get worse beyond a tolerance, and its update norm is within a bound
relative to the round's median. The first four are judged alone (:func:`inspect_result`);
the norm needs the whole round (:func:`judge_norms`).

A rejection is *slashable* only when the worker signed the result (a canonical signature, the
only form the registry takes) and the fault is provable from that signed content alone: wrong
tensor names or shapes, or non-finite values, which anyone can fetch by CID and re-check. A
validation loss, an update norm or a replay depend on data and on the round's other results,
so an honest worker on non-IID data or an uneven shard can trip them: they cost the worker
its pay for the round and its reputation, never its bond.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from ...chain._registry import EvidenceDomain, result_digest, signature_signer
from ...records import FaultPolicy, ModelSpec
from ...data._datasets import LabeledData
from ...tasks._bound_task import BoundTask, bind_task, job_task_ref

State = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Inspection:
    """What one result looked like on arrival; ``problem`` is None when it passed so far."""

    job_id: str
    worker_id: str
    cid: str
    problem: str | None
    slashable: bool = False
    norm: float | None = None
    val_loss: float | None = None
    fetched: bool = True  # False: the checkpoint could not be fetched intact (the worker may re-send it)


def result_signer(domain: EvidenceDomain, key: bytes, round: int, cid: str, signature: str | None) -> str | None:
    """The address that signed (chain, registry, training ``key``, round, cid), or None for a missing,
    malformed or non-canonical signature: the registry would reject it, so it proves nothing."""
    if not signature:
        return None
    try:
        raw = bytes.fromhex(signature.removeprefix("0x"))
    except ValueError:
        return None
    return signature_signer(result_digest(domain, key, round, cid), raw)


def checkpoint_problem(state: State, reference: State) -> str | None:
    """Names, shapes, dtypes and finiteness against the model the worker was sent."""
    if state.keys() != reference.keys():
        return "tensor names differ from the model"
    for key, tensor in state.items():
        if tensor.shape != reference[key].shape or tensor.dtype != reference[key].dtype:
            return f"tensor {key} has shape {tuple(tensor.shape)}/{tensor.dtype}, model has {tuple(reference[key].shape)}"
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            return f"tensor {key} has non-finite values"
    return None


def update_norm(state: State, reference: State) -> float:
    """L2 norm of the update over all floating tensors, accumulated in float64."""
    total = 0.0
    for key, tensor in state.items():
        if tensor.is_floating_point():
            total += float((tensor.double() - reference[key].double()).pow(2).sum())
    return math.sqrt(total)


def validation_loss(spec: ModelSpec, state: State, batch: LabeledData, task: BoundTask | None = None) -> float:
    """The task's mean loss (a built-in's: cross-entropy) of the model with ``state`` on ``batch``."""
    bound = task if task is not None else bind_task(job_task_ref(spec, None))
    return bound.validation_loss(spec, dict(state), batch)


def loss_limit(start_loss: float, policy: FaultPolicy) -> float:
    """The highest validation loss a result may have, given the round's starting model."""
    return max(start_loss * (1.0 + policy.val_loss_tolerance), start_loss + policy.val_loss_margin)


def inspect_result(*, job_id: str, worker_id: str, domain: EvidenceDomain, key: bytes, round: int, cid: str,
                   signature: str | None, state: State, reference: State, seen_before: bool, spec: ModelSpec,
                   validation: LabeledData, start_loss: float, policy: FaultPolicy,
                   task: BoundTask | None = None) -> Inspection:
    """Every check that needs only this result; the norm is kept for :func:`judge_norms`."""
    if result_signer(domain, key, round, cid, signature) != worker_id:
        return Inspection(job_id, worker_id, cid, "result is not signed by the worker (canonically)")

    def reject(problem: str, **extra: float) -> Inspection:
        return Inspection(job_id, worker_id, cid, problem, **extra)

    if seen_before:
        return reject("replay of a checkpoint submitted before")
    if (problem := checkpoint_problem(state, reference)) is not None:
        # Provable from the signed CID's content alone: the one slashable kind of rejection.
        return Inspection(job_id, worker_id, cid, problem, slashable=True)
    norm = update_norm(state, reference)
    loss = validation_loss(spec, state, validation, task)
    limit = loss_limit(start_loss, policy)
    if not math.isfinite(loss) or not loss <= limit:  # a NaN limit fails closed, as a NaN loss does
        return reject(f"validation loss {loss:.4g} above the limit {limit:.4g} "
                      f"(round started at {start_loss:.4g})", norm=norm, val_loss=loss)
    return Inspection(job_id, worker_id, cid, None, norm=norm, val_loss=loss)


def round_median(norms: Sequence[float]) -> float:
    return statistics.median(norms) if norms else 0.0


def norm_problem(norm: float, median_norm: float, policy: FaultPolicy) -> str | None:
    """Reject updates far larger than the round's typical one (a scaled or boosted update)."""
    if not math.isfinite(norm):  # huge finite float64 weights overflow their sum of squares
        return f"update norm {norm:.4g} is not finite"
    if median_norm <= 0.0:
        return None
    if norm > policy.norm_bound * median_norm:
        return f"update norm {norm:.4g} exceeds {policy.norm_bound:g} x the round median {median_norm:.4g}"
    return None


def judge_norms(passed: Mapping[str, Inspection], median_norm: float,
                policy: FaultPolicy) -> dict[str, Inspection]:
    """Re-judge results that passed :func:`inspect_result` against the round's median norm."""
    judged = {}
    for key, found in passed.items():
        assert found.norm is not None
        problem = norm_problem(found.norm, median_norm, policy)
        judged[key] = found if problem is None else Inspection(
            found.job_id, found.worker_id, found.cid, problem, norm=found.norm, val_loss=found.val_loss)
    return judged
