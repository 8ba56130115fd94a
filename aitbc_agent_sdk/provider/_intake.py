"""Which proposals and jobs a provider takes: its price, its queue bounds and the chain's verdict per contract."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from ..errors import AitbcError
from ..records import ContractProposal, Hardware, JobAssignment, fit_problem
from ._book import ContractKey, contract_key
from ._onchain import ProviderChain

__all__ = ["MAX_JOBS_PER_CONTRACT", "MAX_JOBS_PER_SLOT", "ContractVerdicts", "disk_free", "fit_refusal",
           "job_size_problem", "proposal_refusal", "queue_problem"]

MAX_JOBS_PER_CONTRACT = 4  # queued or running under one contract: one per round, plus a duplicate or two
MAX_JOBS_PER_SLOT = 8  # queued or running in all, per slot; a job beyond either bound is refused at once
NO_CHAIN = "this provider has no chain to check a contract against"


def proposal_refusal(proposal: ContractProposal, *, has_chain: bool, ask_wei: int) -> str | None:
    """Why a proposal is declined on sight, or None: agreeing costs nothing until the chain shows the slot funded."""
    if not has_chain:
        return NO_CHAIN
    if proposal.price_wei < ask_wei:
        return f"price below ask of {ask_wei} wei"
    return None


def disk_free(work_dir: Path) -> int | None:
    """Free bytes where jobs are written (None when the directory cannot be read)."""
    try:
        return shutil.disk_usage(work_dir).free
    except OSError:
        return None


def fit_refusal(proposal: ContractProposal, hardware: Hardware | None, work_dir: Path) -> str | None:
    """Why this machine cannot hold the proposal's model (its declared footprint), or None. A proposal that
    declares none is an older coordinator's: its jobs are held to the legacy weights bound instead."""
    if proposal.footprint is None or hardware is None:
        return None
    return fit_problem(proposal.footprint, proposal.batch_size, hardware, disk_free(work_dir))


def job_size_problem(job: JobAssignment, contract: ContractProposal, hardware: Hardware | None) -> str | None:
    """Why a job's declared size is not what its contract agreed to (or does not fit at the job's batch size)."""
    if job.footprint != contract.footprint:
        return "the job's model footprint is not the one its contract declared"
    if job.footprint is not None and hardware is not None:
        return fit_problem(job.footprint, job.config.batch_size, hardware)
    return None


def queue_problem(contract: ContractKey, active: Iterable[ContractKey], slots: int) -> str | None:
    """Why the queue (the contracts of the ``active`` jobs: queued or running) takes no more jobs of
    ``contract``, or None. Contracts are (coordinator, id): another coordinator's id fills nothing of ours."""
    active = list(active)
    same = sum(1 for a in active if a == contract)
    if same >= MAX_JOBS_PER_CONTRACT:
        return f"queue full: {same} jobs of contract {contract[1]} queued or running"
    if len(active) >= MAX_JOBS_PER_SLOT * slots:
        return f"queue full: {len(active)} jobs queued or running"
    return None


class ContractVerdicts:
    """Why the chain does not back a contract (None: it does), read before its first job and then cached.

    A refusal is cached too, except when the chain could not be read at all. Verdicts are keyed
    by (coordinator, contract id), as the contract table is: a contract id is any coordinator's to
    reuse. ``forget`` drops a contract's verdict (the table calls it when it forgets the contract).
    """

    def __init__(self, chain: ProviderChain | None) -> None:
        self.chain = chain
        self._verdicts: dict[ContractKey, str | None] = {}

    async def problem(self, contract: ContractProposal, provider: str) -> str | None:
        key = contract_key(contract.coordinator, contract.contract_id)
        if key in self._verdicts:
            return self._verdicts[key]
        if self.chain is None:
            return NO_CHAIN
        try:
            problem = await self.chain.check(contract, provider)
        except AitbcError as exc:
            return f"the escrow could not be read: {exc}"
        self._verdicts[key] = problem
        return problem

    def forget(self, key: ContractKey) -> None:
        self._verdicts.pop(key, None)
