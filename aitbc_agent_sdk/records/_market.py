"""What the market shows: hardware, offers and the workers hired from them."""

from __future__ import annotations

import re
import time
from typing import Annotated, Literal

from pydantic import Field, model_validator

from .. import limits
from ._base import Address, Finite, Name, Record, Wei
from ._tasks import TaskPolicy


class GpuInfo(Record):
    name: Name
    memory_total_bytes: int = Field(ge=0)
    memory_free_bytes: int | None = Field(default=None, ge=0)
    driver_version: Name | None = None
    cuda_version: Name | None = None
    utilization_percent: float | None = Field(default=None, ge=0, le=100)


class Hardware(Record):
    """What a provider really has, detected on its host."""

    cpu_model: Name
    cpu_cores: int = Field(ge=1)
    ram_bytes: int = Field(ge=0)
    gpus: tuple[GpuInfo, ...] = Field(default=(), max_length=limits.MAX_GPUS)
    disk_free_bytes: int | None = Field(default=None, ge=0, le=1 << 60, description=(
        "free disk in the provider's work directory when it offered: discovery skips jobs that would not fit"))

    @property
    def gpu_type(self) -> str:
        return self.gpus[0].name if self.gpus else "cpu"


class Offer(Record):
    """A provider's signed advertisement on the market."""

    provider: Address
    price_wei: Wei = Field(description="price for one training round")
    hardware: Hardware
    slots: int = Field(default=1, ge=1)
    free_slots: int = Field(default=1, ge=0)
    issued_at: Finite = Field(default_factory=time.time)
    tasks: TaskPolicy = Field(default_factory=TaskPolicy, description="what code it runs: discovery respects it")
    max_unreceipted_rounds: int = Field(default=2, ge=0, le=1000, description=(
        "the provider refuses a contract's jobs once this many of its delivered rounds lack the coordinator's "
        "payment receipt (0: it never stops)"))

    @model_validator(mode="after")
    def _free_within_slots(self) -> Offer:
        if self.free_slots > self.slots:
            raise ValueError("free_slots cannot exceed slots")
        return self

    @property
    def availability(self) -> float:
        return self.free_slots / self.slots


CPU_CLASS = "cpu"
UNCONFIRMED_CLASS = "unconfirmed"  # a GPU offer the hardware challenge did not confirm (flagged or unchecked)
DEVICE_CLASS_PATTERN = re.compile(r"^[\x20-\x7e]{1,128}$")  # one printable ASCII line, as NVML names a GPU
DeviceClass = Annotated[str, Field(pattern=DEVICE_CLASS_PATTERN.pattern)]


class Worker(Record):
    """A discovered provider as the coordinator sees it, seed-style keys included."""

    worker_id: Address
    offer: Offer
    reputation: float = Field(ge=0.0, le=5.0, description="0..5, from observed job history")
    jobs_completed: int = Field(default=0, ge=0)
    jobs_failed: int = Field(default=0, ge=0)
    slashes: int = Field(default=0, ge=0)
    stake_wei: Wei = Field(default=0, description="bond held by the provider registry")
    earned_wei: Wei = Field(default=0, description="ETH paid to it through the escrow: what reputation weighs")
    # The timed challenge at discovery on the GPU the offer claims (market.hardware_check): timing evidence
    # for the score, never grounds for slashing. An offer that claims no GPU is not challenged.
    hardware_check: Literal["passed", "flagged", "unchecked"] = "unchecked"
    hardware_reason: str | None = Field(default=None, max_length=256, description="why it was flagged")

    @property
    def flagged(self) -> bool:
        return self.hardware_check == "flagged"

    @property
    def gpu_type(self) -> str:
        return self.offer.hardware.gpu_type

    @property
    def device_class(self) -> str:
        """What its results are compared within: ``cpu`` for an offer without a GPU, the GPU's model once the
        hardware challenge confirmed it, else :data:`UNCONFIRMED_CLASS` (no measured tolerance applies)."""
        if not self.offer.hardware.gpus:
            return CPU_CLASS
        name = self.gpu_type
        fits = DEVICE_CLASS_PATTERN.fullmatch(name) is not None
        return name if self.hardware_check == "passed" and fits else UNCONFIRMED_CLASS

    @property
    def price(self) -> int:
        return self.offer.price_wei

    @property
    def availability(self) -> float:
        return self.offer.availability


