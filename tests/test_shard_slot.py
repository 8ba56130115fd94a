"""A round's shard slot moves through one phase at a time; any other move is a bug and raises."""

from __future__ import annotations

from itertools import product
from types import SimpleNamespace

import pytest

from aitbc_agent_sdk.coordinator.round._round_slots import ShardSlot, SlotPhase, slot_move
from aitbc_agent_sdk.errors import PhaseError

S = SlotPhase
LEGAL = {(S.WAITING, S.RECEIVED), (S.RECEIVED, S.CHECKING), (S.RECEIVED, S.ACCEPTED), (S.RECEIVED, S.WAITING),
         (S.CHECKING, S.ACCEPTED), (S.CHECKING, S.WAITING), (S.ACCEPTED, S.FOLDED)}


@pytest.mark.parametrize("current,target", list(product(SlotPhase, SlotPhase)))
def test_only_the_listed_moves_are_allowed(current, target):
    if (current, target) in LEGAL:
        assert slot_move(current, target) is target
    else:
        with pytest.raises(PhaseError, match=f"from {current.value} to {target.value}"):
            slot_move(current, target)


def _slot() -> ShardSlot:
    slot = ShardSlot(shard=SimpleNamespace(index=0), contract=SimpleNamespace(worker_id="holder"))
    slot.jobs = {"j1": SimpleNamespace(job_id="j1", worker_id="holder"),
                 "j2": SimpleNamespace(job_id="j2", worker_id="spare")}
    return slot


def test_a_rejected_result_sends_the_shard_back_to_waiting_without_its_job():
    slot = _slot()
    assert slot.waiting and slot.straggling  # a spare's copy runs next to the holder's job
    slot.receive(SimpleNamespace(job_id="j2"), SimpleNamespace(job_id="j2"), took_s=3.0)
    slot.start_check()
    assert slot.reject().job_id == "j2"
    assert slot.waiting and slot.winner is None and list(slot.jobs) == ["j1"] and not slot.straggling
    assert slot.finished_s == 3.0  # it delivered: how long it took is kept


def test_a_slot_is_folded_once_and_only_after_it_is_accepted():
    slot = _slot()
    with pytest.raises(PhaseError):
        slot.mark_folded()
    slot.receive(SimpleNamespace(job_id="j1"), SimpleNamespace(job_id="j1"), took_s=1.0)
    slot.accept()
    assert slot.mark_folded().job_id == "j1" and slot.phase is S.FOLDED
    with pytest.raises(PhaseError):
        slot.mark_folded()
