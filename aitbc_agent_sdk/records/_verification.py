"""Proof of work done: a worker's committed trajectory, the coordinator's spot-check challenge and the
worker's opening of it, and the timed hardware challenge at hiring. All validated and bounded here:
every one of them comes from a stranger."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import Field, model_validator

from ._base import Address, Cid, Finite, Id, Record
from ._jobs import JobAssignment
from ._market import DeviceClass

MAX_SEGMENTS = 1024  # committed segments in one job: 1025 boundary hashes, about 200 KB of metadata
MAX_CHECKED_SEGMENTS = 16  # segments one challenge may ask a worker to open
MAX_TRACE_POINTS = 256  # state hashes one dispute request asks for: a longer segment is narrowed in rounds
MAX_COMMITMENT_BYTES = 1 << 20  # the commitment's JSON inside a checkpoint's safetensors metadata
COMMITMENT_KEY = "trajectory"  # that metadata key
MAX_HARDWARE_PRODUCT = 1 << 22  # entries of a hardware challenge's product: 16 MiB of int32 to store and fetch
MAX_HARDWARE_FLOPS = 1 << 41  # a hardware challenge's multiply-adds, twice: a few ms on a data-centre GPU
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class TrajectoryCommitment(Record):
    """What a worker says it did in one job, inside the checkpoint it signs (so the CID binds it).

    Boundary ``i`` is the training state after ``i * segment_steps`` steps (the last one after
    ``steps``): ``model_hashes[i]`` covers the model's tensors, ``state_hashes[i]`` everything a
    re-execution starts from (model, optimizer, scheduler, RNG). ``batch_hashes[j]`` covers the
    batches of segment ``j``, in order."""

    # 2: every step seeds its own RNG, so any step's state replays alone (1 seeded each segment: an old
    # worker's commitment is refused as malformed, unpaid but never slashed for a replay it cannot match)
    version: Literal[2] = 2
    job_id: Id
    worker: Address
    steps: int = Field(ge=1, le=10**9)
    segment_steps: int = Field(ge=1, le=10**9)
    device: Literal["cpu", "cuda"]
    threads: int = Field(default=1, ge=1, le=1024, description=(
        "torch's intra-op threads in training: a CPU's sums (so its bits) depend on them"))
    model_hashes: tuple[Sha256, ...] = Field(max_length=MAX_SEGMENTS + 1)
    state_hashes: tuple[Sha256, ...] = Field(max_length=MAX_SEGMENTS + 1)
    batch_hashes: tuple[Sha256, ...] = Field(max_length=MAX_SEGMENTS)

    @property
    def segments(self) -> int:
        return math.ceil(self.steps / self.segment_steps)

    def segment_steps_of(self, segment: int) -> tuple[int, int]:
        """Steps [start, end) of ``segment``."""
        start = segment * self.segment_steps
        return start, min(start + self.segment_steps, self.steps)

    @model_validator(mode="after")
    def _consistent(self) -> TrajectoryCommitment:
        n = self.segments
        if n > MAX_SEGMENTS:
            raise ValueError(f"{n} segments, above {MAX_SEGMENTS}")
        if len(self.model_hashes) != n + 1 or len(self.state_hashes) != n + 1 or len(self.batch_hashes) != n:
            raise ValueError(f"{self.steps} steps in segments of {self.segment_steps} need {n + 1} boundary and "
                             f"{n} batch hashes")
        return self


def boundaries_opened(segments: Iterable[int], *, ends: bool) -> list[int]:
    """The boundary states an opening of ``segments`` holds: each one's start, and with ``ends`` its end."""
    return sorted({b for s in segments for b in ((s, s + 1) if ends else (s,))})


class TrajectoryChallenge(Record):
    """The coordinator asks a worker to open segments of a committed trajectory (their start states, and
    with ``ends`` their end states too)."""

    job_id: Id
    training_id: Id
    round: int = Field(ge=1)
    segments: tuple[Annotated[int, Field(ge=0, lt=MAX_SEGMENTS)], ...] = Field(
        min_length=1, max_length=MAX_CHECKED_SEGMENTS)
    deadline_s: Finite = Field(gt=0.0)
    # A replay compared bit for bit on the coordinator needs only its start: its end's hash is committed.
    # A GPT-2 state is a gigabyte, so that halves the upload. Within a tolerance, or on the market, both.
    ends: bool = True

    def boundaries(self) -> list[int]:
        """The boundary states this challenge opens, in order."""
        return boundaries_opened(self.segments, ends=self.ends)

    @model_validator(mode="after")
    def _distinct(self) -> TrajectoryChallenge:
        if len(set(self.segments)) != len(self.segments):
            raise ValueError("segments repeat")
        return self


class BoundaryState(Record):
    """One opened boundary: the state file's CID in the content store."""

    boundary: int = Field(ge=0, le=MAX_SEGMENTS)
    cid: Cid


class TrajectoryOpening(Record):
    """A worker's answer to a challenge: the boundary states around every segment asked for."""

    job_id: Id
    training_id: Id
    worker_id: Address
    round: int = Field(ge=1)
    states: tuple[BoundaryState, ...] = Field(max_length=2 * MAX_CHECKED_SEGMENTS, description=(
        "none: the worker has nothing to open (it answers at once rather than let the check time out)"))


