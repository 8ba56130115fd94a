"""Verifiers that lie: hired to re-execute another worker's segment, they answer without doing it honestly.

Each is a ProviderAgent (an honest worker for its own jobs) whose verification step is replaced:

- ``LazyVerifier`` trains nothing and reports the end state the checked worker committed to (it is in the
  request's commitment), so it approves everything; canaries catch it.
- ``HostileVerifier`` re-executes, then moves its end state before it reports it, so it rejects honest
  work (and it moves the agreed state a dispute asks it for); the dispute's one step shows it wrong.
- ``ColludingVerifier`` is lazy for its partner's checks only (``partner``: the partner's address, given
  when the scenario starts it) and honest for everyone else's.

Listed in :data:`VERIFIERS` by scenario name.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path
from typing import Any

from aitbc_agent_sdk.coordinator.checks._market_verification import perturbed_state
from aitbc_agent_sdk.proof._trajectory import boundary_hashes, boundary_name
from aitbc_agent_sdk.provider._node import ProviderAgent
from aitbc_agent_sdk.provider._owners import TrainingOwner
from aitbc_agent_sdk.provider._process import TRAJECTORY_DIR, TrainingProcess
from aitbc_agent_sdk.provider._verifier import Reexecuted
from aitbc_agent_sdk.records import VerifyRequest


def _committed_end(request: VerifyRequest, job_dir: Path) -> Reexecuted:
    """What a verifier that did not train says: the committed end's hashes, over a file it has (any will do:
    the coordinator compares a CPU class's hashes only)."""
    segment = request.segment
    job_dir.joinpath(TRAJECTORY_DIR).mkdir(parents=True, exist_ok=True)
    end = job_dir / TRAJECTORY_DIR / boundary_name(segment + 1)
    end.write_bytes(b"not trained")
    return Reexecuted(end=end, state_hash=request.commitment.state_hashes[segment + 1],
                      model_hash=request.commitment.model_hashes[segment + 1])


class LazyVerifier(ProviderAgent):
    """Approves every segment it is asked to verify, without training it."""

    async def verify_segment(self, process: TrainingProcess, owner: TrainingOwner, request: VerifyRequest,
                             job_dir: Path) -> Reexecuted:
        self.lazy_reports = getattr(self, "lazy_reports", 0) + 1
        return await asyncio.to_thread(_committed_end, request, job_dir)


class HostileVerifier(ProviderAgent):
    """Re-executes honestly, then reports a different end state: it rejects honest work."""

    async def verify_segment(self, process: TrainingProcess, owner: TrainingOwner, request: VerifyRequest,
                             job_dir: Path) -> Reexecuted:
        found = await super().verify_segment(process, owner, request, job_dir)
        if found.end is None:
            return found
        end = found.end

        def moved() -> Reexecuted:
            end.write_bytes(perturbed_state(end.read_bytes(), random.Random(7)))
            model_hash, state_hash = boundary_hashes(end.read_bytes())
            return dataclasses.replace(found, state_hash=state_hash, model_hash=model_hash)  # its trace as traced
        return await asyncio.to_thread(moved)


class ColludingVerifier(ProviderAgent):
    """Lazy for ``partner``'s segments (approving its skipped work), honest for the others'."""

    def __init__(self, *args: Any, partner: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.partner = partner.lower()

    async def verify_segment(self, process: TrainingProcess, owner: TrainingOwner, request: VerifyRequest,
                             job_dir: Path) -> Reexecuted:
        if request.commitment.worker.lower() == self.partner:
            return await asyncio.to_thread(_committed_end, request, job_dir)
        return await super().verify_segment(process, owner, request, job_dir)


# By scenario name: run_chaos.py's verifier rows (lazy-verifier, hostile-verifier, colluding-verifier).
VERIFIERS: dict[str, type[ProviderAgent]] = {
    "lazy-verifier": LazyVerifier,
    "hostile-verifier": HostileVerifier,
    "colluding-verifier": ColludingVerifier,
}
