"""What a training reports: rounds, payments, settlements and the final report."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import Field

from .. import limits
from ._base import Address, Cid, Finite, Fraction, Id, Record, Wei
from ._training import TrainingPhase


class AggregateResult(Record):
    model_id: Cid
    model: bytes = Field(repr=False, description="the averaged weights as safetensors bytes")
    round: int = Field(ge=0)
    samples: int = Field(ge=0)
    loss: float | None
    contributors: tuple[Address, ...] = Field(max_length=limits.MAX_WORKERS)


class RoundMetrics(Record):
    round: int = Field(ge=1)
    accuracy: Fraction | None = Field(description="test accuracy; None when the task reports none (a regression)")
    loss: float
    model_cid: Cid
    workers: int = Field(ge=1)
    throughput: float | None = Field(default=None, ge=0.0, description="samples trained per second of round time")
    round_seconds: float | None = Field(default=None, ge=0.0)
    metrics: dict[Annotated[str, Field(max_length=64)], Finite] = Field(
        default_factory=dict, max_length=32, description="every metric the task's evaluate() returned")
    bytes_sent: int | None = Field(default=None, ge=0, description="model bytes the coordinator sent the round's jobs")
    bytes_received: int | None = Field(default=None, ge=0, description="result bytes it fetched from workers")


def reported_accuracy(round_: RoundMetrics) -> float | None:
    """The round's test accuracy where the task reported one: None for a regression or a language model
    (their metric is in ``metrics``). Rounds saved before tasks reported metrics were all classifiers."""
    return round_.accuracy if "accuracy" in round_.metrics or not round_.metrics else None  # old rows held 0.0


class Payment(Record):
    training_id: Id
    worker_id: Address
    contract_id: Id
    amount_wei: Wei
    tx_hash: str
    result_hash: str


class EscrowSummary(Record):
    address: Address
    deposited_wei: Wei
    paid_wei: Wei
    refunded_wei: Wei
    held_wei: Wei = Field(default=0, description="still in the escrow: all that is unpaid while open, what "
                                                   "payment receipts can claim once refunded")
    held_until: int | None = Field(default=None, ge=0, description="unix time until which receipts can claim "
                                                                   "held_wei after the refund (None while open)")


class TrainingStatus(Record):
    training_id: Id
    phase: TrainingPhase
    round: int = Field(ge=0, description="rounds completed")
    rounds: int = Field(ge=1)
    workers: int = Field(ge=0)
    accuracy: float | None = None
    model_cid: Cid | None = None


class Settlement(Record):
    training_id: Id
    payments: tuple[Payment, ...] = Field(max_length=limits.MAX_WORKERS)
    refund_wei: Wei
    refund_tx: str | None
    escrow: EscrowSummary


class WorkerReport(Record):
    address: Address
    samples: int = Field(ge=0)
    rounds_accepted: int = Field(ge=0)
    paid_wei: Wei
    tx_hash: str | None
    status: Literal["paid", "unpaid"]
    price_wei: Wei
    gpu_type: str
    role: Literal["worker", "spare", "replaced", "released"] = "worker"


class RoundReport(Record):
    round: int = Field(ge=1)
    accuracy: Fraction | None = Field(description="test accuracy; None when the task reports no accuracy (a regression)")
    loss: float
    model_cid: Cid
    worker_losses: dict[str, float]
    workers: int | None = None
    throughput: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict, description="every metric the task's evaluate() returned")
    bytes_sent: int | None = None
    bytes_received: int | None = None


class VerificationSpend(Record):
    """What checking the workers' results cost a training: the coordinator's own seconds (re-executing, or
    with verifiers on the market only a dispute's step and the refereed segments), set against the training
    time of the jobs it checked, and the verifiers' work apart."""

    checks: int = Field(ge=0)
    failed: int = Field(ge=0, description="checks that did not pass (rejected, unverifiable or not opened)")
    coordinator_seconds: Finite = Field(ge=0.0, description="re-executing on the coordinator")
    checked_training_seconds: Finite = Field(ge=0.0, description="the checked jobs' own training, as reported")
    verifier_wei: Wei = Field(default=0, description=(
        "paid to verifiers per check through the escrow, apart from the workers' pay for their own jobs"))
    on_market: int = Field(default=0, ge=0, description="checks whose segments verifiers re-executed")
    verifier_reports: int = Field(default=0, ge=0, description=(
        "reports verifiers and disputed workers sent: checks, canaries and a dispute's traces"))

    @property
    def ratio(self) -> float | None:
        """Coordinator seconds per second of checked training; None before any was measured."""
        if self.checked_training_seconds <= 0:
            return None
        return self.coordinator_seconds / self.checked_training_seconds

    @classmethod
    def of_checks(cls, checks: Sequence[Mapping[str, Any]], training_seconds: Mapping[str, float],
                  fees: Sequence[Mapping[str, Any]] = ()) -> VerificationSpend | None:
        """A training's spot checks as its audit log has them (``spot_check`` fields), against the training
        time of the jobs they checked (``job id -> seconds``), and the verification fees paid (its
        ``verifiers_paid`` fields); None when no check ran."""
        if not checks:
            return None
        checked = {str(c.get("job_id")) for c in checks}
        return cls(checks=len(checks), failed=sum(1 for c in checks if not c.get("passed")),
                   coordinator_seconds=sum(max(float(c.get("seconds") or 0.0), 0.0) for c in checks),
                   checked_training_seconds=sum(training_seconds.get(j, 0.0) for j in checked),
                   verifier_wei=sum(_count(f.get("amount_wei")) for f in fees),
                   on_market=sum(1 for c in checks if c.get("verified_on") == "market"),
                   verifier_reports=sum(_count(c.get("verifiers")) for c in checks))


class RoundSpend(Record):
    round: int = Field(ge=0)
    wei: Wei = Field(description="what the round's payment receipts committed, over every worker")


class TrainingCost(Record):
    """What a training has cost so far and will cost. Workers are paid on chain when it settles, but each
    accepted round is committed before that by a signed payment receipt (a worker's cumulative amount, the
    audit log's ``receipt_sent``); so the spend so far is, per worker, the larger of what its receipts commit
    and what it was paid: during a run the receipts, after settlement the payments."""

    spent_wei: Wei
    paid_wei: Wei = Field(description="paid on chain so far")
    deposit_wei: Wei | None = Field(default=None, description="None: no escrow funded yet")
    deposit_left_wei: int | None = Field(default=None, description="the deposit less the spend")
    rounds_done: int = Field(ge=0)
    rounds: int = Field(ge=1)
    per_round_wei: tuple[RoundSpend, ...] = Field(default=(), max_length=limits.MAX_ROUNDS)
    per_worker_wei: dict[str, Wei] = Field(default_factory=dict)
    mean_round_wei: Wei | None = Field(default=None, description="spent / rounds done; None before the first")
    projected_wei: Wei | None = Field(default=None, description=(
        "spent when finished, else spent / rounds done x rounds; None before the first round"))

    @classmethod
    def of(cls, *, rounds_done: int, rounds: int, finished: bool, deposit_wei: int | None,
           payments: Sequence[tuple[str, int]], receipts: Sequence[Mapping[str, Any]]) -> TrainingCost:
        """From the payments ``(worker, wei)`` and the ``receipt_sent`` fields of the audit log (``worker``,
        ``round``, ``cumulative_wei``; malformed ones are left out)."""
        paid: dict[str, int] = {}
        for worker, amount in payments:
            paid[worker] = paid.get(worker, 0) + amount
        by_worker: dict[str, list[tuple[int, int]]] = {}
        for r in receipts:
            round_ = r.get("round")
            if isinstance(round_, int) and not isinstance(round_, bool) and round_ >= 0:
                by_worker.setdefault(str(r.get("worker")), []).append((round_, _count(r.get("cumulative_wei"))))
        per_round: dict[int, int] = {}
        committed: dict[str, int] = {}
        for worker, own in by_worker.items():
            before = 0
            for round_, cumulative in sorted(own):
                # A repeated receipt (a resend) commits nothing new: cumulative amounts never go down.
                per_round[round_] = per_round.get(round_, 0) + max(cumulative - before, 0)
                before = max(before, cumulative)
            committed[worker] = before
        per_worker = {w: max(paid.get(w, 0), committed.get(w, 0)) for w in sorted(paid.keys() | committed.keys())}
        spent = sum(per_worker.values())
        done = rounds_done > 0
        projected = spent if finished else (spent * rounds // rounds_done if done else None)
        return cls(spent_wei=spent, paid_wei=sum(paid.values()), deposit_wei=deposit_wei,
                   deposit_left_wei=None if deposit_wei is None else deposit_wei - spent,
                   rounds_done=rounds_done, rounds=rounds,
                   per_round_wei=tuple(RoundSpend(round=r, wei=w) for r, w in sorted(per_round.items())),
                   per_worker_wei=per_worker, mean_round_wei=spent // rounds_done if done else None,
                   projected_wei=projected)


def _count(value: Any) -> int:
    """A count from an audit log field: a non-negative int, or 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class TrainingReport(Record):
    training_id: Id
    status: TrainingPhase
    final_accuracy: Fraction | None = Field(description="None when the task reports no accuracy: see final_metric")
    model_cid: Cid
    manifest_cid: Cid
    rounds: tuple[RoundReport, ...] = Field(max_length=limits.MAX_ROUNDS)
    workers: tuple[WorkerReport, ...] = Field(max_length=limits.MAX_WORKERS)
    escrow: EscrowSummary
    refund_tx: str | None
    wall_seconds: float
    compute_seconds: float = Field(description="sum over rounds of the slowest worker's training time")
    metric: str = Field(default="accuracy", max_length=64, description="the task's metric: which model is better")
    final_metric: float | None = Field(default=None, description="the task's metric after the last round")
    higher_is_better: bool = True
    loss_name: str = Field(default="cross-entropy", max_length=64, description="what the task's loss computes")
    verification: VerificationSpend | None = Field(default=None, description="None: no spot check ran")
    cost: TrainingCost | None = Field(default=None, description=(
        "spend per round and worker against the deposit, as monitor and the dashboard show it"))


class ChainIntent(Record):
    """A chain write the coordinator is about to make, saved before it is sent.

    A crash between the transaction and the database writes that follow it leaves the intent
    ``pending``; on resume it is settled from the chain's events (done, or failed when the
    transaction never landed), so the database again says what the escrow says.
    """

    intent_id: str
    training_id: str
    kind: Literal["replace"]
    status: Literal["pending", "done", "failed"] = "pending"
    old_contract_id: str
    new_contract_id: str
    reason: str = ""
    created_at: float = Field(default_factory=time.time)