class VerifyRequest(Record):
    """The coordinator hires a verifier (another worker of the training, of the checked worker's device class)
    to train one segment of a committed trajectory again from its opened start state. In a dispute it asks
    the verifier and the checked worker both (``points``, ``stop``): see coordinator/checks/_disputes.py.

    ``job`` is the checked job re-addressed to the verifier: its own contract, and the dataset's key wrapped
    for it. ``commitment`` is the checked worker's, except that boundary ``segment``'s state hash is that of
    ``start_cid`` (a canary's start is a perturbed state: the verifier cannot tell it from a real check)."""

    request_id: Id  # names the answer; unknown to the checked worker until it is sent
    job: JobAssignment
    commitment: TrajectoryCommitment
    segment: int = Field(ge=0, lt=MAX_SEGMENTS)
    start_cid: Cid
    start_bytes: int = Field(ge=1, le=1 << 40, description="the start state's exact size: fetched no further")
    deadline_s: Finite = Field(gt=0.0)
    points: tuple[Annotated[int, Field(ge=1)], ...] = Field(default=(), max_length=MAX_TRACE_POINTS, description=(
        "a dispute's trace: report the state hash after each of these steps into the segment (increasing)"))
    stop: int | None = Field(default=None, ge=1, description=(
        "a dispute's agreed state: train only this many steps of the segment, and report that state as the end"))

    @model_validator(mode="after")
    def _within(self) -> VerifyRequest:
        if self.segment >= self.commitment.segments:
            raise ValueError(f"segment {self.segment} outside the commitment's {self.commitment.segments}")
        first, last = self.commitment.segment_steps_of(self.segment)
        stop = last - first if self.stop is None else self.stop
        if stop > last - first or any(p > stop for p in self.points) or list(self.points) != sorted(set(self.points)):
            raise ValueError(f"points and stop must increase within the segment's {last - first} steps")
        return self


class VerifyReport(Record):
    """A verifier's answer: the state its re-execution of the segment ended in, uploaded (``end_cid``) and
    hashed, and the result digest over ``end_cid`` signed with its key (slashing evidence should it lie).
    ``problem`` instead: it could not re-execute (then nothing else is set)."""

    request_id: Id
    training_id: Id
    verifier_id: Address
    round: int = Field(ge=1)
    segment: int = Field(ge=0, lt=MAX_SEGMENTS)
    end_cid: Cid | None = None
    state_hash: Sha256 | None = None
    model_hash: Sha256 | None = None
    signature: str | None = Field(default=None, pattern=r"^0x[0-9a-fA-F]{130}$")
    problem: str | None = Field(default=None, max_length=256)
    trace: tuple[Sha256, ...] = Field(default=(), max_length=MAX_TRACE_POINTS, description=(
        "the state hashes after the request's ``points``, in order"))

    @model_validator(mode="after")
    def _answered(self) -> VerifyReport:
        ended = (self.end_cid, self.state_hash, self.model_hash, self.signature)
        if (self.problem is None) != all(v is not None for v in ended):
            raise ValueError("a report carries an end state (cid, hashes, signature) or a problem, not both")
        if self.problem is not None and self.trace:
            raise ValueError("a report with a problem carries no trace")
        return self


class HardwareChallenge(Record):
    """At hiring: multiply two matrices the seed defines, on the device the offer claims, within a deadline.
    The answer's CID holds the product; the coordinator checks it cheaply (Freivalds)."""

    nonce: Id  # names the answer's topic level
    seed: int = Field(ge=0, lt=2**63)
    rows: int = Field(ge=1, le=8192)
    inner: int = Field(ge=1, le=1 << 20)
    cols: int = Field(ge=1, le=8192)
    gpu_index: int = Field(default=0, ge=0, lt=64)
    deadline_s: Finite = Field(gt=0.0)


class HardwareAnswer(Record):
    nonce: Id
    provider: Address
    cid: Cid | None = None  # None: the provider declined (no such device)
    reason: str | None = Field(default=None, max_length=256)


# -- how far an honest re-execution lands, measured per device class -------------------------------------

Precision = Literal["fp32", "bf16"]


class ToleranceRow(Record):
    """One measured bound: segments trained on ``device_class`` at ``precision`` and re-executed on
    ``reference`` land at most ``bound`` (relative to the segment's own change) from the committed end.

    ``honest_max`` and ``skipped_min`` are what the measurement saw: the largest distance of an honest
    segment, the smallest of a segment whose work was skipped. The bound lies between them."""

    device_class: DeviceClass
    precision: Precision
    reference: DeviceClass
    bound: Finite = Field(ge=0.0, le=1.0)
    honest_max: Finite = Field(ge=0.0)
    skipped_min: Finite = Field(ge=0.0)
    segments: int = Field(ge=1, le=10**6, description="honest segments the bound was measured on")
    measured: str = Field(max_length=256, description="where and with what (torch version, tasks)")

    @model_validator(mode="after")
    def _between(self) -> ToleranceRow:
        if not self.honest_max <= self.bound < self.skipped_min:
            raise ValueError(f"bound {self.bound:g} is not between the honest {self.honest_max:g} and the "
                             f"skipped {self.skipped_min:g} it was measured on")
        return self


class ToleranceTable(Record):
    """The bounds shipped with the SDK (``proof/tolerances.json``), one row per device class, precision and
    reference device."""

    version: Literal[1] = 1
    rows: tuple[ToleranceRow, ...] = Field(default=(), max_length=1024)

    def bound_for(self, device_class: str, precision: str, reference: str) -> ToleranceRow | None:
        return next((r for r in self.rows if (r.device_class, r.precision, r.reference)
                     == (device_class, precision, reference)), None)
