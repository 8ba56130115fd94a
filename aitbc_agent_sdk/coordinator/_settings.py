"""The coordinator's own settings, nested in ``AgentConfig`` as ``coordinator``."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..records import MAX_HARDWARE_FLOPS, MAX_HARDWARE_PRODUCT, HardwareChallenge
from ..market._discovery import DEFAULT_MIN_STAKE_WEI


class CoordinatorSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    discovery_timeout_s: float = Field(
        default=2.0, gt=0, le=600, description="how long to collect providers' offers from the market")
    reply_timeout_s: float = Field(
        default=10.0, gt=0, le=600, description="how long a provider has to answer a contract proposal")
    min_stake_wei: int | None = Field(
        default=None, ge=0, description=f"the least bond a provider must hold in the registry to be hired, for "
                                        f"trainings that name none; None: the network's ({DEFAULT_MIN_STAKE_WEI} "
                                        f"wei, 0.01 ETH; an Agent on the embedded network, whose providers are "
                                        f"its own processes, uses 0)")
    gas_reserve_wei: int = Field(
        default=10**16, ge=0, le=10**21,
        description="kept back in the wallet for the escrow's open, release and refund transactions")
    audit_dir: Path | None = Field(
        default=None, description="one hash-chained JSONL audit log per training under here; an Agent"
                                  " defaults it to $AITBC_HOME/trainings, a bare Coordinator keeps none")
    data_dir: Path | None = Field(
        default=None, description="datasets staged for import, and the splits the coordinator reads; an Agent "
                                  "defaults it to $AITBC_HOME/datasets, a bare Coordinator uses a temporary directory")
    task_dir: Path | None = Field(
        default=None, description="user tasks' code, unpacked by CID, imported from here; an Agent defaults it "
                                  "to $AITBC_HOME/tasks, a bare Coordinator uses a temporary directory")
    # The timed hardware challenge (market.hardware_check): 1024 x 262144 x 1024 is 550 GFLOP, milliseconds on
    # a data-centre GPU and several seconds on a small CPU host pretending to be one (a 2-core EPYC: 6-15 s;
    # 137 GFLOP took it 1.5-3 s, about the allowance). The product is 4 MiB; checking it costs ~1 s of CPU.
    hardware_check: bool = Field(
        default=True, description="at discovery, challenge every offer that claims a GPU to multiply two "
                                  "matrices on it in time; a flagged offer ranks below every other")
    hardware_challenge: tuple[int, int, int] = Field(
        default=(1024, 262144, 1024), description="the challenge's rows x inner x cols")
    hardware_allowance_s: float = Field(
        default=2.0, gt=0, le=600, description="added to the compute time at the claimed GPU's speed: the bus "
                                               "round trip and storing the product")
    hardware_grace_s: float = Field(
        default=3.0, ge=0, le=600, description="how long past the deadline an answer is still waited for, to "
                                               "tell a late one from none")
    hardware_fetch_s: float = Field(
        default=10.0, gt=0, le=600, description="how long fetching the answer's product from the store may take")

    @model_validator(mode="after")
    def _challenge_within_bounds(self) -> CoordinatorSettings:
        rows, inner, cols = self.hardware_challenge
        HardwareChallenge(nonce="bounds", seed=0, rows=rows, inner=inner, cols=cols, deadline_s=1.0)  # or raises
        if rows * cols > MAX_HARDWARE_PRODUCT or 2 * rows * inner * cols > MAX_HARDWARE_FLOPS:
            raise ValueError(f"hardware_challenge {rows} x {inner} x {cols} is larger than providers compute "
                             f"(product <= {MAX_HARDWARE_PRODUCT} entries, <= {MAX_HARDWARE_FLOPS} FLOP)")
        return self
